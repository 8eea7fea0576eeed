"""The console's notes on a peak read back from a trace (memprof.trace.peak_notes): what ``memprof report`` says of
a finished run is what its training console said. Oracle: the console the training process printed, whose
numbers tests/memprof/test_peak_phase.py holds to the events rows and the parameters' shapes."""

from __future__ import annotations

import re

import pytest

from memprof.analysis.console import AFTER_FORWARD_KEY, EARLIER_GRADS_KEY
from memprof.trace.peak_notes import peak_notes
from memprof.units import format_bytes
from tests.bad_input import run_cli
from tests.memprof.test_peak_phase import _mlp, _run, _weight_bytes


def _console_for(console: str, iteration: int) -> str:
    """The console's report of ``iteration`` (up to the next one's header)."""
    parts = re.split(r"(?m)^(?=memprof \| iteration )", console)
    return next(p for p in parts if p.startswith(f"memprof | iteration {iteration} "))


@pytest.mark.parametrize(("width", "classes", "batch", "after_zero_grad", "expected"), [
    (64, 1024, 256, False, (True, False)),   # the loss makes the peak; zero_grad came first
    (128, 512, 8, True, (True, True)),       # Lightning's order: the previous gradients alive at the loss
    (512, 16, 4, False, (False, False)),     # the new gradients make the peak, in backward
])
def test_the_notes_are_what_the_console_said(tmp_path, width: int, classes: int, batch: int, after_zero_grad: bool,
                                             expected: tuple[bool, bool]) -> None:
    model = _mlp(width, classes)
    trace, console = _run(tmp_path, model, batch, after_zero_grad, detail_first=2)
    notes = peak_notes(trace, 1)  # (iteration 0 has no previous step)
    said = _console_for(console, 1)
    assert notes[AFTER_FORWARD_KEY] == expected[0] == ("after the model's forward returned" in said)
    grads = _weight_bytes(model) if expected[1] else 0
    assert notes[EARLIER_GRADS_KEY] == grads
    assert (f"previous step's weight gradients alive at the peak: {format_bytes(grads)}" in said) == expected[1]
    code, out, _ = run_cli(["report", str(trace.path), "--iteration", "1"])
    assert code == 0
    for line in said.splitlines()[1:3]:  # the peak line and, when said, the gradients line (not the step time)
        if "peak allocated" in line or "previous step's" in line:
            assert line.split(" | current")[0] in out, (line, out)


def test_an_iteration_without_detail_has_no_notes(tmp_path) -> None:
    trace, _ = _run(tmp_path, _mlp(64, 1024), 256, False, detail_first=1)
    assert peak_notes(trace, 3) == {}
