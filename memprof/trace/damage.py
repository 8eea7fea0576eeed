"""Damaged Parquet parts: what the reader skipped, which iterations that cost, and one sentence saying so.

A run is never refused for one bad part (a disk error, a file overwritten by mistake): the reader skips
the part, and the run loses only the iterations that part held. :func:`lost_iterations` finds them from
what is still readable (the parts around it in write order, and the iterations table), and
:func:`damage_message` says it in one line without paths outside the run or exception class names, so
every view of the run (the dashboard's tabs, the command line's warning) shows the same words.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from memprof.schema import ITERATIONS, OPS, OPTIONAL_TABLES, TABLES
from memprof.trace.parts import BadPart, IterationRange, table_parts

#: What the parts of each table hold, as the damage message names it.
_WHAT = {"layers": "layer detail", "events": "timeline", OPS: "recorded ops"}


@dataclass(frozen=True)
class PartDamage:
    """One part the reader skipped.

    Attributes:
        table: the table it belongs to (``"events"`` ...).
        part: its path relative to the run directory (``"events.parquet/part-000003.parquet"``).
        reason: why it was skipped, in words (no exception class names, no absolute paths).
        iterations: the iterations whose rows of ``table`` were lost with it, ascending (empty when none
            could be named, e.g. the ops of a planning pass).
    """

    table: str
    part: str
    reason: str
    iterations: tuple[int, ...] = ()


def format_iterations(numbers: Iterable[int]) -> str:
    """``[1, 2, 3, 5]`` -> ``"1-3, 5"``."""
    values = sorted(set(int(n) for n in numbers))
    spans: list[str] = []
    start = previous = None
    for value in [*values, None]:
        if value is not None and previous is not None and value == previous + 1:
            previous = value
            continue
        if start is not None:
            spans.append(str(start) if start == previous else f"{start}-{previous}")
        start = previous = value
    return ", ".join(spans)


def lost_iterations(index: int, ranges: Sequence[tuple[int, int] | None], candidates: Iterable[int]) -> tuple[int, ...]:
    """The candidates a damaged part may have held: those between its readable neighbours in write order.

    Parts are written in iteration order (one flush after another, merges keep the order), so the
    iterations of part ``index`` lie above the highest iteration of every readable part before it and
    below the lowest of every readable part after it.

    Args:
        index: the damaged part's position among the table's parts, in name (write) order.
        ranges: every part's ``(first, last)`` iteration; ``None`` for damaged parts (or parts without
            statistics, which then bound nothing).
        candidates: iterations the table should hold rows for (for the detail tables, the detailed
            iterations; for the iterations table, every iteration known to the run).
    """
    before = [r[1] for r in ranges[:index] if r is not None]
    after = [r[0] for r in ranges[index + 1:] if r is not None]
    low = max(before, default=None)
    high = min(after, default=None)
    covered = [r for r in ranges if r is not None]
    return tuple(sorted(
        i for i in set(candidates)
        if (low is None or i > low) and (high is None or i < high)
        and not any(lo <= i <= hi for lo, hi in covered)))


def damage_message(damage: Sequence[PartDamage], iterations_total: int | None = None) -> str | None:
    """One line saying what a run lost to damaged parts, or ``None`` when it lost nothing.

    Args:
        damage: the parts skipped.
        iterations_total: the iterations the run recorded (readable or lost), for context.
    """
    if not damage:
        return None
    lost: list[str] = []
    for item in damage:
        what = _WHAT.get(item.table, f"{item.table} rows")
        whose = (f"iterations {format_iterations(item.iterations)}" if len(item.iterations) > 1
                 else f"iteration {item.iterations[0]}" if item.iterations else "some iterations")
        if item.table == OPS:
            whose = "the planning pass"
        phrase = f"{whose} entirely" if item.table == ITERATIONS else f"the {what} of {whose}"
        lost.append(f"{phrase} ({item.part}: {item.reason})")
    count = f"{len(damage)} damaged part{'s' if len(damage) > 1 else ''} skipped"
    context = ""
    if iterations_total:
        hit = {i for item in damage for i in item.iterations}
        context = f"; {max(iterations_total - len(hit), 0)} of {iterations_total} iterations are intact"
    return f"{count}: lost {'; '.join(lost)}{context}."


def relative_name(path: Path, run_dir: Path) -> str:
    """A part's name relative to its run directory (what messages show: never an absolute path)."""
    try:
        return path.relative_to(run_dir).as_posix()
    except ValueError:
        return path.name


def footer_damage(run_dir: Path, bad: Mapping[str, Sequence[BadPart]], parts: Mapping[str, Sequence[Path]],
                  ranges: Mapping[str, Sequence[IterationRange]], written: set[int],
                  detail_iterations: Callable[[], Sequence[int]], recorded: object) -> list[PartDamage]:
    """What each part with an unusable footer cost: the iterations between its readable neighbours.

    Args:
        run_dir: the run directory.
        bad: per table, the parts whose footer could not be read.
        parts, ranges: per table, the readable parts and their iteration ranges.
        written: the iterations whose summary row is readable (or recovered from the journal).
        detail_iterations: the detailed iterations (read only when a detail table is damaged).
        recorded: ``meta.json``'s ``iterations`` (the count at close), when present.
    """
    found: list[PartDamage] = []
    lost_rows: set[int] = set()
    for table in (*TABLES, *OPTIONAL_TABLES):
        if not bad.get(table):
            continue
        listed = table_parts(run_dir, table)
        reasons = {b.path: b.reason for b in bad[table]}
        known = dict(zip(parts[table], ranges[table]))
        spans = [known.get(p) for p in listed]
        if table == ITERATIONS:
            last = _last_known(written, ranges, recorded)
            candidates: set[int] = {i for i in range(last + 1) if i not in written}
        elif table in TABLES:
            candidates = set(detail_iterations()) | lost_rows
        else:  # ops, allocations, stacks: optional, their iterations are not worth a guess
            candidates = set()
        for index, path in enumerate(listed):
            if path in reasons:
                lost = lost_iterations(index, spans, candidates)
                if table == ITERATIONS:
                    lost_rows.update(lost)
                found.append(PartDamage(table, relative_name(path, run_dir), reasons[path], lost))
    return found


def _last_known(written: set[int], ranges: Mapping[str, Sequence[IterationRange]], recorded: object) -> int:
    """The highest iteration the run is known to have reached: its rows, its detail parts, its metadata."""
    last = max(written, default=-1)
    for table in TABLES:
        last = max([last, *(r[1] for r in ranges[table] if r is not None)])
    if isinstance(recorded, int) and not isinstance(recorded, bool):
        last = max(last, recorded - 1)
    return last
