"""A thread that runs what it is handed, one call at a time, while the caller waits: the baseline's steps
interleaved with a profiled lane's (:mod:`benchmarks.bench_profiler`, ``--pairing steps``).

A profiler watches the thread it was started on (memprof's reporter and ``torch.profiler`` both sit in that
thread's profiler slot; memprof's hooks are on its own model instance), so a baseline stepping on another
thread between the profiled lane's steps runs unobserved, and both see the machine in the same state; the one
exception, ``torch.profiler``'s Python tracer, sets itself on every thread alive when it starts, so the
baseline's thread is started after the tool's (:func:`benchmarks.bench_profiler.paired_steps`).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


class StepThread:
    """Runs callables on a thread of its own, strictly one after another with the caller: :meth:`call` hands one
    over and returns its result (or raises its exception) once it has finished."""

    def __init__(self, name: str = "baseline-steps") -> None:
        self._todo: queue.Queue[Callable[[], Any] | None] = queue.Queue()
        self._done: queue.Queue[tuple[bool, Any]] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while (job := self._todo.get()) is not None:
            try:
                self._done.put((True, job()))
            except BaseException as exc:  # noqa: BLE001 - handed back to the caller, which raises it
                self._done.put((False, exc))

    def call(self, job: Callable[[], T]) -> T:
        """``job()`` run on the thread; the caller waits for it.

        Raises:
            RuntimeError: the thread was closed.
            BaseException: whatever ``job`` raised.
        """
        if not self._thread.is_alive():
            raise RuntimeError("the step thread was closed")
        self._todo.put(job)
        ok, value = self._done.get()
        if not ok:
            raise value
        return value

    @property
    def ident(self) -> int | None:
        """The thread's identifier."""
        return self._thread.ident

    def close(self) -> None:
        """Ends the thread once it is idle."""
        if self._thread.is_alive():
            self._todo.put(None)
            self._thread.join()

    def __enter__(self) -> StepThread:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
