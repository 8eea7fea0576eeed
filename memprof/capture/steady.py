"""Steady iterations: the hooks that cost the training thread most, off while training repeats itself.

The submodules' forward hooks (and the autograd-node hooks they place for the backward marks), the gradients'
hooks and the optimizer's look at its state are most of what the profiler costs the training thread: Python run
at every module call and every parameter. A training loop repeats itself, and once hooked iterations in a row
(:data:`FIRST_AGREEING` at first) made the same allocations (sizes, in order) and the same marks, the last is a
template for the next ones (:func:`memprof.analysis.template.take_template`): those hooks come off, and each
following iteration's record carries the template, which the analysis places among its own events
(:func:`memprof.analysis.template.apply_template`), with the result hooks would give. The model's own hooks and the
optimizer's marks stay on.

The hooks come back for the next iteration when an iteration's sizes differ from the template's (a new batch
shape, an evaluation step, the last short batch of an epoch) or the analysis finds that one did not repeat it
after all (each such miss doubles the iterations that must agree next time), when the detail policy schedules the
next iteration (a detailed iteration every so often is attributed by its own hooks, which also renews the
template), and for good where every module call must be seen: the memory budget guard, DDP and FSDP2, a compiled
model's eager iterations, the planning pass.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from memprof.analysis.detail import DetailPolicy
from memprof.analysis.records import IterationRecord, MarkTemplate
from memprof.analysis.template import same_allocations, take_template
from memprof.capture.hooks import HookRecorder

#: ``MemoryProfiler(steady=...)``'s default: the submodules' hooks come off in repeated iterations.
DEFAULT_STEADY = True


#: Hooked iterations in a row that must agree before the hooks come off, at first; doubled after each
#: iteration that changed while they were off, up to :data:`MOST_AGREEING`. A loop whose shapes repeat only
#: for a few steps at a time (batches bucketed by length) so loses its hooks less and less often.
FIRST_AGREEING = 2
MOST_AGREEING = 256


class SteadyHooks:
    """Decides, iteration by iteration, whether the hooks a steady iteration goes without are on.

    Args:
        recorder: the profiler's hooks.
        detail: the run's detail policy (iterations it schedules run hooked).
        enabled: whether steady iterations may happen at all.
        allowed: asked before the hooks come off; ``False`` keeps them on (the guard, distributed training).
    """

    def __init__(self, recorder: HookRecorder, detail: DetailPolicy, enabled: bool,
                 allowed: Callable[[], bool] = lambda: True) -> None:
        self.recorder, self.detail, self.enabled, self.allowed = recorder, detail, enabled, allowed
        #: while the hooks are off: the template the running iteration repeats
        self.template: MarkTemplate | None = None
        self.needed = FIRST_AGREEING  # hooked iterations in a row that must agree
        # the last hooked iteration's allocation sizes and marks' kinds and modules, and how many in a row agreed
        self._last: tuple[np.ndarray, list[tuple[int, int]]] | None = None
        self._agreeing = 0

    def current(self) -> MarkTemplate | None:
        """The template of the iteration now running (``None`` while its hooks are on)."""
        return self.template

    def after(self, record: IterationRecord) -> None:
        """Decides, from the iteration that just ended, whether the next one runs hooked."""
        if not self.enabled:
            return
        following = record.iteration + 1
        if self.template is not None:
            if record.failed or not same_allocations(self.template, record.events):
                self._missed()
            elif self.detail.scheduled(following):  # hooked, and the template again if it agrees
                self._last, self._agreeing = (self.template.sizes, _shape(self.template)), self.needed
                self.hooks_on()
            return
        if record.failed or record.template is not None:
            self._last, self._agreeing = None, 0
            return
        shape = [(int(m[1]), m[2]) for m in record.marks]
        last, self._last = self._last, (np.asarray(record.events.size_bytes), shape)
        agrees = last is not None and shape == last[1] and np.array_equal(last[0], record.events.size_bytes)
        self._agreeing = self._agreeing + 1 if agrees else 1
        if self._agreeing < self.needed or not self.allowed() or self.detail.scheduled(following):
            return
        template = take_template(record)
        if template is not None:
            self.template = template
            self.recorder.set_full_hooks(False)

    def not_repeated(self, iteration: int) -> None:
        """The analysis found that ``iteration`` ran without hooks and did not repeat its template: hooks on,
        when the template it had is still the one in use (the answer may come after a newer one was taken)."""
        if self.template is not None and iteration > self.template.iteration:
            self._missed()

    def _missed(self) -> None:
        self._last, self._agreeing = None, 0
        self.needed = min(2 * self.needed, MOST_AGREEING)
        self.hooks_on()

    def hooks_on(self) -> None:
        """Puts the hooks back for the next iteration (until enough iterations in a row agree again)."""
        if self.template is not None:
            self.template = None
            self.recorder.set_full_hooks(True)


def _shape(template: MarkTemplate) -> list[tuple[int, int]]:
    """The kinds and modules of a template's marks (as a hooked iteration's are compared)."""
    return [(kind, module) for kind, module in template.marks[:, :2].tolist()]
