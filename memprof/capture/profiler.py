"""``MemoryProfiler``: add two lines to a training loop, get an exact per-layer memory trace."""

from __future__ import annotations

import contextlib
import datetime as _dt
import functools
import gc
import os
import shutil
import sys
import uuid
import warnings
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, Concatenate, ParamSpec

import numpy as np
import torch
from torch import nn

from memprof.analysis.detail import DEFAULT_EVERY, DEFAULT_FIRST, DEFAULT_PEAK_RISE, DetailPolicy
from memprof.analysis.iteration import IterationProcessor, root_forward_ran
from memprof.analysis.layers import subtree_bytes
from memprof.analysis.phase_times import META_KEY as PHASES_KEY
from memprof.analysis.records import CAT, CarriedState, IterationRecord, LiveBlock, Mark, MarkRow, RunSpec
from memprof.capture.dispatch_cost import selective_overhead_us
from memprof.capture.distributed import DistributedWatch
from memprof.capture.eager_pass import EagerPass, unwrap_compiled
from memprof.capture.hooks import HookRecorder, now_ns
from memprof.capture.kineto import SLOT_TAKEN
from memprof.capture.kv_cache import CacheWatcher
from memprof.capture.oom_snapshot import OomSnapshot
from memprof.capture.op_recorder import OpPass
from memprof.capture.optimizers import unwrap_optimizer
from memprof.capture.parameter_shapes import parameter_shapes_meta
from memprof.capture.phase_clock import PhaseClock
from memprof.capture.regional import CompiledRegions, RegionalBlocks, compile_settings, repeated_blocks
from memprof.capture.sinks import BackgroundSink, InlineSink, Outcome
from memprof.capture.stacks import STACK_MIN_BYTES, StackCapture
from memprof.capture.steady import DEFAULT_STEADY, SteadyHooks
from memprof.capture.streams import open_stream
from memprof.capture.tensor_walk import describe_modules, module_tree, optimizer_state, pointers, storages
from memprof.categories import Category
from memprof.errors import MemoryBudgetExceeded, ProfilerError, RunExistsError
from memprof.schema import FORMAT_NAME, SCHEMA_VERSION
from memprof.trace.format.ops_table import write_ops
from memprof.trace.format.writer import TraceWriter, write_meta
from memprof.trace.liveness import writer_record
from memprof.units import format_bytes

# Models a live profiler is attached to; a second profiler on the same model is refused.
_ATTACHED: weakref.WeakSet[nn.Module] = weakref.WeakSet()
_CUDA_BLOCK_BYTES = 512  # the CUDA caching allocator rounds every block up to this
#: A live run's ``meta.json`` gets the phase times so far every this many iterations (and all at close).
PHASE_META_EVERY = 200
#: The phase clock reads the iterations' marks every this many iterations (:mod:`memprof.capture.phase_clock`).
PHASE_POLL_EVERY = 8


def _default_run_id(model: nn.Module) -> str:
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%d-%H%M%S")
    return f"{type(model).__name__.lower()}-{stamp}-{uuid.uuid4().hex[:6]}"


def _distributed() -> tuple[int, int]:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


def _is_memory_error(exc: BaseException) -> bool:
    oom = getattr(torch, "OutOfMemoryError", None) or getattr(torch.cuda, "OutOfMemoryError", ())
    return isinstance(exc, (MemoryBudgetExceeded, MemoryError) + ((oom,) if isinstance(oom, type) else ()))


def _model_device(model: nn.Module) -> torch.device:
    for tensor in list(model.parameters()) + list(model.buffers()):
        return tensor.device
    return torch.device("cpu")


