"""Records the aten ops of one forward: what each allocates, what autograd saves of it, what it costs.

:class:`OpRecorder` is the planning pass behind ``MemoryProfiler(..., ops=True)`` and ``memprof profile-ops``.
While it is active it stacks three things, and removes them all when it stops:

- a ``TorchDispatchMode``, which sees every aten op below autograd (composite ops arrive decomposed, as
  autograd records them): its output storages, its wall time and its FLOPs;
- forward pre/post hooks on every module of the model, so each op is charged to the innermost module running;
- ``saved_tensors_hooks`` whose pack hook notes every tensor autograd saves (it chains to hooks already
  active, such as ``save_on_cpu``, so what the step keeps is unchanged).

Which op saved a tensor: autograd numbers its nodes in creation order (``Node._sequence_nr``), and creates an
op's node before the op reaches the dispatch mode. Its inputs are packed then, before the mode sees the op;
its outputs after the op returns (checked on torch 2.13). So the pack hook reads the number of the newest node
(``torch._C._autograd._get_sequence_nr() - 1``: the saving node), and the nodes created between the previous
op's return and this op's return belong to this op. The saved tensor is then charged, as a ``need``, to the op
that created its storage; a view's storage is its base's, so the need names the op that allocated it.

Tensors are never kept: storages are known by address (``data_ptr``), mapped to the op that created them;
an address freed and allocated again is mapped to its newest creator, and a saved storage cannot be freed.
"""

from __future__ import annotations

import sys
import time
from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils import flop_counter
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from memprof.analysis.op_records import OpRecord
from memprof.errors import ProfilerError

__all__ = ["OpRecorder", "record_ops"]

_next_node_number: Callable[[], int] = torch._C._autograd._get_sequence_nr
_aten = torch.ops.aten
# The CPU flash kernel has the flash kernel's first arguments; torch's registry counts only the latter.
_FLOP_ALIASES = {_aten._scaled_dot_product_flash_attention_for_cpu: _aten._scaled_dot_product_flash_attention}
# ``torch.tensor(data)`` fills its storage outside the dispatcher, then lifts it: the lift's output is new.
_FRESH = {_aten.lift_fresh.default}


def _storage(tensor: torch.Tensor) -> tuple[int, int] | None:
    """``(address, bytes)`` of a tensor's storage; ``None`` when it has none that can be named."""
    try:
        storage = tensor.untyped_storage()
        ptr, nbytes = storage.data_ptr(), storage.nbytes()
    except (RuntimeError, NotImplementedError):  # sparse, nested, or a subclass without storage
        return None
    return (ptr, nbytes) if ptr else None


