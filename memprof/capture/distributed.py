"""What distributed wrappers add to a rank's memory: DDP's gradient buckets, FSDP2's unsharded parameters.

**DDP** (``torch.nn.parallel.DistributedDataParallel``) keeps a flat tensor per bucket of gradients, made when the
model is wrapped (before the profiler starts) and made again, in the order the gradients became ready, at the
start of the forward after the first backward (``Reducer::_rebuild_buckets``, called from DDP's
``_pre_forward``, before the wrapped module runs). Python cannot see the bucket tensors (only a communication
hook is handed them, and installing one would change the user's training), so:

* the buckets alive when profiling begins are model state of known sizes (``_get_ddp_logging_data()``'s
  ``bucket_sizes``, or ``rebuilt_bucket_sizes`` once rebuilt) at stand-in addresses: on CPU the allocator never
  reported them, and on CUDA their addresses are not known either;
* while DDP has not rebuilt its buckets, a pre-hook on the wrapped module (run before the profiler's own)
  checks ``_has_rebuilt_buckets``; when it turns true, it records :attr:`Mark.BUCKETS_REBUILT` at the time the
  wrapper's forward began, with the stand-ins to free and the bytes the new buckets hold (as many as the old),
  and removes itself. The analysis then counts the largest blocks, up to those bytes, that the wrapper allocated
  between its forward's start and the wrapped module's and that are still alive then as the new buckets
  (:mod:`memprof.analysis.attribution`). DDP frees the old buckets before making the new ones.

With ``gradient_as_bucket_view=True`` the gradients are views of the buckets: the buckets are the weight
gradients then, and are counted as such (a gradient seen in ``.grad`` ranks before a bucket).

**FSDP2** (``torch.distributed.fsdp.fully_shard``) all-gathers a module's parameters before its forward and
backward (``FSDPParamGroup.unshard`` / ``wait_for_unshard``) and frees them after. Each group's
``wait_for_unshard`` is wrapped (an instance attribute, removed on ``close()``) to observe the unsharded
parameters' storages (``FSDPParam.all_gather_outputs``) as ``weight_copies`` and, before them, the flat all-gather
output they are copied out of as ``comm_buffers``; each group's ``post_backward`` is wrapped to observe the flat
reduce-scatter input it keeps (``comm_ctx.reduce_scatter_states``; HSDP's all-reduce input too) as
``comm_buffers``. The profiler's forward pre-hook on an FSDP module runs before FSDP's, so the all-gather falls
inside the module's forward.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from memprof.analysis.records import CAT, Mark, Storage
from memprof.capture.hooks import HookRecorder, now_ns
from memprof.capture.tensor_walk import pointers
from memprof.categories import Category

__all__ = ["DistributedWatch", "bucket_sizes"]

_COMM = CAT[Category.COMM_BUFFERS]
_WEIGHT_GRADS = CAT[Category.WEIGHT_GRADS]
_WEIGHT_COPIES = CAT[Category.WEIGHT_COPIES]
#: Stand-in addresses of the buckets made before profiling: below every real address (and every other
#: stand-in), so no allocation can be mistaken for one.
_STANDIN_BASE = -(1 << 48)


def _is_ddp(module: nn.Module) -> bool:
    return (torch.distributed.is_available()
            and isinstance(module, torch.nn.parallel.DistributedDataParallel))


def bucket_sizes(ddp: nn.Module) -> list[int]:
    """Bytes of each gradient bucket a DDP wrapper holds now, from its logging data (``[]``: none known)."""
    try:
        data = getattr(ddp, "_get_ddp_logging_data")()  # noqa: B009  (a DDP method mypy cannot see on a Module)
    except (AttributeError, RuntimeError):
        return []
    fields = []
    if getattr(ddp, "_has_rebuilt_buckets", False):
        fields.append(data.get("rebuilt_bucket_sizes"))
    # before a rebuild is logged (it is, at sampled iterations), the first buckets' sizes have the same total
    fields.append(data.get("bucket_sizes"))
    for text in fields:
        if isinstance(text, str) and text.strip():
            try:
                return [int(s) for s in text.split(",") if s.strip()]
            except ValueError:
                continue
    return []


def _fsdp_groups(module: nn.Module) -> list[Any]:
    """FSDP2's parameter groups of a ``fully_shard``-ed module (``[]`` for any other module)."""
    get_state = getattr(module, "_get_fsdp_state", None)
    if get_state is None:
        return []
    try:
        state = get_state()
    except (AssertionError, AttributeError, RuntimeError):
        return []
    groups = getattr(state, "_fsdp_param_groups", None)
    if groups is None:
        group = getattr(state, "_fsdp_param_group", None)
        groups = [group] if group is not None else []
    return [g for g in groups if g is not None and hasattr(g, "wait_for_unshard")]