def _allocator_bytes(nbytes: int, cuda: bool) -> int:
    """What the allocator holds for a request of ``nbytes`` (the CUDA caching allocator rounds it up)."""
    return -(-nbytes // _CUDA_BLOCK_BYTES) * _CUDA_BLOCK_BYTES if cuda else nbytes


def _first_missing(path: Path) -> Path | None:
    """The outermost folder of ``path`` that does not exist yet (``None``: ``path`` exists)."""
    missing = None
    for folder in (path, *path.parents):
        if folder.exists():
            break
        missing = folder
    return missing


_P = ParamSpec("_P")


def _undone_on_failure(
        init: Callable[Concatenate[MemoryProfiler, _P], None]) -> Callable[Concatenate[MemoryProfiler, _P], None]:
    """Makes a failing ``__init__`` leave nothing behind: no hook, no profiler slot, no run directory.

    A half-started profiler has no owner to ``close()`` it (the constructor raised), and a run directory
    left marked "running" would read as a crashed run.
    """
    @functools.wraps(init)
    def start(self: MemoryProfiler, *args: _P.args, **kwargs: _P.kwargs) -> None:
        try:
            init(self, *args, **kwargs)
        except BaseException:
            self._abandon_start()
            raise

    return start


class MemoryProfiler:
    """Profiles the memory of a model's training steps, layer by layer, from the allocator's own events.

    Usage::

        profiler = MemoryProfiler(model, optimizer)
        for epoch in range(epochs):
            for x, y in loader:
                ...  # forward, backward, optimizer step as usual
                profiler.record_stats()
            profiler.epoch_end()
        profiler.close()

    or ``with MemoryProfiler(model, optimizer) as profiler: ...``.

    Args:
        model: the model; every module in its tree is hooked. Tensors passed to it, by position or by
            keyword (``model(input_ids=..., labels=...)``), are the iteration's ``inputs``.
        optimizer: its optimizer, so its state is attributed and its step timed (optional). A wrapper
            that holds the ``torch.optim.Optimizer`` as ``.optimizer`` or ``._optimizer`` (accelerate's
            ``AcceleratedOptimizer``, DeepSpeed's, Lightning's ``LightningOptimizer``) is unwrapped
            (:func:`memprof.capture.optimizers.unwrap_optimizer`); ``meta.json`` names both.
        out_dir: folder for traces; the run is written to ``out_dir/run_id`` (``/rank=<r>`` when distributed).
        run_id: name of the run; default ``<model class>-<UTC time>-<random>``.
        print_period: print the console report every this many iterations (0: never).
        stream: where the report is printed (default ``sys.stdout``).
        extra_meta: more keys for ``meta.json`` (e.g. the schedule a measured run executed).
        budget_bytes: a memory guard: when allocated memory crosses it during forward or backward,
            :class:`MemoryBudgetExceeded` is raised from the module that crossed it and the trace
            records a post-mortem. The guard reads the allocator at every module's forward and backward
            mark (on CPU through memprof's native reporter; where that cannot be built, torch.profiler
            is polled instead, about 0.5 ms a read, in forward only). A guarded run processes its
            iterations inline, since the guard needs the live bytes at each iteration's start.
        background: analyse and write each iteration in a background worker process, so that
            ``record_stats()`` only journals what it saw (about 1 ms); the console report then
            prints when the worker has it, usually during the next iteration. ``False``: do it all
            inside ``record_stats()`` (a few ms per step).
        detail_first: the first this many iterations keep their detail (the ``layers`` and ``events``
            rows); every iteration keeps its summary row in ``iterations``.
        detail_every: every this many iterations keep their detail (0: none by number; 1: all).
        detail_peak_rise: an iteration whose peak rises more than this fraction above every detailed
            iteration's keeps its detail, so the run's highest peak is within it of a detailed one. The
            iteration before an out-of-memory error, the failed one, and those passed
            ``record_stats(detail=True)`` always keep theirs (see :class:`memprof.analysis.DetailPolicy`).
        snapshot_on_oom: on CUDA, record PyTorch's allocation history (``torch.cuda.memory._record_memory_history``,
            the newest 100,000 entries, unless it is on already) and, when a step runs out of memory (or crosses
            ``budget_bytes``), dump it to ``<run_dir>/oom_snapshot.pickle`` beside the post-mortem, for
            ``memprof import-snapshot`` or PyTorch's memory_viz (:mod:`memprof.capture.oom_snapshot`). Elsewhere
            it warns once and does nothing.
        allocation_stream: where allocator events come from instead of the device's allocator, with the
            interface of :mod:`memprof.capture.streams` and a ``device`` (the device it models, which the
            run is then profiled as). :func:`memprof.estimate` passes one that sees fake tensors.
        ops: run a planning pass: record the aten ops of one iteration's forward (the root module's first
            forward in it) into the trace's ``ops`` table (:class:`memprof.capture.op_recorder.OpRecorder`):
            each op's new output bytes, what autograd saved of which op, its time and FLOPs. That iteration
            keeps its detail; its times include the recorder's own cost (several times the forward's). Two
            hooks on the root module wait for it and are removed once it has run: other steps cost the same.
            At ``close()`` it also measures what a selective checkpoint adds per op on the model's device
            (:mod:`memprof.capture.dispatch_cost`, tens of ms) into ``meta.json``, for the planner's options.
        ops_iteration: the iteration the planning pass records (default 1: the first after a warm-up step,
            whose times are not those of first calls).
        stack_min_bytes: in iterations scheduled for detail, record the op that made each allocation, and the
            Python stack of those of at least this many bytes (the dashboard's drill-down; ``None``: record
            neither). A torch function mode runs during those iterations only.
        steady: once iterations in a row made the same allocations, take the submodules' and the gradients'
            hooks off while the next ones repeat them, and attribute those from the last hooked iteration's
            records: the same categories, layers and events, for most of the hooks' cost on the training thread
            (:mod:`memprof.capture.steady`; the ``template_iteration`` column says which iterations ran so).
            ``False``: every iteration runs every hook.

    Raises:
        ProfilerError: the model already has a live profiler, or another torch.profiler is running, or
            ``optimizer`` holds no ``torch.optim.Optimizer``. A constructor that raises leaves no hook
            and no run directory behind.
    """

    @_undone_on_failure
    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer | None = None, *,
                 out_dir: str | Path = "traces", run_id: str | None = None, print_period: int = 1,
                 stream: IO[str] | None = None, extra_meta: dict[str, Any] | None = None,
                 budget_bytes: int | None = None, background: bool = True, detail_first: int = DEFAULT_FIRST,
                 detail_every: int = DEFAULT_EVERY, detail_peak_rise: float = DEFAULT_PEAK_RISE,
                 snapshot_on_oom: bool = False,
                 allocation_stream: Any = None, ops: bool = False, ops_iteration: int = 1,
                 stack_min_bytes: int | None = STACK_MIN_BYTES, steady: bool = DEFAULT_STEADY) -> None:
        if not isinstance(model, nn.Module):
            raise ProfilerError(f"expected a torch.nn.Module to profile, found {type(model).__name__}")
        model, wrapper = unwrap_compiled(model)  # layers are named as in the eager model
        if isinstance(print_period, bool) or not isinstance(print_period, int) or print_period < 0:
            raise ProfilerError(f"print_period must be a whole number >= 0, found {print_period!r}")
        if model in _ATTACHED:
            raise ProfilerError(
                f"a MemoryProfiler is already attached to this {type(model).__name__}; close() it before "
                "attaching another (nested profilers would count every allocation twice)"
            )
        self.model, self.optimizer = model, unwrap_optimizer(optimizer)
        # the wrapper's class (accelerate's, Lightning's), for meta.json; None when given the optimizer itself
        self._optimizer_wrapper = type(optimizer).__name__ if optimizer is not self.optimizer else None
        self.print_period, self.stream = print_period, stream
        self.device = torch.device(allocation_stream.device) if allocation_stream is not None else _model_device(model)
        self._measures_dispatch = allocation_stream is None  # an estimate's ops run on fake tensors: nothing to time
        self._cuda = self.device.type == "cuda"
        self.rank, self.world_size = _distributed()
        self.run_id = run_id or self._shared_run_id(model)
        base = Path(out_dir) / self.run_id
        self.run_dir = base / f"rank={self.rank}" if self.world_size > 1 else base
        if allocation_stream is None and torch.autograd._profiler_enabled():
            raise ProfilerError(SLOT_TAKEN)
        if (self.run_dir / "meta.json").exists():
            raise RunExistsError(f"{self.run_dir} already holds a trace; choose another run_id or out_dir")
        if budget_bytes is not None and (isinstance(budget_bytes, bool) or not isinstance(budget_bytes, int)
                                         or budget_bytes <= 0):
            raise ProfilerError(f"budget_bytes must be a positive whole number of bytes, found {budget_bytes!r}")
        if not isinstance(snapshot_on_oom, bool):
            raise ProfilerError(f"snapshot_on_oom must be True or False, found {snapshot_on_oom!r}")
        if not isinstance(ops, bool):
            raise ProfilerError(f"ops must be True or False, found {ops!r}")
        if not isinstance(steady, bool):
            raise ProfilerError(f"steady must be True or False, found {steady!r}")
        self.budget_bytes = budget_bytes
        self.detail = DetailPolicy(first=detail_first, every=detail_every, peak_rise=detail_peak_rise)
        self._detailed: set[int] = set()
        self._stream = allocation_stream if allocation_stream is not None else open_stream(self.device)
        self._names, self._modules = module_tree(model)
        self._regions = CompiledRegions(self._names, self._modules)  # blocks the user compiled on their own
        self._params = list(dict.fromkeys(p for m in self._modules for p in m.parameters(recurse=False)))
        self._infos = describe_modules(self._names, self._modules, self._params)
        weight_bytes = subtree_bytes(self._infos, {i: s[0] for i, p in enumerate(self._params) if (s := storages(p))})
        self.iteration, self.epoch = 0, 0
        self._closed = False
        self._created_dir = _first_missing(self.run_dir)  # what a failed start removes again
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._meta = {**self._initial_meta(), **(extra_meta or {}),
                      **({"compiled_regions": self._regions.names} if self._regions.found else {})}
        write_meta(self.run_dir, self._meta)
        # a compiled model's root hooks go on its wrapper, which runs them outside the graph (eager_pass.py)
        self._hooked = [wrapper, *self._modules[1:]] if wrapper is not None else self._modules
        self._recorder = HookRecorder(self._hooked, self._params, self.optimizer)
        self._recorder.watch_inputs = not self._cuda
        self._eager = EagerPass(wrapper is not None, regional=self._regional_blocks(wrapper))
        # each iteration's forward and backward time, for the planner (not an estimate's: its clock is virtual)
        self._phases = PhaseClock(self._cuda) if allocation_stream is None else None
        if self._phases is not None:
            self._recorder.stamp = self._phases.stamp
        # DDP's buckets and FSDP2's unsharded parameters (before the baseline, which holds the buckets made so far)
        # (a function of the device, not a bound method: the watch must not hold the profiler in a reference cycle,
        # which would keep the model's tensors alive until a garbage collection)
        self._distributed = DistributedWatch(self._hooked, self._recorder,
                                             functools.partial(_allocator_bytes, cuda=self._cuda))
        if budget_bytes is not None:
            self._recorder.guard = self._guard
        self._failure: dict[str, Any] | None = None
        self._write_error: str | None = None
        self._worker_warned = False
        spec = RunSpec(tuple(self._names), tuple(self._infos), tuple(weight_bytes), use_truth=self._cuda,
                       device=str(self.device), print_period=print_period, detail=self.detail)
        self._sink = self._open_sink(spec, CarriedState(-1, self._baseline(), 1), background and budget_bytes is None)
        self._stream.start()
        self._regions.attach()
        self._recorder.attach()
        # (an estimate's few iterations on fake tensors cost nothing to hook)
        self._steady = SteadyHooks(self._recorder, self.detail, steady and allocation_stream is None,
                                   self._steady_allowed)
        self._distributed.attach()
        self._cache_watcher = CacheWatcher(self._hooked[0])
        self._op_pass = OpPass(model, ops_iteration, lambda: self.iteration) if ops else None
        _ATTACHED.add(model)
        self._oom_snapshot = OomSnapshot(self.device) if snapshot_on_oom else None
        if self._oom_snapshot is not None:
            self._oom_snapshot.start()
        # the op and Python stack of allocations, in iterations scheduled for detail (not on fake tensors, nor
        # compiled models: a dispatch mode would change what they run)
        self._stacks = (StackCapture(self.run_dir, self.detail, stack_min_bytes)
                        if stack_min_bytes is not None and allocation_stream is None and wrapper is None
                        and not self._regions.found else None)
        self._iteration_start_ns = now_ns()
        if self._stacks is not None:
            self._stacks.begin(0)

    # ------------------------------------------------------------------ set-up
    def _regional_blocks(self, wrapper: nn.Module | None) -> RegionalBlocks | None:
        """The repeated blocks of a compiled model, compiled on their own with its backend and marked around in
        its costing iterations (:mod:`memprof.capture.regional`); ``None`` for an eager model, and for one
        compiled with ``fullgraph=True``, which allows no graph break between blocks (it runs them eagerly)."""
        if wrapper is None:
            return None
        backend, fullgraph = compile_settings(wrapper)
        if fullgraph:
            return None
        recorder = self._recorder
        return RegionalBlocks(self._modules, repeated_blocks(self._names, self._modules),
                              recorder._forward_pre, recorder._forward_post, recorder.mute, backend)

    def _abandon_start(self) -> None:
        """Undoes whatever a failed ``__init__`` had set up (each step on its own: the first error is the one raised)."""
        self._closed = True
        steps: list[Callable[[], Any]] = []
        for name, method in (("_eager", "close"), ("_recorder", "detach"), ("_distributed", "detach"),
                             ("_regions", "detach"), ("_cache_watcher", "remove"), ("_op_pass", "detach"), ("_oom_snapshot", "stop"),
                             ("_stacks", "end"), ("_sink", "finish")):
            part = getattr(self, name, None)
            if part is not None:
                steps.append(getattr(part, method))
        stream = getattr(self, "_stream", None)
        if stream is not None and getattr(stream, "active", False):
            steps.insert(0, stream.close)  # frees the profiler slot before anything else
        for step in steps:
            with contextlib.suppress(Exception):
                step()
        model = getattr(self, "model", None)
        if model is not None:
            _ATTACHED.discard(model)
        created = getattr(self, "_created_dir", None)
        if created is not None:
            shutil.rmtree(created, ignore_errors=True)
        elif hasattr(self, "_created_dir"):  # the run's folder was there already, without a trace: keep it as it was
            with contextlib.suppress(OSError):
                (self.run_dir / "meta.json").unlink()

    def _shared_run_id(self, model: nn.Module) -> str:
        run_id = _default_run_id(model)
        if self.world_size > 1:  # every rank must write under the same run directory
            box = [run_id]
            torch.distributed.broadcast_object_list(box, src=0)
            run_id = box[0]
        return run_id

    def _open_sink(self, spec: RunSpec, state: CarriedState, background: bool) -> InlineSink | BackgroundSink:
        if background and sys.executable and os.name == "posix":  # the worker's pipes need POSIX select
            try:
                return BackgroundSink(self.run_dir, spec, state)
            except OSError as exc:
                warnings.warn(f"memprof could not start its background worker ({exc}); iterations are processed "
                              "inside record_stats() instead (a few ms per step)", RuntimeWarning, stacklevel=4)
        return InlineSink(IterationProcessor(spec, state), TraceWriter(self.run_dir))

    def _initial_meta(self) -> dict[str, Any]:
        return {
            "format": FORMAT_NAME,
            "schema_version": SCHEMA_VERSION,
            "run_id": self.run_id,
            "created_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "device": str(self.device),
            "torch_version": torch.__version__,
            "model": type(self.model).__name__,
            "optimizer": type(self.optimizer).__name__ if self.optimizer is not None else None,
            **({"optimizer_wrapper": self._optimizer_wrapper} if self._optimizer_wrapper else {}),
            "rank": self.rank,
            "world_size": self.world_size,
            "truth": "cuda-caching-allocator" if self._cuda else "cpu-allocator-events",
            "allocator_source": self._stream.source,
            "status": "running",
            "writer": writer_record(),  # who writes it: a reader tells a killed run from a live one
            "iterations": 0,
            "detail": self.detail.to_json(),
            "python": sys.version.split()[0],
            **parameter_shapes_meta(self.model),  # the planner's check of the model a schedule is applied to
        }

    def _baseline(self) -> list[LiveBlock]:
        """Blocks that exist before profiling starts: model state, with known categories."""
        found: dict[int, LiveBlock] = {}

        def add(tensor: torch.Tensor | None, category: Category) -> None:
            if tensor is None:
                return
            for ptr, nbytes in storages(tensor):
                if ptr == 0 or ptr in found:
                    continue
                if self._cuda:
                    nbytes = _allocator_bytes(nbytes, self._cuda)
                else:
                    self._recorder.watch_free(tensor)
                found[ptr] = LiveBlock(-len(found) - 1, ptr, nbytes, CAT[category])

        for param in self._params:
            add(param, Category.WEIGHTS)
        for module in self._modules:
            for buffer in module.buffers(recurse=False):
                add(buffer, Category.BUFFERS)
        for param in self._params:
            add(param.grad, Category.WEIGHT_GRADS)
        if self.optimizer is not None:
            for state in self.optimizer.state.values():
                for value in state.values():
                    if isinstance(value, torch.Tensor):
                        add(value, Category.OPTIMIZER_STATE)
        for ptr, nbytes, code in self._distributed.baseline():  # DDP's buckets, at stand-in addresses
            found[ptr] = LiveBlock(-len(found) - 1, ptr, nbytes, code)
        return list(found.values())

    # ------------------------------------------------------------------ the loop
    def record_stats(self, detail: bool = False) -> None:
        """Ends the current iteration: attributes its memory, writes it to the trace, maybe prints.

        Args:
            detail: keep this iteration's detail (layers and events) whatever the detail policy says.
        """
        self._check_open()
        self._finish_iteration(detail=bool(detail))

    def _write_failed(self, error: str, stacklevel: int = 5) -> None:
        """Notes a failed write; the first one is a warning (a full disk or a revoked permission must not stop
        the user's training, nor fill its log: said once, whichever table failed)."""
        if self._write_error is None:
            warnings.warn(f"memprof could not write the trace to {self.run_dir} ({error}); "
                          "training continues, later iterations are attempted again", RuntimeWarning,
                          stacklevel=stacklevel)
        self._write_error = error

    def _finish_iteration(self, restart: bool = True, failed: bool = False, detail: bool = False) -> None:
        end_ns = now_ns()
        if self._stacks is not None and (error := self._stacks.end()) is not None:
            self._write_failed(error, stacklevel=4)
        if self._op_pass is not None and self.iteration == self._op_pass.iteration:
            detail = self._write_ops() or detail
        if self._eager.collects_garbage_after(self.iteration):
            gc.collect()  # compile's reference cycles hold tensors (see EagerPass.collects_garbage_after)
        events = self._stream.collect(restart=restart)
        drained = self._recorder.drain()
        reserved, peak_reserved = self._reserved(events)
        # Gradients seen as they were accumulated take precedence in the analysis; only the others are looked up
        # (a steady iteration's come with its template, whose iteration saw them accumulated).
        seen, template = drained.param_grads, self._steady.current()
        grads = {} if template is not None else {
            i: found[0] for i, p in enumerate(self._params)
            if i not in seen and p.grad is not None and (found := pointers(p.grad))}
        detail = detail or self._eager.active  # a compiled model's per-layer costs come from these
        record = IterationRecord(iteration=self.iteration, epoch=self.epoch, start_ns=self._iteration_start_ns,
                                 end_ns=end_ns, events=events, **drained._asdict(), grads=grads,
                                 reserved_bytes=reserved, peak_reserved_bytes=peak_reserved, failed=failed,
                                 detail=detail, template=template)
        self._handle(self._sink.submit(record))
        self._steady.after(record)
        if self._phases is not None:
            self._time_phases(drained.marks, steady=template is not None)
        if self.iteration == 0 and not root_forward_ran(record) and len(events) and self._failure is None:
            self._warn_root_silent(record)
        forward = Mark.FWD_ENTER  # (looked up once: an Enum member's lookup is a call, and there are ~200 marks)
        called = {m[2] for m in record.marks if m[1] == forward}
        if self._eager.after_iteration(self.iteration, called, bool(len(events))):
            self._meta.update(self._eager.meta())
            write_meta(self.run_dir, self._meta)  # a killed run's planner still finds the eager iterations
        self.iteration += 1
        self._iteration_start_ns = now_ns()
        if self._stacks is not None:
            self._stacks.begin(self.iteration)

    def _time_phases(self, marks: list[MarkRow], steady: bool) -> None:
        """Keeps the iteration's phase times; every :data:`PHASE_META_EVERY` iterations into ``meta.json``
        too, so that a planner reading the live run finds them."""
        assert self._phases is not None
        self._phases.end_iteration(self.iteration, marks, steady)
        meta_due = self.iteration % PHASE_META_EVERY == PHASE_META_EVERY - 1
        if meta_due or self.iteration % PHASE_POLL_EVERY == PHASE_POLL_EVERY - 1:
            self._phases.poll()
        if meta_due and self._phases.resolved:
            self._meta[PHASES_KEY] = self._phases.to_meta()
            with contextlib.suppress(OSError):  # close() reports a meta.json it cannot write
                write_meta(self.run_dir, self._meta, durable=False)

    def _steady_allowed(self) -> bool:
        """Whether the submodules' hooks may come off now: not where every module call must be seen."""
        return (self._recorder.guard is None and not self._distributed.present and not self._eager.compiled
                and self._failure is None
                and (self._op_pass is None or self._op_pass.iteration <= self.iteration))

    def _warn_root_silent(self, record: IterationRecord) -> None:
        """Says why the first iteration never saw the model's forward begin, and what to profile instead."""
        called = sorted({m[2] for m in record.marks if m[1] == Mark.FWD_ENTER and m[2] > 0})
        if called:  # (with no hook at all, the model runs compiled: the eager pass says so, eager_pass.py)
            # e.g. a LightningModule whose training_step calls self.model(x): the hooks fired, the root's did not
            names = ", ".join(repr(self._names[i]) for i in called[:3])
            warnings.warn(
                f"memprof saw the forward of submodules ({names}) but never the forward of the profiled "
                f"{type(self.model).__name__} itself, so it cannot tell the forward phase or feature maps (they "
                "read as 'other'). Profile the module whose forward the training step calls (e.g. "
                "MemoryProfiler(lit_module.model, ...); memprof.integrations.lightning finds it).",
                RuntimeWarning, stacklevel=4)

    def _write_ops(self) -> bool:
        """Writes the planning pass's records of this iteration; says whether there were any."""
        assert self._op_pass is not None
        records = self._op_pass.take()
        if not records:
            return False
        try:
            write_ops(self.run_dir, self.iteration, records)
        except OSError as exc:
            warnings.warn(f"memprof could not write the ops of iteration {self.iteration} to {self.run_dir} ({exc})",
                          RuntimeWarning, stacklevel=4)
        return True

    def _handle(self, outcomes: list[Outcome]) -> None:
        """Prints the reports, keeps the post-mortem, and says once what went wrong writing."""
        for outcome in outcomes:
            self._detailed.update(outcome.detailed)
            if outcome.not_repeated:
                self._steady.not_repeated(outcome.iteration)
            if outcome.report is not None:
                print(outcome.report, file=self.stream or sys.stdout, flush=True)
            if outcome.failure is not None and self._failure is not None:
                self._failure.update(outcome.failure)
            if outcome.write_error is not None:
                self._write_failed(outcome.write_error)
        stopped = getattr(self._sink, "stopped", None)
        if stopped and not self._worker_warned:
            self._worker_warned = True
            warnings.warn(f"memprof's background worker for {self.run_dir} stopped ({stopped}); the remaining "
                          "iterations are processed inside record_stats() (a few ms per step)", RuntimeWarning,
                          stacklevel=4)

    def _reserved(self, events: Any) -> tuple[int, int]:
        if not self._cuda:
            return 0, 0
        modelled = getattr(self._stream, "reserved_bytes", None)  # a stream that models the allocator says
        current = int(modelled()) if modelled is not None else int(torch.cuda.memory_reserved(self.device))
        seen = int(np.max(events.total_reserved_bytes)) if len(events) else 0
        return current, max(current, seen)

    def mark_inputs(self, batch: Any) -> None:
        """Marks the tensors of ``batch`` as this iteration's inputs.

        The root module's arguments, positional and keyword (``model(input_ids=...)``), are marked by its
        forward hook; call this for what the hook cannot see, such as targets only the loss reads.
        """
        self._check_open()
        self._recorder.mark_inputs(batch)

    def epoch_end(self) -> None:
        """Marks the end of an epoch: later iterations are recorded with the next epoch number."""
        self._check_open()
        self.epoch += 1

    def close(self) -> None:
        """Removes every hook, stops reading the allocator and finalises ``meta.json``. Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            self._stream.close()
        finally:
            if self._oom_snapshot is not None:
                self._oom_snapshot.stop()
            if self._stacks is not None and (error := self._stacks.end()) is not None:
                self._write_failed(error, stacklevel=4)
            self._eager.close()  # (first: it gives the recorder its submodules' hooks back, which detach removes)
            self._recorder.detach()
            self._distributed.detach()
            self._regions.detach()
            self._cache_watcher.remove()
            self._close_op_pass()
            _ATTACHED.discard(self.model)
            try:
                self._handle(self._sink.finish())
            except OSError as exc:
                self._write_error = self._write_error or str(exc)
            status = "failed" if self._failure else "closed"
            if self._phases is not None and (phases := self._phases.finish())["iterations"]:
                self._meta[PHASES_KEY] = phases
            self._meta.update(self._eager.meta())
            self._meta.update(status=status, iterations=self.iteration, epochs=self.epoch,
                              processing=self._sink.mode,
                              detail={**self.detail.to_json(), "iterations": sorted(self._detailed)})
            if (switched := getattr(self._sink, "switched", None)) is not None:
                self._meta["processing_switch"] = switched.to_meta()  # the records went to the training thread
            if self._failure:
                self._meta["failure"] = self._failure
            if self._write_error:
                self._meta["write_error"] = self._write_error
            try:
                write_meta(self.run_dir, self._meta)
            except OSError as exc:
                warnings.warn(f"memprof could not finalise {self.run_dir / 'meta.json'}: {exc}", RuntimeWarning,
                              stacklevel=2)

    def _close_op_pass(self) -> None:
        if self._op_pass is None:
            return
        self._op_pass.detach()
        if self._op_pass.done and self._measures_dispatch:
            # after the allocator's stream is closed: the measurement's tensors stay out of the trace
            self._meta["selective_overhead_us_per_op"] = round(selective_overhead_us(self.device), 3)
        if not self._op_pass.done:
            warnings.warn(f"MemoryProfiler(ops=True) recorded no ops: the run ended after {self.iteration} "
                          f"iteration(s), before the forward of iteration {self._op_pass.iteration} (ops_iteration)",
                          RuntimeWarning, stacklevel=4)

    def record_failure(self, exc: BaseException) -> None:
        """Flushes the iteration in progress as a post-mortem of ``exc`` (an out-of-memory error).

        Called by the context manager when the block raises; call it yourself in an ``except``
        clause when not using ``with``. The exception is not swallowed.
        """
        if self._closed:
            return
        if self._failure is None:
            last = self._recorder.last_mark()
            self._failure = {
                "kind": "budget" if isinstance(exc, MemoryBudgetExceeded) else "oom",
                "message": str(exc).splitlines()[0][:500] if str(exc) else type(exc).__name__,
                "module": self._names[last[2]] if last and last[2] >= 0 else "",
                "budget_bytes": self.budget_bytes,
            }
        if self._oom_snapshot is not None and (dumped := self._oom_snapshot.dump(self.run_dir)) is not None:
            self._failure["snapshot"] = dumped.name
        self._recorder.enabled = False  # the failed step's autograd graph may still run hooks
        try:
            self._finish_iteration(restart=False, failed=True)
        finally:
            self.close()

    def _guard(self, module: int, mark: int) -> None:
        if self._failure is not None:
            return
        if self._cuda:
            allocated = int(torch.cuda.memory_allocated(self.device))
        elif mark not in (Mark.FWD_ENTER, Mark.FWD_EXIT) and not self._stream.polls_in_backward:
            return  # restarting torch.profiler inside autograd's backward would leak its callbacks
        else:
            # a guarded run is always inline (see __init__), so the carried state is here to read
            sink = self._sink
            assert isinstance(sink, InlineSink), "a guarded run processes inline"
            allocated = sink.allocated_bytes() + self._stream.net_bytes()
        if allocated > (self.budget_bytes or 0):
            module_name = self._names[module] if module >= 0 else ""  # -1: at the end of backward
            name = module_name or type(self.model).__name__
            self._failure = {"kind": "budget", "module": module_name, "budget_bytes": self.budget_bytes,
                             "allocated_bytes": allocated,
                             "message": f"allocated {format_bytes(allocated)} crossed the budget "
                                        f"{format_bytes(self.budget_bytes or 0)} in '{name}'"}
            raise MemoryBudgetExceeded(
                f"allocated {format_bytes(allocated)} crossed the budget {format_bytes(self.budget_bytes or 0)} "
                f"in module '{name}'; the post-mortem is in {self.run_dir} (memprof report {self.run_dir})")

    def _check_open(self) -> None:
        if self._closed:
            raise ProfilerError("this MemoryProfiler is closed; create a new one to keep profiling")

    def __enter__(self) -> MemoryProfiler:
        return self

    def __exit__(self, exc_type: type | None, exc: BaseException | None, tb: object) -> None:
        if exc is not None and _is_memory_error(exc):
            self.record_failure(exc)
        self.close()

    def optimizer_state_bytes(self) -> int:
        """Bytes of the optimizer's state now (unique storages)."""
        return sum(dict(optimizer_state(self.optimizer)).values())
