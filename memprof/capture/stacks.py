"""The op and Python stack behind the allocations of detailed iterations (the dashboard's drill-down).

While an iteration the detail policy schedules runs (its number alone decides, so capture starts before it),
a ``TorchFunctionMode`` sees every torch function the user's code calls (the outermost: ``F.linear``, not the
ops inside it): for each output storage the call made (not one of its inputs', so views and in-place calls are
left out) it notes the time, address, bytes and function name, and, for outputs of at least ``min_bytes``,
the Python stack that called it (``traceback.extract_stack``, innermost :data:`STACK_DEPTH` frames, memprof's
and torch's own frames left out). A function mode, not a dispatch mode: a Python dispatch mode makes PyTorch
wrap scalar arguments into tensors, 8 bytes each, which would change the very memory being measured (seen:
every detailed step's peak 8 B higher). Allocations made by autograd's backward and by C++ code run no
Python function and have no call; the dashboard names their module and phase. At the end of the iteration the rows
are written as one part of the ``stacks`` table, which this process compacts like the worker compacts the other
tables (:mod:`memprof.trace.format.compaction`: a long run keeps a bounded number of parts); the reader joins
them with the ``allocations`` rows by address and time. Nothing is captured in other iterations, and no tensor is
kept.
"""

from __future__ import annotations

import sys
import traceback
from pathlib import Path
from typing import Any

import pyarrow as pa
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves

from memprof.analysis.detail import DetailPolicy
from memprof.capture import hooks
from memprof.schema import STACKS, STACKS_SCHEMA
from memprof.trace.format.writer import STACKS_TABLES, TraceWriter

#: Outputs this large or larger carry their Python stack (smaller ones only their op).
STACK_MIN_BYTES = 1 << 20
#: Frames kept per stack, innermost last.
STACK_DEPTH = 12
# frames from these folders say nothing about the user's code
_SKIPPED = (str(Path(torch.__file__).parent), str(Path(__file__).resolve().parents[1]))


def _storage(tensor: Any) -> tuple[int, int] | None:
    if not isinstance(tensor, torch.Tensor):
        return None
    try:
        storage = tensor.untyped_storage()
        return storage.data_ptr(), storage.nbytes()
    except (RuntimeError, NotImplementedError):  # sparse, nested, fake
        return None


def user_stack(depth: int = STACK_DEPTH) -> str:
    """The caller's Python stack without memprof's and torch's frames: ``file:line in function``, innermost last."""
    frames = [f for f in traceback.extract_stack(sys._getframe(2), limit=depth * 4)
              if not f.filename.startswith(_SKIPPED)]
    return "\n".join(f"{f.filename}:{f.lineno} in {f.name}" for f in frames[-depth:])


class _Mode(TorchFunctionMode):
    def __init__(self, capture: StackCapture) -> None:
        super().__init__()
        self.capture = capture

    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if not torch.compiler.is_compiling() and not _makes_nothing(func):  # compiling: nothing to note, or break
            self.capture.note(func, args, kwargs or {}, out)
        return out


def op_name(func: Any) -> str:
    """A torch function's name as a user writes it: ``torch.nn.functional.linear``, ``Tensor.add``, ``torch.zeros``."""
    name = getattr(func, "__qualname__", None) or getattr(func, "__name__", None) or str(func)
    module = getattr(func, "__module__", None) or ""
    name = name.replace("_VariableFunctionsClass.", "")
    if name.startswith(("TensorBase.", "_TensorBase.", "Tensor.")):
        return "Tensor." + name.split(".", 1)[1]
    if module == "torch._C._nn":
        return f"torch.nn.functional.{name}"
    if not module or module.startswith("torch._C"):
        return f"torch.{name}"
    return f"{module}.{name}"


def _makes_nothing(func: Any) -> bool:
    """Attribute reads (``param.grad``, ``tensor.data``) hand out existing storages: they made none."""
    return getattr(func, "__name__", "") == "__get__"


class StackCapture:
    """Captures ops and stacks in the iterations a detail policy schedules; writes them to the run's ``stacks`` table.

    Args:
        run_dir: the run directory.
        policy: the run's detail policy (only scheduled iterations are captured).
        min_bytes: the smallest output that carries its stack.
    """

    def __init__(self, run_dir: Path, policy: DetailPolicy, min_bytes: int = STACK_MIN_BYTES) -> None:
        self.run_dir, self.policy, self.min_bytes = Path(run_dir), policy, min_bytes
        self._mode: _Mode | None = None
        self._rows: list[tuple[int, int, int, str, str]] = []
        self._iteration = -1
        self._writer: TraceWriter | None = None  # opened at the first write: most iterations write nothing

    def begin(self, iteration: int) -> None:
        """Starts capturing when ``iteration`` is scheduled for detail."""
        if self._mode is None and self.policy.scheduled(iteration):
            self._iteration, self._rows = iteration, []
            self._mode = _Mode(self)
            self._mode.__enter__()

    def note(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
        """Records the storages ``func`` made (those none of its inputs share)."""
        made = [s for s in map(_storage, tree_leaves(out)) if s is not None and s[0]]
        if not made:
            return
        inputs = {s[0] for s in map(_storage, tree_leaves((args, kwargs))) if s is not None}
        now = hooks.now_ns()
        for ptr, nbytes in made:
            if ptr not in inputs:
                stack = user_stack() if nbytes >= self.min_bytes else ""
                self._rows.append((now, ptr, nbytes, op_name(func), stack))
                inputs.add(ptr)  # a tuple output sharing one storage is one allocation

    def end(self) -> str | None:
        """Stops capturing and writes the iteration's rows.

        Returns:
            Why the rows could not be written (a full disk ...), for the profiler to report with its own write
            errors, once; ``None`` when they were written or there were none. Never raises for it.
        """
        if self._mode is None:
            return None
        self._mode.__exit__(None, None, None)
        self._mode = None
        rows, self._rows = self._rows, []
        if not rows:
            return None
        try:
            if self._writer is None:
                self._writer = TraceWriter(self.run_dir, tables=STACKS_TABLES)
            write_stacks(self._writer, self._iteration, rows)
        except OSError as exc:
            return f"the allocation stacks of iteration {self._iteration}: {exc}"
        return None


def write_stacks(writer: TraceWriter, iteration: int, rows: list[tuple[int, int, int, str, str]]) -> Path | None:
    """Appends one part holding ``rows`` (time, address, bytes, op, stack) to the run's ``stacks`` table and
    merges its parts as the compaction policy says (a merge that fails is a warning: the parts stay readable).

    Args:
        writer: a writer of the run's ``stacks`` table (``TraceWriter(run_dir, tables=STACKS_TABLES)``).
        iteration: the captured iteration.
        rows: its rows.

    Raises:
        OSError: the part could not be written.
    """
    times, ptrs, sizes, ops, stacks = zip(*rows)
    table = pa.Table.from_arrays(
        [pa.array([iteration] * len(rows), pa.int64()), pa.array(times, pa.int64()), pa.array(ptrs, pa.int64()),
         pa.array(sizes, pa.int64()), pa.array(ops, pa.string()), pa.array(stacks, pa.string())],
        schema=STACKS_SCHEMA)
    # made again if it went (a cleanup job, a lost mount): one lost folder is reported once, by the trace's writer
    writer.run_dir.mkdir(parents=True, exist_ok=True)
    path = writer.append(STACKS, table)
    writer.compact()
    return path
