"""The tape of a partial replay: the aten ops of one stage's forward, recorded so that any part of it can run again.

:class:`PartialTape` is what :mod:`planner.executor.partial` fills from its dispatch mode and replays from in
backward. Each op becomes a :class:`Step`: the function, its flattened arguments with every tensor replaced by
an :class:`OpOut` (output ``k`` of op ``i`` of the stage; an op's written arguments count as outputs after its
results) or an :class:`Outside` (a tensor made before the stage: input, parameters, buffers, masks, held
strongly), and the RNG state before it when it draws random numbers.

Tensors are known by memory, not by object: autograd wraps a view op's result in a new tensor after the
dispatch mode saw it, so a tensor is named by its storage (a weak reference, which keeps the storage's address
from being reused while the forward records), offset, shape, strides and dtype, and the newest op that returned
such a tensor is its producer (the same memory and layout hold the same values). Storages are also traced to
the op that allocated them (``creator``), so that in-place writes through other views are seen.

Part of the pure-torch runtime (imports only torch and the standard library; ``planner.export.files`` embeds it).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._pytree import tree_flatten, tree_leaves
from torch.utils.checkpoint import SAC_IGNORED_OPS

OUTSIDE = -1
"""The creator of a storage made before the stage."""

ReplayRng = tuple[bytes, list[tuple[int, bytes]]]
"""The CPU generator's state and each CUDA device's, before a random op (as bytes: host memory off the tensor
allocator, 5 KB for the CPU generator)."""


class OpOut:
    """An argument that is output ``ref[1]`` of op ``ref[0]`` of the stage."""

    __slots__ = ("ref",)

    def __init__(self, ref: tuple[int, int]) -> None:
        self.ref = ref


class Outside:
    """An argument made before the stage: ``PartialTape.outside[index]``."""

    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index


class Step:
    """One recorded op: what replaying it takes and what it depends on."""

    __slots__ = ("func", "spec", "flat", "written", "slots", "refs", "writes", "rng")

    def __init__(self, func: Any, spec: Any, flat: list[Any], written: tuple[int, ...],
                 refs: tuple[tuple[tuple[int, int], int], ...], writes: frozenset[int], rng: ReplayRng | None) -> None:
        self.func, self.spec, self.flat = func, spec, flat
        self.written = written  # the positions in ``flat`` of the arguments it writes in place, in order
        self.refs = refs  # ((op, output), creator of its storage) for each OpOut argument
        self.writes = writes  # the creators of the stage's storages it writes in place
        self.rng = rng
        self.slots: tuple[int, ...] = ()  # its outputs (then written arguments) that are tensors


def _tensor_key(tensor: torch.Tensor) -> tuple[Any, ...] | None:
    try:
        storage = StorageWeakRef(tensor.untyped_storage())
    except (RuntimeError, NotImplementedError, TypeError):  # no storage to name (sparse, nested, subclasses)
        return None
    return storage, tensor.storage_offset(), tuple(tensor.shape), tuple(tensor.stride()), tensor.dtype


def _replay_alias(tensor: torch.Tensor) -> torch.Tensor:
    """A detached alias sharing the version counter (as the selective checkpoint's cache makes them), so a
    held tensor keeps no graph alive and its in-place changes are seen."""
    with torch._C._SetExcludeDispatchKeyGuard(torch._C.DispatchKey.ADInplaceOrView, False):
        return tensor.detach()


_UNMARKED_WRITES = {"aten.native_batch_norm.default": (3, 4), "aten.cudnn_batch_norm.default": (3, 4),
                    "aten.miopen_batch_norm.default": (3, 4)}
"""Arguments that ops write without their schema saying so (batch norm's running statistics, in training)."""


def _written_ids(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[set[int], set[int]]:
    """The ids of the tensors ``func`` writes in place: its schema's arguments marked ``Tensor(a!)`` (whose
    version counters autograd moves), and those of :data:`_UNMARKED_WRITES`."""
    marked: set[int] = set()
    unmarked: set[int] = set()
    hidden = _UNMARKED_WRITES.get(str(func), ())
    for position, argument in enumerate(func._schema.arguments):
        is_marked = argument.alias_info is not None and argument.alias_info.is_write
        if is_marked or position in hidden:
            value = args[position] if position < len(args) else kwargs.get(argument.name)
            (marked if is_marked else unmarked).update(id(t) for t in tree_leaves(value) if isinstance(t, torch.Tensor))
    return marked, unmarked


def _capture_rng(func: Any, flat: Iterable[Any]) -> ReplayRng | None:
    if torch.Tag.nondeterministic_seeded not in func.tags:
        return None
    devices = sorted({(leaf.index or 0) for leaf in (x.device if isinstance(x, torch.Tensor) else x for x in flat)
                      if isinstance(leaf, torch.device) and leaf.type == "cuda"})
    return _state_bytes(torch.get_rng_state()), [(d, _state_bytes(torch.cuda.get_rng_state(d))) for d in devices]


def _state_bytes(state: torch.Tensor) -> bytes:
    return bytes(state.numpy().tobytes())


def set_replay_rng(state: ReplayRng) -> None:
    """Puts the generators in ``state`` (taken before a random op)."""
    torch.set_rng_state(torch.frombuffer(bytearray(state[0]), dtype=torch.uint8))
    for device, cuda_state in state[1]:
        torch.cuda.set_rng_state(torch.frombuffer(bytearray(cuda_state), dtype=torch.uint8), device)


class PartialTape:
    """The recorded ops of one forward of a stage, the outputs it keeps, and the cone of a replay.

    Args:
        policy: the ops whose outputs are kept, ``(aten overload name, occurrence)``.

    Attributes:
        steps: the recorded ops, in forward order.
        outside: the tensors made before the stage that the ops read.
        kept: ``(op, output) -> (tensor, version when kept)``: the policy's outputs, and once the forward
            returned, the outputs it returned.
        cuda: whether an op saw a CUDA tensor.
    """

    def __init__(self, policy: Iterable[tuple[str, int]]) -> None:
        self.policy = frozenset((str(name), int(n)) for name, n in policy)
        self.steps: list[Step] = []
        self.outside: list[torch.Tensor] = []
        self.kept: dict[tuple[int, int], tuple[torch.Tensor, int]] = {}
        self.cuda = False
        self.creators: dict[tuple[int, int], int] = {}  # (op, output) -> the op that allocated its storage
        self.held_creators = {OUTSIDE}  # storages held anyway: made before the stage, or by a kept output
        self._seen: dict[str, int] = {}
        # only while recording: they hold weak references to storages, and the outside tensors' own objects
        self._produced: dict[tuple[Any, ...], tuple[int, int]] = {}
        self._storage_creator: dict[Any, int] = {}
        self._outside_ids: dict[int, tuple[int, torch.Tensor]] = {}

    # ------------------------------------------------------------------ recording
    def record(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Runs ``func`` (from the dispatch mode) and records it."""
        index = len(self.steps)
        flat, spec = tree_flatten((args, kwargs))
        marked, unmarked = _written_ids(func, args, kwargs)
        written_ids = marked | unmarked
        marks: list[Any] = []
        refs: list[tuple[tuple[int, int], int]] = []
        writes: set[int] = set()
        written = tuple(p for p, leaf in enumerate(flat) if isinstance(leaf, torch.Tensor) and id(leaf) in written_ids)
        for position, leaf in enumerate(flat):
            if not isinstance(leaf, torch.Tensor):
                marks.append(leaf)
                continue
            self.cuda = self.cuda or leaf.is_cuda
            key = _tensor_key(leaf)
            ref = self._produced.get(key) if key is not None else None
            if ref is None:
                if key is not None:
                    self._storage_creator.setdefault(key[0], OUTSIDE)
                marks.append(self._outside(leaf, snapshot=position in written))
                continue
            creator = self.creators[ref]
            marks.append(OpOut(ref))
            refs.append((ref, creator))
            if position in written and creator != OUTSIDE:
                writes.add(creator)
        step = Step(func, spec, marks, written, tuple(refs), frozenset(writes), _capture_rng(func, flat))
        out = func(*args, **kwargs)
        results = tree_flatten(out)[0]
        values = [*results, *(flat[p] for p in written)]
        step.slots = tuple(self._register(index, k, v) for k, v in enumerate(values) if isinstance(v, torch.Tensor))
        self.steps.append(step)
        # its results are kept (not the arguments it writes); autograd counts a write after the op returns
        self._keep_if_asked(func, index, [(k, values[k], id(values[k]) in marked) for k in step.slots
                                          if k < len(results)])
        return out

    def _register(self, index: int, k: int, tensor: torch.Tensor) -> int:
        key = _tensor_key(tensor)
        if key is not None:
            self.creators[(index, k)] = self._storage_creator.setdefault(key[0], index)
            self._produced[key] = (index, k)
        else:  # nothing can name it: a reader will hold it as an outside tensor
            self.creators[(index, k)] = OUTSIDE
        return k

    def _outside(self, tensor: torch.Tensor, snapshot: bool) -> Outside:
        found = self._outside_ids.get(id(tensor))
        if found is None:
            found = (len(self.outside), tensor)
            self._outside_ids[id(tensor)] = found
            self.outside.append(tensor if tensor.grad_fn is None else _replay_alias(tensor))
        if snapshot:  # its value before this op writes it: what this op and the earlier readers read
            self.outside[found[0]] = tensor.clone()
        return Outside(found[0])

    def _keep_if_asked(self, func: Any, index: int, results: list[tuple[int, torch.Tensor, bool]]) -> None:
        if func in SAC_IGNORED_OPS:  # the selective checkpoint's policy never sees them: not counted
            return
        name = str(func)
        occurrence = self._seen.get(name, 0)
        self._seen[name] = occurrence + 1
        if (name, occurrence) in self.policy:
            for k, tensor, bumped in results:
                alias = _replay_alias(tensor)
                self.kept[(index, k)] = (alias, alias._version + bumped)
                self.held_creators.add(self.creators[(index, k)])

    def producer(self, tensor: torch.Tensor) -> tuple[int, int] | None:
        """The op output ``tensor`` is (``None``: made before the stage, or unknown), while recording."""
        key = _tensor_key(tensor)
        return self._produced.get(key) if key is not None else None

    def finish(self, out: Any) -> None:
        """Ends the recording: keeps the first tensor the stage returned (its output, which the schedule holds
        anyway), checks the kept outputs, drops the lookups.

        Raises:
            RuntimeError: a kept output was changed in place after it was made.
        """
        first = next((leaf for leaf in tree_leaves(out) if isinstance(leaf, torch.Tensor)), None)
        ref = self.producer(first) if first is not None else None
        if first is not None and ref is not None and ref not in self.kept:
            alias = first.detach()
            self.kept[ref] = (alias, alias._version)
        self._produced.clear()
        self._storage_creator.clear()
        self._outside_ids.clear()
        for ref in self.kept:
            self.kept_tensor(ref)

    # ------------------------------------------------------------------ replaying
    def kept_tensor(self, ref: tuple[int, int]) -> torch.Tensor:
        """The kept output ``ref``.

        Raises:
            RuntimeError: it was changed in place after it was kept (the replay would read the changed value).
        """
        tensor, version = self.kept[ref]
        if tensor._version != version:
            raise RuntimeError(
                f"partial recomputation: output {ref[1]} of op {ref[0]} of the stage ({self.steps[ref[0]].func}), "
                f"which the option keeps, was changed in place after it was made (version {version}, now "
                f"{tensor._version}), so a replay would read the changed value; choose an option that does not keep "
                "it (the planner never keeps an output its stage writes in place)"
            )
        return tensor

    def release_kept(self, still_needed: Iterable[tuple[int, int]]) -> None:
        """Drops the kept outputs but ``still_needed`` (after the replay, which was their last reader)."""
        keep = set(still_needed)
        self.kept = {ref: value for ref, value in self.kept.items() if ref in keep}

    def held_storages(self) -> set[int]:
        """The addresses of the kept and outside tensors' storages (a replay must not write into them)."""
        tensors = [*self.outside, *(tensor for tensor, _ in self.kept.values())]
        return {ptr for t in tensors if (ptr := t.untyped_storage().data_ptr())}

    def cone(self, needed: Iterable[tuple[int, int]]) -> list[int]:
        """The ops a replay runs to rebuild the op outputs ``needed``, in forward order.

        Walking back from the last op: an op runs when a later running op (or ``needed``) takes its output,
        or when it writes into a storage that a later running op reads (or that holds a needed output). Kept
        outputs and outside tensors end the walk.
        """
        n = len(self.steps)
        wanted = [False] * n
        read_until = [-1] * n  # by storage creator: the latest running op (n: after the forward) that reads it
        for op, k in needed:
            wanted[op] = True
            if (creator := self.creators[(op, k)]) != OUTSIDE:
                read_until[creator] = n
        order = []
        for p in range(n - 1, -1, -1):
            step = self.steps[p]
            if not wanted[p] and not any(read_until[s] > p for s in step.writes):
                continue
            order.append(p)
            for ref, creator in step.refs:
                if ref in self.kept:
                    continue
                wanted[ref[0]] = True
                if creator != OUTSIDE:
                    read_until[creator] = max(read_until[creator], p)
        return order[::-1]
