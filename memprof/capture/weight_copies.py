"""Autocast's weight copies: the low-precision casts of parameters that autograd saved for backward.

Under ``torch.autocast`` an op such as ``linear`` casts its weight to the autocast dtype (a ``_to_copy``
whose autograd node, ``ToCopyBackward0``, leads to the parameter's ``AccumulateGrad``), and saves the cast
for its backward. The allocator sees an ordinary allocation in the module's forward, alive until backward:
without this module it reads as a feature map.

Once per root forward that ran under autocast (on when it began or returned, or entered inside its call, as
accelerate does: see :class:`AutocastCasts`), :class:`AutocastCasts` walks the autograd graph that forward built
(the nodes whose sequence number is at least the one taken when it began, so earlier iterations' graphs and
the inputs' history are not walked), finds the casts of parameters, and reads the storages of
the saved tensors that are such a cast or a view of one from the nodes that saved them. They are observed
as ``weight_copies``; which module made each one is read from the allocation's time by the analysis. A
cast that nothing saves (a ``Linear``'s bias under ``addmm``) is held only by autocast's cache until the
autocast region ends; no node refers to it, so it stays a feature map until then.

Why not per module, or per op: a ``TorchDispatchMode`` sees every cast but costs a Python call per op, and
``saved_tensors_hooks`` a call per saved tensor (and would have to chain to a user's own hooks); one walk
per step costs a few microseconds per autograd node, only in steps that ran under autocast.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from memprof.analysis.records import Storage
from memprof.capture.tensor_walk import grad_tensors

__all__ = ["AutocastCasts", "saved_weight_casts"]

_CAST = "ToCopyBackward0"
_LEAF = "AccumulateGrad"
# Autograd nodes of view ops (their output shares its input's storage): a cast reached through them is saved
# as a view (``addmm`` saves ``weight.t()``). Any other op makes a new storage, which is no weight copy.
_VIEWS = frozenset({
    "TBackward0", "ViewBackward0", "UnsafeViewBackward0", "ReshapeAliasBackward0", "AliasBackward0",
    "TransposeBackward0", "TransposeBackward1", "PermuteBackward0", "ExpandBackward0", "SliceBackward0",
    "SelectBackward0", "SelectBackward1", "AsStridedBackward0", "UnsqueezeBackward0", "UnsqueezeBackward1",
    "SqueezeBackward0", "SqueezeBackward1", "SqueezeBackward2", "SqueezeBackward3", "DiagonalBackward0",
    "NarrowBackward0", "UnfoldBackward0", "ViewAsRealBackward0", "ViewAsComplexBackward0",
})
# Attributes of a node type that hold sizes, strides or offsets, never a saved tensor.
_NOT_TENSORS = ("_sym_sizes", "_sym_strides", "_sym_storage_offset", "_sym_argsize")
# node type -> names of its ``_saved_*`` attributes that may hold tensors (learnt once per type)
_SAVED_NAMES: dict[type, tuple[str, ...]] = {}
# node type -> what the walk does with it (learnt once per type: a dict lookup is cheaper than comparing names)
_IS_OTHER, _IS_CAST, _IS_LEAF, _IS_VIEW = 1, 2, 3, 4
_KINDS: dict[type, int] = {}

_sequence_nr = torch._C._autograd._get_sequence_nr
_autocast_on = torch._C._is_any_autocast_enabled


def _kind(node_type: type) -> int:
    name = node_type.__name__
    kind = (_IS_CAST if name == _CAST else _IS_LEAF if name == _LEAF else _IS_VIEW if name in _VIEWS
            else _IS_OTHER)
    _KINDS[node_type] = kind
    return kind


def _saved_names(node: Any) -> tuple[str, ...]:
    kind = type(node)
    names = _SAVED_NAMES.get(kind)
    if names is None:
        names = _SAVED_NAMES[kind] = tuple(a for a in dir(kind) if a.startswith("_saved_")
                                          and not a.endswith(_NOT_TENSORS))
    return names


def _saved_tensors(node: Any) -> Iterable[torch.Tensor]:
    for name in _saved_names(node):
        try:
            value = getattr(node, name)
        except (RuntimeError, AttributeError):  # freed already, or not a tensor attribute after all
            continue
        if isinstance(value, torch.Tensor):
            yield value
        elif isinstance(value, (list, tuple)):
            yield from (v for v in value if isinstance(v, torch.Tensor))


def _is_weight_cast(node: Any) -> bool:
    """A ``ToCopyBackward0`` whose input is a parameter: a cast of a weight."""
    nexts = node.next_functions
    leaf = nexts[0][0] if nexts else None
    return leaf is not None and type(leaf).__name__ == _LEAF and isinstance(leaf.variable, nn.Parameter)


def saved_weight_casts(roots: Iterable[Any], first_sequence_nr: int) -> list[Storage]:
    """Storages of the weight casts that the graph under ``roots`` saved, made since ``first_sequence_nr``.

    Args:
        roots: autograd nodes (``grad_fn``) of a forward's outputs.
        first_sequence_nr: the autograd sequence number when that forward began; older nodes are not walked.

    Returns:
        ``(base address, 0)`` of each saved cast's storage (the analysis takes its size from the allocator).
    """
    stack = [n for n in roots if n is not None]
    visited: set[Any] = set(stack)
    casts: list[Any] = []
    # node -> the nodes of this forward that take its output, kept only for casts and views (the way up from a cast)
    users: dict[Any, list[Any]] = {}
    kinds = _KINDS
    while stack:
        node = stack.pop()
        kind = kinds.get(type(node)) or _kind(type(node))
        if kind == _IS_CAST and _is_weight_cast(node):  # (made earlier when autocast's cache gave this forward one)
            casts.append(node)
            continue
        if kind == _IS_LEAF or node._sequence_nr() < first_sequence_nr:
            continue
        for child, _ in node.next_functions:
            if child is None:
                continue
            if (kinds.get(type(child)) or _kind(type(child))) in (_IS_CAST, _IS_VIEW):
                users.setdefault(child, []).append(node)
            if child not in visited:
                visited.add(child)
                stack.append(child)
    if not casts:
        return []
    # A cast is often saved through a view (``addmm`` saves ``weight.t()``): going up from each cast through the
    # views of it, every node that takes one of them may have saved it.
    path, holders, frontier = set(casts), set(), list(casts)
    while frontier:
        for user in users.get(frontier.pop(), ()):
            holders.add(user)
            if _KINDS.get(type(user)) == _IS_VIEW and len(user.next_functions) == 1 and user not in path:
                path.add(user)
                frontier.append(user)
    found: dict[int, Storage] = {}
    for node in holders:
        for tensor in _saved_tensors(node):
            if tensor.grad_fn in path:
                try:  # an int for eager tensors (a SymInt only inside a trace, where no hook walks)
                    ptr = int(tensor.data_ptr() - tensor.storage_offset() * tensor.element_size())
                except (RuntimeError, NotImplementedError):
                    continue
                found[ptr] = (ptr, 0)
    return list(found.values())


class AutocastCasts:
    """Finds the weight casts of each root forward that ran under autocast (see the module docstring).

    The profiler calls :meth:`begin` from the root's forward pre-hook, :meth:`look` from the submodules' forward
    pre-hooks while :attr:`watching`, and :meth:`end` from the root's post-hook.

    Autocast is often entered inside the root's call, where its hooks cannot see it: accelerate (the Hugging Face
    ``Trainer`` with ``bf16=True``) and a user's ``@torch.autocast(...)`` on ``forward`` wrap the forward method,
    so autocast is off at the root's pre-hook and off again at its post-hook. The first submodule called inside
    sees it on, so while the root's forward began with autocast off and the submodules are hooked, their pre-hooks
    look (one call into torch each, until one sees it on). In a steady iteration the submodules' hooks are off
    (:mod:`memprof.capture.steady`): it repeats the last hooked iteration, so it walks when that one's forward was
    seen to enter autocast inside. A forward that never runs under autocast walks nothing; one that enters it only
    around functional calls after its last submodule call is not seen (its casts read as feature maps).
    """

    def __init__(self) -> None:
        # per open root forward (a root may call itself): [sequence number when it began, autocast on when it began,
        # autocast seen on inside it, submodules hooked]
        self._open: list[list[Any]] = []
        #: whether the submodules' pre-hooks are to :meth:`look` (a hooked root forward began with autocast off and
        #: none of its submodules saw it on yet)
        self.watching = False
        # whether the last hooked root forward entered autocast inside: what a steady iteration repeats
        self._inside = False

    def begin(self, hooked: bool = True) -> None:
        """Notes where the forward's autograd nodes start (cheap: two calls into torch).

        Args:
            hooked: whether the submodules' forward hooks are on in this iteration (they look for autocast).
        """
        on = _autocast_on()
        self._open.append([_sequence_nr(), on, False, hooked])
        self.watching = hooked and not on

    def look(self) -> None:
        """Called by a submodule's forward pre-hook while :attr:`watching`: notes autocast on inside the forward."""
        if _autocast_on():
            self.watching = False
            if self._open:
                self._open[-1][2] = True

    def reset(self) -> None:
        """Forgets forwards that never returned (one that raised); called between iterations."""
        self._open.clear()
        self.watching = False

    def end(self, output: Any) -> list[Storage]:
        """The saved weight casts of the forward that :meth:`begin` saw start last and that returned ``output``.

        ``[]`` (at the cost of one call into torch) when autocast was off when it began, was not seen inside it (or,
        in a steady iteration, not in the last hooked one's) and is off now.
        """
        self.watching = False
        if not self._open:
            return []
        first, on, inside, hooked = self._open.pop()
        if hooked:
            self._inside = inside
        elif self._inside:
            inside = True
        if not (on or inside or _autocast_on()) or not torch.is_grad_enabled():
            return []
        return saved_weight_casts([t.grad_fn for t in grad_tensors(output)], first)
