"""What ``make gpu-check`` measures on a GPU, each target, and how a number is judged against it.

Standard library only: ``scripts/gpu_check.py`` reads these records with whatever Python runs it (no torch),
and ``benchmarks/bench_gpu.py`` writes them, one JSON object a line, as each check ends, so a benchmark that
dies half-way still leaves the checks it finished.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

PASS, FAIL, INFO, ERROR, SKIPPED = "pass", "fail", "info", "error", "skipped"
STATUSES = (PASS, FAIL, INFO, ERROR, SKIPPED)
"""A check's result: its target met or not; ``info``: a number with no target; ``error``: the check raised;
``skipped``: it does not apply here (it needs CUDA, or the algorithm has no schedule for this chain)."""

MiB = 2**20
OVERHEAD_LIMIT = 1.10  # the profiler's step-time target on CPU (issue 2), held on the GPU too
ESTIMATE_ALLOCATED_REL = 0.01
ESTIMATE_RESERVED_REL = 0.05
PLAN_PEAK_REL, PLAN_PEAK_ABS = 0.05, MiB
OVERLAP_TIME_REL = 0.10
SNAPSHOT_PEAK_REL = 0.01


@dataclass(frozen=True)
class Target:
    """One entry of what the GPU run measures: shown in ``docs/gpu.md`` before and after the first run."""

    check: str
    what: str
    target: str


CATALOGUE: tuple[Target, ...] = (
    Target("estimate.allocated", "`memprof.estimate(device=\"cuda\")` on GPT-2 small (AdamW) against "
           "`torch.cuda.max_memory_allocated` of a real step", "within 1%"),
    Target("estimate.reserved", "the estimate's reserved peak against `torch.cuda.max_memory_reserved` "
           "over the real run's first two steps", "within 5%"),
    Target("profiler.overhead_vs_none", "step time with the profiler over step time without", "at most 1.10x"),
    Target("profiler.overhead_vs_history", "step time with the profiler over step time with "
           "`torch.cuda.memory._record_memory_history`", "reported"),
    Target("profiler.peak_allocated", "each iteration's `peak_allocated_bytes` against "
           "`torch.cuda.max_memory_allocated` of that step", "equal, every step"),
    Target("profiler.peak_reserved", "each iteration's `peak_reserved_bytes` against "
           "`torch.cuda.max_memory_reserved` of that step", "equal, every step"),
    Target("transfer.d2h / transfer.h2d", "pinned copy bandwidths (`measure_transfer_bandwidth`), the "
           "offload schedules' link", "reported"),
    Target("plan.<algorithm>.peak", "every algorithm's measured whole-step peak against its prediction "
           "(`measure_schedule`)", "within 5% + 1 MiB"),
    Target("plan.<algorithm>.time", "its measured step time against the predicted makespan", "reported"),
    Target("plan.offload.time, plan.offload+stream.time", "offload and weight streaming on side streams: "
           "measured step time against predicted (the overlap)", "within 10%"),
    Target("snapshot.dashboard", "a `snapshot_on_oom` snapshot of a real CUDA out-of-memory, imported and "
           "opened through the dashboard's data layer; its step peak against the profiler's", "opens; within 1%"),
)


def within(measured: float, predicted: float, rel: float, abs_bytes: float = 0.0) -> bool:
    """Whether ``measured`` lies within ``rel`` of ``predicted`` plus ``abs_bytes`` of slack, either side.

    Args:
        measured: the measured number.
        predicted: what it is held against (a prediction, or another tool's measurement).
        rel: the allowed fraction of ``predicted`` (0.05: 5%).
        abs_bytes: allowed slack on top, in the numbers' own unit (1 MiB for peaks).

    Raises:
        ValueError: ``rel`` or ``abs_bytes`` negative, or a number not finite.
    """
    if rel < 0 or abs_bytes < 0:
        raise ValueError(f"rel and abs_bytes must be >= 0, found {rel} and {abs_bytes}")
    if not (math.isfinite(measured) and math.isfinite(predicted)):
        raise ValueError(f"cannot judge a number that is not finite: measured {measured}, predicted {predicted}")
    return abs(measured - predicted) <= rel * abs(predicted) + abs_bytes


def judged(ok: bool) -> str:
    """``pass`` or ``fail``."""
    return PASS if ok else FAIL


def percent(fraction: float) -> str:
    """A signed relative error as text: ``+0.42%``."""
    return f"{100 * fraction:+.2f}%" if math.isfinite(fraction) else str(fraction)


@dataclass(frozen=True)
class CheckResult:
    """One check's outcome, as ``docs/gpu.md`` shows it.

    Attributes:
        check: the check's id (``plan.rotor.peak``), matching :data:`CATALOGUE`'s patterns.
        what: what was compared, in words.
        measured: the number measured, formatted with its unit.
        reference: what it was held against (a prediction, or another tool's number), formatted.
        error: how far apart, formatted (``+0.42%``, ``1.03x``, ``0 B``); empty when not compared.
        target: the target in words; ``reported`` where there is none.
        status: one of :data:`STATUSES`.
        note: anything a reader needs to trust the number; for ``error`` the exception.
    """

    check: str
    what: str
    measured: str = ""
    reference: str = ""
    error: str = ""
    target: str = "reported"
    status: str = INFO
    note: str = ""

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status must be one of {', '.join(STATUSES)}, found {self.status!r}")

    def to_json(self) -> str:
        """One line of JSON."""
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> CheckResult:
        """The result a :meth:`to_json` line holds.

        Raises:
            ValueError: not an object, ``check`` or ``status`` missing, a status not in :data:`STATUSES`, or an unknown key
                (a record from another version of the benchmark: rerun it with this checkout).
        """
        if not isinstance(raw, Mapping):
            raise ValueError(f"not a check result: {raw!r}; rerun benchmarks/bench_gpu.py from this checkout")
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(raw) - names)
        if unknown or "check" not in raw or "status" not in raw:
            raise ValueError(f"not a check result (unknown keys {unknown}, keys {sorted(raw)}); "
                             "rerun benchmarks/bench_gpu.py from this checkout")
        return cls(**{key: str(value) for key, value in raw.items()})


def read_results(text: str) -> list[CheckResult]:
    """Every result in ``text``, one JSON object a line; a torn last line (the writer was killed) is skipped.

    Raises:
        ValueError: a line before the last is not a check result.
    """
    lines = [line for line in text.splitlines() if line.strip()]
    results = []
    for number, line in enumerate(lines, 1):
        try:
            results.append(CheckResult.from_dict(json.loads(line)))
        except ValueError:  # json.JSONDecodeError is one
            if number == len(lines):
                break
            raise
    return results


def _cell(text: str) -> str:
    """``text`` safe inside a Markdown table cell."""
    return text.replace("|", "\\|").replace("\n", " ")


def results_table(results: list[CheckResult]) -> str:
    """The results as a Markdown table, in the order given."""
    lines = ["| check | what | measured | against | error | target | result | note |",
             "| --- | --- | ---: | ---: | ---: | --- | --- | --- |"]
    for r in results:
        cells = (f"`{r.check}`", r.what, r.measured, r.reference, r.error, r.target, f"**{r.status}**", r.note)
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(lines)


def tally(results: list[CheckResult]) -> str:
    """``3 pass, 1 fail, 2 info``: how many results have each status, in :data:`STATUSES` order (zeros left out)."""
    counts = {status: sum(1 for r in results if r.status == status) for status in STATUSES}
    return ", ".join(f"{count} {status}" for status, count in counts.items() if count) or "no results"