def _storages(candidates: Any) -> list[Storage]:
    """The storages of the tensors among ``candidates`` that hold memory (FSDP frees a buffer by resizing it)."""
    found: list[Storage] = []
    for tensor in candidates:
        if isinstance(tensor, torch.Tensor) and tensor.untyped_storage().nbytes():
            pointers(tensor, found)
    return found


def _unsharded(group: Any) -> list[Storage]:
    return _storages(t for param in getattr(group, "fsdp_params", ())
                     for t in getattr(param, "all_gather_outputs", None) or ())


def _gathered(group: Any) -> list[Storage]:
    state = getattr(getattr(group, "comm_ctx", None), "all_gather_state", None)
    return _storages(getattr(held, "all_gather_output", None)
                     for held in (getattr(group, "_all_gather_result", None),
                                  getattr(state, "all_gather_result", None)))


def _reducing_buffers(group: Any) -> list[Storage]:
    states = getattr(getattr(group, "comm_ctx", None), "reduce_scatter_states", None) or ()
    return _storages([*(getattr(s, "reduce_scatter_input", None) for s in states),
                      getattr(getattr(group, "_all_reduce_state", None), "all_reduce_input", None)])


class DistributedWatch:
    """DDP's buckets and FSDP2's unsharded parameters for one profiler (see the module docstring).

    Args:
        modules: the hooked modules, root first (their indices are the marks' module indices).
        recorder: the profiler's hook recorder; its ``first_pre_hooks`` are set here, before it attaches.
        block_bytes: the size the allocator gives a request of n bytes (CUDA rounds it up).
    """

    def __init__(self, modules: list[nn.Module], recorder: HookRecorder,
                 block_bytes: Callable[[int], int] = lambda n: n) -> None:
        self.recorder = recorder
        self._ddp = [(i, m) for i, m in enumerate(modules) if _is_ddp(m)]
        self._fsdp = [(i, g) for i, m in enumerate(modules) for g in _fsdp_groups(m)]
        recorder.first_pre_hooks.update(i for i, _ in self._fsdp)
        self._block_bytes = block_bytes
        self._standins: dict[int, list[Storage]] = {}  # DDP module index -> its buckets made before profiling
        self._rebuild_handles: dict[int, Any] = {}
        self._wrapped: list[tuple[Any, str]] = []  # (FSDP2 parameter group, the method wrapped on the instance)

    @property
    def present(self) -> bool:
        """Whether the model is wrapped in DDP or sharded with FSDP2."""
        return bool(self._ddp or self._fsdp)

    def baseline(self) -> list[tuple[int, int, int]]:
        """``(address, bytes, category code)`` of the DDP buckets alive now, at stand-in addresses."""
        found: list[tuple[int, int, int]] = []
        for index, ddp in self._ddp:
            if getattr(ddp, "_use_python_reducer", False) or getattr(ddp, "_delay_all_reduce_all_params", False):
                continue  # no C++ reducer buckets (compiled autograd's DDP, or every parameter ignored)
            as_view = bool(getattr(ddp, "gradient_as_bucket_view", False))
            if as_view and any(p.grad is not None for p in ddp.parameters()):
                continue  # the gradients are views of the buckets: counted as weight grads already
            sizes = bucket_sizes(ddp)
            if not sizes:
                warnings.warn(f"memprof could not read the sizes of DDP's gradient buckets ({type(ddp).__name__}); "
                              "those made before profiling are not counted", RuntimeWarning, stacklevel=4)
            standins = []
            for size in sizes:
                ptr = _STANDIN_BASE - len(found)
                found.append((ptr, self._block_bytes(size), _WEIGHT_GRADS if as_view else _COMM))
                standins.append((ptr, size))
            self._standins[index] = standins
        return found

    def attach(self) -> None:
        """Watches for DDP's bucket rebuild and FSDP2's unshards."""
        for index, ddp in self._ddp:
            wrapped = getattr(ddp, "module", None)
            if not getattr(ddp, "_has_rebuilt_buckets", True) and isinstance(wrapped, nn.Module):
                # before the profiler's own pre-hook on the wrapped module: the mark is the wrapper's, not its
                self._rebuild_handles[index] = wrapped.register_forward_pre_hook(self._rebuild_check(index, ddp),
                                                                                 prepend=True)
        for _, group in self._fsdp:
            group.wait_for_unshard = self._observing(group, group.wait_for_unshard)
            group.post_backward = self._reducing(group, group.post_backward)
            self._wrapped.extend([(group, "wait_for_unshard"), (group, "post_backward")])

    def detach(self) -> None:
        """Removes the hooks and the wrappers; the modules are as they were."""
        for handle in self._rebuild_handles.values():
            handle.remove()
        self._rebuild_handles.clear()
        for group, name in self._wrapped:
            if getattr(group.__dict__.get(name), "memprof_wrapper", False):
                delattr(group, name)
        self._wrapped.clear()

    def _rebuild_check(self, index: int, ddp: nn.Module) -> Callable[[nn.Module, Any], None]:
        def check(module: nn.Module, args: Any) -> None:
            if not getattr(ddp, "_has_rebuilt_buckets", False) or not self.recorder.enabled:
                return
            handle = self._rebuild_handles.pop(index, None)
            if handle is not None:
                handle.remove()  # DDP rebuilds once: from now on the wrapped module's forward pays nothing
            marks = self.recorder.marks
            began = next((m[0] for m in reversed(marks) if m[1] == Mark.FWD_ENTER and m[2] == index), now_ns())
            # the buckets to free, and (0, what the new ones hold): as many bytes, the same gradients in another order
            payload = [*self._standins.pop(index, []), (0, sum(bucket_sizes(ddp)))]
            marks.append((began, Mark.BUCKETS_REBUILT, index, payload))

        return check

    def _observing(self, group: Any, original: Callable[..., Any]) -> Callable[..., Any]:
        def wait_for_unshard(*args: Any, **kwargs: Any) -> Any:
            # the flat all-gather output, freed once copied out into the unsharded parameters
            self.recorder.observe(_gathered(group), _COMM)
            result = original(*args, **kwargs)
            self.recorder.observe(_unsharded(group), _WEIGHT_COPIES)
            return result

        wait_for_unshard.memprof_wrapper = True  # type: ignore[attr-defined]
        return wait_for_unshard

    def _reducing(self, group: Any, original: Callable[..., Any]) -> Callable[..., Any]:
        def post_backward(*args: Any, **kwargs: Any) -> Any:
            result = original(*args, **kwargs)
            # the flat reduce-scatter input, kept until a later group's reduce-scatter is waited for (its output
            # becomes the sharded gradients, seen in .grad), and HSDP's all-reduce input
            self.recorder.observe(_reducing_buffers(group), _COMM)
            return result

        post_backward.memprof_wrapper = True  # type: ignore[attr-defined]
        return post_backward
