"""Which module of a tree a training step really calls: the root to profile.

A trainer's module is not always the model whose forward runs. A ``LightningModule``'s
``training_step`` often calls ``self.model(x)`` and never its own ``forward``; profiled as the root,
its forward hooks never fire, so memprof never sees the forward begin (feature maps read as
``other``, the whole step as one phase). :class:`ForwardProbe` watches one real step with light hooks
and :func:`choose_root` picks the module whose forward covers it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import nn
from torch.utils.hooks import RemovableHandle

__all__ = ["ForwardProbe", "RootChoice", "choose_root"]


class ForwardProbe:
    """Notes the outermost module calls made inside a tree (calls from no other module of the tree).

    Args:
        root: the tree to watch (e.g. a ``LightningModule``).

    Attributes:
        outermost: qualified names (``""``: the root) of the modules called from outside any other
            module of the tree, in first-call order, each once.
    """

    def __init__(self, root: nn.Module) -> None:
        self.outermost: list[str] = []
        self._depth = 0
        self._handles: list[RemovableHandle] = []
        for name, module in root.named_modules():
            self._handles.append(module.register_forward_pre_hook(self._enter(name)))
            # always_call: a forward that raises still leaves the depth right
            self._handles.append(module.register_forward_hook(self._exit, always_call=True))

    def _enter(self, name: str) -> Any:
        def pre(module: nn.Module, args: Any) -> None:
            if self._depth == 0 and name not in self.outermost:
                self.outermost.append(name)
            self._depth += 1
        return pre

    def _exit(self, module: nn.Module, args: Any, output: Any) -> None:
        self._depth = max(self._depth - 1, 0)

    def remove(self) -> None:
        """Removes the probe's hooks (idempotent)."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()


@dataclass(frozen=True)
class RootChoice:
    """The module to profile and why.

    Attributes:
        name: its qualified name in the tree (``""``: the tree's root itself).
        module: the module.
        reason: one sentence for the run's meta and the user.
        certain: ``False`` when no single module's forward covers the step (the root is a fallback).
    """

    name: str
    module: nn.Module
    reason: str
    certain: bool


def choose_root(root: nn.Module, outermost: list[str]) -> RootChoice:
    """The module whose forward covers the step, from what a :class:`ForwardProbe` saw.

    Args:
        root: the probed tree.
        outermost: :attr:`ForwardProbe.outermost` after one step.

    Returns:
        The root when its own forward ran (or nothing ran); the one submodule called when only one
        was; else the root again, marked uncertain (several submodules are called side by side).
    """
    kind = type(root).__name__
    if "" in outermost:
        return RootChoice("", root, f"{kind}'s own forward runs in the training step", True)
    if len(outermost) == 1:
        name = outermost[0]
        return RootChoice(name, root.get_submodule(name),
                          f"the training step calls {kind}.{name} and not {kind}'s own forward", True)
    if not outermost:
        return RootChoice("", root, f"no module of {kind} was called in the probed training step", False)
    called = ", ".join(f"{kind}.{name}" for name in outermost)
    return RootChoice("", root, f"the training step calls {called} side by side and not {kind}'s own forward",
                      False)
