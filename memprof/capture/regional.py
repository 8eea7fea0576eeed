"""Per-block costs of a ``torch.compile``'d model as it runs compiled: regional costing iterations.

A compiled graph runs no module hooks, so a compiled step has totals and categories but no layers. Running a
few iterations eagerly instead (``set_stance("force_eager")``, :mod:`memprof.capture.eager_pass`) gives layers,
but an eager block keeps what eager autograd saves, not what compile's partitioner keeps after fusion and its
own recomputation of cheap ops (on a 6-layer GPT-2, 28.0 MiB per block against 17.0 MiB), so a plan from them
describes a model that does not run.

In its costing iterations the profiler therefore runs the model compiled, as the user compiled it, with each
repeated block (the children of a ``ModuleList`` or ``Sequential`` of two or more modules of one class: the
blocks regional compilation compiles, and the chain the planner finds) as its own compiled region between
graph breaks. Around each region the block's forward and backward are marked, as its hooks would (hooks inside
a compiled graph do nothing); inside it nothing is hooked. This is how a schedule's stages run under
``torch.compile`` (``planner.executor.install.compiled_forwards``), so the chain is costed as it will run.

A model compiled region by region by its user (``block.compile()`` on each block, PyTorch's regional compilation)
runs each block's hooks inside its compiled region, where they do nothing. While profiled, each such block runs
its ``forward`` compiled instead, its hooks outside (:class:`CompiledRegions`): every iteration then has the
blocks' compiled costs, with no costing iteration.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from torch import nn

__all__ = ["CompiledRegions", "RegionalBlocks", "compile_settings", "repeated_blocks"]

Hook = Callable[..., None]


def repeated_blocks(names: Sequence[str], modules: Sequence[nn.Module]) -> list[int]:
    """The indices of the outermost repeated blocks: children of a ``ModuleList`` or ``Sequential`` holding two or
    more modules of one class and parameter shapes (a block inside another block is not one; ``Linear(8, 16)``
    beside ``Linear(16, 4)`` are not repeated)."""
    index_of = {id(m): i for i, m in enumerate(modules)}
    found: list[int] = []
    inside: set[str] = set()
    for name, module in zip(names, modules):
        if any(name.startswith(f"{block}.") for block in inside) or not isinstance(module, (nn.ModuleList,
                                                                                             nn.Sequential)):
            continue
        kinds = [_kind(c) for c in module.children()]
        for child_name, child in module.named_children():
            if kinds.count(_kind(child)) >= 2 and id(child) in index_of:
                found.append(index_of[id(child)])
                inside.add(f"{name}.{child_name}" if name else child_name)
    return sorted(set(found))


def compile_settings(wrapper: nn.Module) -> tuple[Any, bool]:
    """The backend a ``torch.compile``'d model was compiled with (its mode and options included: inductor's is an
    object that holds them), and whether with ``fullgraph=True``; ``("inductor", False)`` where torch keeps them
    elsewhere."""
    context = getattr(wrapper, "dynamo_ctx", None)
    backend: Any = getattr(context, "callback", None)
    while hasattr(backend, "_torchdynamo_orig_backend"):
        backend = backend._torchdynamo_orig_backend
    return (backend if callable(backend) else "inductor"), bool(getattr(context, "fullgraph", False))


def _codes_seen() -> set[int]:
    """The ids of the code objects dynamo has met (tried to compile) so far."""
    from torch._dynamo import convert_frame

    return set(convert_frame.input_codes.seen_ids)


def _forget_codes(before: set[int]) -> None:
    """Resets dynamo's state (compiled code, and a decision to run the frame eagerly) of every code object it met
    since ``before`` was taken, so that it meets them afresh on their next call."""
    from torch._C._dynamo import eval_frame
    from torch._dynamo import convert_frame

    for ref in list(convert_frame.input_codes.seen):
        code = ref()
        if code is not None and id(code) not in before:
            eval_frame.reset_code(code)


def _kind(module: nn.Module) -> tuple[type, tuple[tuple[int, ...], ...]]:
    return type(module), tuple(tuple(p.shape) for p in module.parameters())


class RegionalBlocks:
    """Each repeated block compiled on its own and marked around, installed for chosen iterations.

    Args:
        modules: the profiled modules, root first, as the hook recorder numbers them.
        blocks: the indices (into ``modules``) of the blocks to compile regionally.
        before: the recorder's forward pre-hook, ``before(index, module, args)``.
        after: the recorder's forward hook, ``after(index, module, args, output)``.
        mute: the recorder's :meth:`~memprof.capture.hooks.HookRecorder.mute`, given the blocks' submodules while
            installed and ``()`` after: inside a region their hooks do nothing, but dynamo guards on each one's
            module number, so every block would compile a region of its own, and past ``recompile_limit`` (8)
            blocks would run eagerly, silently.
        backend: the backend to compile the blocks with (the model's own: :func:`compile_settings`).
    """

    def __init__(self, modules: Sequence[nn.Module], blocks: Sequence[int], before: Hook, after: Hook,
                 mute: Callable[[Iterable[int]], None], backend: Any = "inductor") -> None:
        self.backend = backend
        self.blocks = [(int(i), weakref.ref(modules[i])) for i in blocks]
        self._before, self._after, self._mute = before, after, mute
        index_of = {id(m): i for i, m in enumerate(modules)}
        self.inside = sorted({index_of[id(sub)] for i in blocks for sub in modules[i].modules()
                              if sub is not modules[i] and id(sub) in index_of})
        self._compiled: dict[int, _RegionalForward] = {}  # index -> the block's regional forward
        self._own: dict[int, Any] = {}  # index -> a forward the instance had before install
        self._codes_before: set[int] | None = None  # the code objects dynamo had met before the first install
        self.installed = False

    def install(self) -> None:
        """Puts a regional forward on each block (its own ``forward`` is restored by :meth:`remove`)."""
        if self._codes_before is None:
            self._codes_before = _codes_seen()
        self._mute(self.inside)
        for index, ref in self.blocks:
            module = ref()
            # a block a schedule runs (``memprof_stage``: planner.executor) is left to it: its stages run compiled
            if module is None or getattr(module.__dict__.get("forward"), "memprof_stage", False):
                continue
            if "forward" in module.__dict__:
                self._own[index] = module.__dict__["forward"]
            if index not in self._compiled:
                # made once: the next costing iteration runs the same compiled code
                self._compiled[index] = _RegionalForward(self, index, module,
                                                         torch.compile(module.forward, backend=self.backend))
            module.forward = self._compiled[index]
        self.installed = True

    def remove(self) -> None:
        """Gives each block its own ``forward`` back, and the recorder its hooks (idempotent)."""
        if not self.installed:
            return
        for index, ref in self.blocks:
            module = ref()
            if module is not None and isinstance(module.__dict__.get("forward"), _RegionalForward):
                del module.forward
                if index in self._own:
                    module.forward = self._own[index]
        self._own = {}
        self.installed = False
        self._mute(())

    def close(self) -> None:
        """Removes the forwards, drops the compiled code, and gives dynamo back the frames it first met while
        installed.

        A graph break inside an inlined module call (the block's regional forward) makes dynamo give up on the
        frame around it, which it then runs eagerly for good: after the costing iterations the user's compiled
        model would run those frames eagerly and each block as a graph of its own (on a 6-layer GPT-2, 5 MB more
        held for the backward and a slower step). Those frames' code objects are reset, so dynamo meets them
        afresh, as in a process that never profiled. (Resetting every frame, ``reset_code_caches``, is worse: the
        model then ran its head eagerly, 936 MB for 730 MB.)
        """
        self.remove()
        self._compiled = {}
        if self._codes_before is not None:
            _forget_codes(self._codes_before)
            self._codes_before = None


class CompiledRegions:
    """The submodules a user compiled on their own (``module.compile()``), their hooks moved out of the region.

    ``nn.Module.compile()`` compiles the module's whole call, hooks included. While attached, such a module calls
    its own ``forward`` compiled instead (inductor, torch.compile's default), so its hooks run around the region;
    :meth:`detach` gives it back its compiled call.

    Args:
        names: the profiled modules' names, root first.
        modules: the profiled modules (the root, compiled whole, is left alone: see :mod:`memprof.capture.eager_pass`).
    """

    def __init__(self, names: Sequence[str], modules: Sequence[nn.Module]) -> None:
        self.found = [(name, module) for name, module in zip(names[1:], modules[1:])
                      if getattr(module, "_compiled_call_impl", None) is not None]
        self._saved: list[tuple[nn.Module, Any, Any]] = []

    @property
    def names(self) -> list[str]:
        """The compiled regions' module names."""
        return [name for name, _ in self.found]

    def attach(self) -> None:
        """Moves each region's hooks out of it."""
        for _, module in self.found:
            own = module.__dict__.get("forward")
            self._saved.append((module, module._compiled_call_impl, own))
            module._compiled_call_impl = None
            module.forward = torch.compile(module.forward)

    def detach(self) -> None:
        """Gives each module its compiled call and its own ``forward`` back (idempotent)."""
        for module, call, own in self._saved:
            module.__dict__.pop("forward", None)
            if own is not None:
                module.forward = own
            module._compiled_call_impl = call
        self._saved = []


class _RegionalForward:
    """A block's forward in a costing iteration: its compiled region, marked around, between graph breaks."""

    def __init__(self, owner: RegionalBlocks, index: int, module: nn.Module, compiled: Any) -> None:
        # weakly: the module holds this forward
        self._owner, self.index, self._module, self.compiled = weakref.ref(owner), index, weakref.ref(module), compiled

    @torch.compiler.disable
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        owner, module = self._owner(), self._module()
        if owner is None or module is None:
            return self.compiled(*args, **kwargs)
        owner._before(self.index, module, args)
        output = self.compiled(*args, **kwargs)
        owner._after(self.index, module, args, output)
        return output