def _flops(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> int:
    packet = func.overloadpacket
    formula = flop_counter.flop_registry.get(_FLOP_ALIASES.get(packet, packet))
    if formula is None:
        return 0
    try:
        return int(formula(*args, **kwargs, out_val=out))
    except (TypeError, ValueError, RuntimeError, IndexError):  # a formula that does not fit this overload
        return 0


def _written(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[torch.Tensor]:
    """The tensors ``func`` writes in place: its schema's arguments marked ``Tensor(a!)``."""
    written: list[torch.Tensor] = []
    for position, argument in enumerate(func._schema.arguments):
        if argument.alias_info is None or not argument.alias_info.is_write:
            continue
        value = args[position] if position < len(args) else kwargs.get(argument.name)
        written.extend(t for t in tree_leaves(value) if isinstance(t, torch.Tensor))
    return written


@dataclass
class _Op:
    module: str
    op: str
    output_bytes: int
    forward_ms: float
    flops: int
    writes: tuple[int, ...] = ()
    reads: tuple[int, ...] = ()
    needs: set[int] = field(default_factory=set)


class _Mode(TorchDispatchMode):
    def __init__(self, recorder: OpRecorder) -> None:
        super().__init__()
        self.recorder = recorder

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        return self.recorder._dispatch(func, args, kwargs or {})


class OpRecorder:
    """Records the ops of the forward that runs while it is active (a context manager, or start/stop).

    Usage::

        with OpRecorder(model) as recorder:
            loss = loss_fn(model(batch))
        records = recorder.records  # list[OpRecord]

    Args:
        model: the model whose modules name the ops (``""`` for ops outside every module, and the root's).

    Attributes:
        records: the ops recorded, in dispatch order (filled by :meth:`stop`).
        saved_bytes: bytes of the distinct storages autograd saved while recording, by address, whoever
            made them (parameters and inputs included): what :attr:`records`' needs are checked against.
        unattributed: saved tensors made by a recorded op whose saving node could not be matched to an
            op (charged to the newest op instead).
    """

    def __init__(self, model: nn.Module | None = None) -> None:
        self.model = model
        self.records: list[OpRecord] = []
        self.saved_bytes: dict[int, int] = {}
        self.unattributed = 0
        self._ops: list[_Op] = []
        self._creator: dict[int, int] = {}  # storage address -> index of the op that allocated it
        self._node_starts: list[int] = []  # op k owns the autograd nodes numbered [starts[k], starts[k + 1])
        self._next_node = 0
        self._saves: list[tuple[int, int, int]] = []  # (node number, creator op, newest op) per saved tensor
        self._stack: list[str] = []
        self._handles: list[Any] = []
        self._mode: _Mode | None = None
        self._outer_hooks: tuple[Callable[..., Any], Callable[..., Any]] | None = None
        self._cuda = False
        self.active = False

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Installs the hooks, the saved-tensor hooks and the dispatch mode.

        Raises:
            ProfilerError: the recorder already ran (record again with a new one).
        """
        if self.active or self._mode is not None:
            raise ProfilerError("this OpRecorder already recorded a forward; create a new one to record again")
        if self.model is not None:
            for name, module in self.model.named_modules():
                self._handles.append(module.register_forward_pre_hook(self._enter_module(name)))
                self._handles.append(module.register_forward_hook(self._exit_module, always_call=True))
        self._outer_hooks = torch._C._autograd._top_saved_tensors_default_hooks(False)
        torch._C._autograd._push_saved_tensors_default_hooks(self._pack, self._unpack)
        self._next_node = _next_node_number()
        self._mode = _Mode(self)
        self._mode.__enter__()
        self.active = True

    def stop(self) -> list[OpRecord]:
        """Removes everything :meth:`start` installed and builds :attr:`records`. Idempotent."""
        if not self.active:
            return self.records
        self.active = False
        try:
            assert self._mode is not None
            self._mode.__exit__(None, None, None)
        finally:
            torch._C._autograd._pop_saved_tensors_default_hooks()
            for handle in self._handles:
                handle.remove()
            self._handles.clear()
            self._stack.clear()
        self.records = self._build()
        return self.records

    def __enter__(self) -> OpRecorder:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ hooks
    def _enter_module(self, name: str) -> Callable[..., None]:
        def pre(module: nn.Module, args: Any) -> None:
            self._stack.append(name)
        return pre

    def _exit_module(self, module: nn.Module, args: Any, output: Any) -> None:
        if self._stack:
            self._stack.pop()

    def _pack(self, tensor: torch.Tensor) -> Any:
        found = _storage(tensor)
        if found is not None:
            ptr, nbytes = found
            self.saved_bytes[ptr] = nbytes
            creator = self._creator.get(ptr)
            if creator is not None:
                self._saves.append((_next_node_number() - 1, creator, len(self._ops) - 1))
        if self._outer_hooks is None:
            return tensor
        return self._outer_hooks[0](tensor)

    def _unpack(self, packed: Any) -> Any:
        if self._outer_hooks is None:
            return packed
        return self._outer_hooks[1](packed)

    def _dispatch(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        inputs = {found[0] for t in tree_leaves((args, kwargs))
                  if isinstance(t, torch.Tensor) and (found := _storage(t)) is not None}
        cuda = any(isinstance(t, torch.Tensor) and t.is_cuda for t in tree_leaves((args, kwargs)))
        # read before the op runs: its outputs may reuse an input's address (an in-place op keeps it)
        reads = tuple(sorted({creator for ptr in inputs if (creator := self._creator.get(ptr)) is not None}))
        writes = tuple(sorted({creator for t in _written(func, args, kwargs) if (found := _storage(t)) is not None
                               and (creator := self._creator.get(found[0])) is not None}))
        if cuda:
            torch.cuda.synchronize()
        begin = time.perf_counter()
        out = func(*args, **kwargs)
        if cuda:
            torch.cuda.synchronize()
        elapsed_ms = (time.perf_counter() - begin) * 1e3
        index = len(self._ops)
        output_bytes = 0
        for tensor in tree_leaves(out):
            if not isinstance(tensor, torch.Tensor) or (found := _storage(tensor)) is None:
                continue
            ptr, nbytes = found
            if ptr in inputs and func not in _FRESH:  # a view or an in-place result: nothing new
                continue
            inputs.add(ptr)  # two outputs sharing one new storage count it once
            self._creator[ptr] = index
            output_bytes += nbytes
        self._node_starts.append(self._next_node)
        self._next_node = _next_node_number()
        module = self._stack[-1] if self._stack else ""
        self._ops.append(_Op(module, str(func), output_bytes, elapsed_ms, _flops(func, args, kwargs, out), writes,
                             reads))
        return out

    # ------------------------------------------------------------------ results
    def _build(self) -> list[OpRecord]:
        for node, creator, newest in self._saves:
            saver = self._owner(node)
            if saver is None or saver < creator:
                # a node made outside the ops (a custom autograd.Function's) saves after its last op ran
                self.unattributed += 1
                saver = max(newest, creator)
            self._ops[saver].needs.add(creator)
        return [OpRecord(index=i, module=op.module, op=op.op, output_bytes=op.output_bytes,
                         needs=tuple(sorted(op.needs)), forward_ms=op.forward_ms, flops=op.flops,
                         writes=op.writes, reads=op.reads)
                for i, op in enumerate(self._ops)]

    def _owner(self, node: int) -> int | None:
        """The op whose dispatch window created autograd node ``node``."""
        if not self._node_starts or node < self._node_starts[0] or node >= self._next_node:
            return None
        return bisect_right(self._node_starts, node) - 1


def record_ops(model: nn.Module, run: Callable[[], Any]) -> list[OpRecord]:
    """Runs ``run()`` (a forward, with or without its loss) under an :class:`OpRecorder` of ``model``.

    Returns:
        The recorded ops; what ``run`` returns is dropped once the records are built.
    """
    with OpRecorder(model) as recorder:
        run()
    return recorder.records


class OpPass:
    """The planning pass of a profiler: records the ops of one iteration's root forward, then gets out of the way.

    Two hooks on the root module start an :class:`OpRecorder` when the chosen iteration's forward begins and
    stop it when it ends; both are removed once it has run, so later steps cost what they cost without it.

    Args:
        model: the root module.
        iteration: the iteration whose forward is recorded.
        current: returns the iteration in progress.
    """

    def __init__(self, model: nn.Module, iteration: int, current: Callable[[], int]) -> None:
        if isinstance(iteration, bool) or not isinstance(iteration, int) or iteration < 0:
            raise ProfilerError(f"ops_iteration must be a whole number >= 0, found {iteration!r}")
        self.model, self.iteration, self._current = model, iteration, current
        self.recorder: OpRecorder | None = None
        self.done = False
        self._handles = [model.register_forward_pre_hook(self._begin),
                         model.register_forward_hook(self._end, always_call=True)]

    def _begin(self, module: nn.Module, args: Any) -> None:
        if self.recorder is None and self._current() == self.iteration:
            self.recorder = OpRecorder(self.model)
            self.recorder.start()

    def _end(self, module: nn.Module, args: Any, output: Any) -> None:
        if self.recorder is not None and self.recorder.active:
            self.recorder.stop()
            self.done = True
            self.detach()
            if sys.exc_info()[0] is not None:  # an always-call hook of a forward that raised: half a forward
                self.recorder = None

    def take(self) -> list[OpRecord] | None:
        """The records, once, at the end of the recorded iteration; ``None`` before and after.

        A forward that raised leaves the recorder running: it is stopped here and its records dropped.
        """
        if self.recorder is None:
            return None
        recorder, self.recorder = self.recorder, None
        if recorder.active:  # the forward raised before its end hook ran
            recorder.stop()
            self.done = True
            self.detach()
            return None
        return recorder.records

    def detach(self) -> None:
        """Removes the hooks (and stops a recorder still running). Idempotent."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        if self.recorder is not None and self.recorder.active:
            self.recorder.stop()
