"""Gradient accumulation found in the hook marks: which iterations are split into micro-batches, and where."""

from __future__ import annotations

from memprof.analysis.attribution import Call
from memprof.analysis.console import format_report
from memprof.analysis.micro_batches import MicroBatches, in_last, micro_batches
from memprof.analysis.records import Mark
from memprof.categories import CATEGORY_COLUMNS

ROOT, BLOCK = 0, 1


def _marks(*kinds: tuple[Mark, int]) -> list[tuple[int, int, int, int, int]]:
    """Sweep marks ``(time_ns, kind, module, change, phase)`` for ``(kind, module)`` pairs, in order."""
    return [(index, int(kind), module, index, 0) for index, (kind, module) in enumerate(kinds)]


def _pair(extra: tuple[tuple[Mark, int], ...] = ()) -> tuple[tuple[Mark, int], ...]:
    """One micro-batch: the root's forward around a block's, then the backward."""
    return ((Mark.FWD_ENTER, ROOT), (Mark.FWD_ENTER, BLOCK), (Mark.FWD_EXIT, BLOCK), (Mark.FWD_EXIT, ROOT), *extra,
            (Mark.BWD_ENTER, BLOCK), (Mark.BWD_EXIT, BLOCK), (Mark.BWD_END, -1))


def test_each_forward_followed_by_its_backward_is_a_micro_batch() -> None:
    marks = _marks(*_pair(), *_pair(), *_pair(), (Mark.OPT_ENTER, -1), (Mark.OPT_EXIT, -1))
    split = micro_batches(marks)
    assert split == MicroBatches(count=3, last_mark=14)
    assert marks[split.last_mark][1:3] == (Mark.FWD_ENTER, ROOT)


def test_a_single_forward_and_backward_is_not_split() -> None:
    assert micro_batches(_marks(*_pair(), (Mark.OPT_ENTER, -1), (Mark.OPT_EXIT, -1))) == MicroBatches(1, 0)
    assert micro_batches([]) == MicroBatches(1, 0)


def test_forwards_without_a_backward_after_each_are_not_split() -> None:
    forward = ((Mark.FWD_ENTER, ROOT), (Mark.FWD_EXIT, ROOT))
    backward = ((Mark.BWD_ENTER, ROOT), (Mark.BWD_END, -1))
    # two views of a batch through the model, then one backward (a contrastive loss)
    assert micro_batches(_marks(*forward, *forward, *backward)).count == 1
    # a training step, then an evaluation forward under no_grad before record_stats()
    assert micro_batches(_marks(*forward, *backward, *forward)).count == 1


def test_a_root_called_from_inside_itself_counts_once() -> None:
    nested = ((Mark.FWD_ENTER, ROOT), (Mark.FWD_ENTER, ROOT), (Mark.FWD_EXIT, ROOT), (Mark.FWD_EXIT, ROOT),
              (Mark.BWD_ENTER, ROOT), (Mark.BWD_END, -1))
    assert micro_batches(_marks(*nested, *nested)).count == 2


def test_calls_of_the_last_micro_batch_are_those_begun_after_its_root_forward() -> None:
    split = MicroBatches(count=2, last_mark=10)
    earlier = Call(BLOCK, start_change=4, start_ns=4, start_mark=9)  # e.g. a recomputation in the previous backward
    later = Call(BLOCK, start_change=4, start_ns=4, start_mark=10)
    assert in_last([earlier, later], split) == [later]
    assert in_last([earlier, later], MicroBatches()) == [earlier, later]


def test_the_console_report_says_the_step_was_split() -> None:
    row = {"iteration": 3, "epoch": 0, "step_ms": 12.0, "peak_allocated_bytes": 4096, "peak_phase": "backward",
           "peak_module": "", "allocated_bytes": 1024, "micro_batches": 4, **{c: 512 for c in CATEGORY_COLUMNS}}
    assert "4 micro-batches (gradient accumulation)" in format_report(row, [], "cpu")
    assert "micro-batches" not in format_report({**row, "micro_batches": 1}, [], "cpu")
