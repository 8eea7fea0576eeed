"""Damaged ``iterations`` parts of the ranks of a distributed run: skipped, as the single-run reader skips them.

A part whose footer cannot be read, or whose pages fail their checksums while the ranks' pass reads them,
costs its rank only the iterations it held. The pass leaves it out (and, when the damage shows mid-pass, starts
again without it, so that no row of a damaged part is counted), :attr:`memprof.trace.ranks.RankScan.damage` lists
it with those iterations, and one ``RuntimeWarning`` says it in the words of
:func:`memprof.trace.damage.damage_message`. ``scan_ranks(run, strict=True)`` refuses the rank instead.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from memprof.schema import ITERATIONS
from memprof.trace.damage import PartDamage, lost_iterations, relative_name

#: Why a part whose data pages failed was skipped (the reader's words for the same damage).
DAMAGED_PAGE = "a damaged page (failed its checksum)"

Span = tuple[int, int] | None  # (first, last) iteration of a part; None when it is empty or unreadable


class PartDamaged(Exception):
    """A part's pages failed while the pass read them: the pass starts again without it.

    Attributes:
        rank: the rank the part belongs to.
        part: the part.
        cause: what the Parquet reader said (kept for the strict refusal's message).
    """

    def __init__(self, rank: int, part: Path, cause: Exception) -> None:
        super().__init__(f"rank {rank}: {part} is damaged ({cause})")
        self.rank, self.part, self.cause = rank, part, cause


def rank_damage(run_root: Path, listed: Sequence[Path], spans: Sequence[Span], skipped: Mapping[Path, str],
                last_known: int, journaled: frozenset[int] = frozenset()) -> tuple[PartDamage, ...]:
    """What each skipped part of one rank cost: the iterations between its readable neighbours.

    Args:
        run_root: the run's folder (part names are given relative to it: ``rank=1/iterations.parquet/...``).
        listed: the rank's ``iterations`` parts in write order, skipped ones included.
        spans: each listed part's span from its footer (``None`` where the footer is unreadable).
        skipped: the parts left out, and why.
        last_known: the highest iteration the rank is known to have reached (its parts, journal, metadata).
        journaled: iterations still in the rank's journal: not lost.
    """
    readable = [None if part in skipped else span for part, span in zip(listed, spans)]
    found = []
    for index, (part, span) in enumerate(zip(listed, spans)):
        if part not in skipped:
            continue
        # a footer that still reads says which iterations the part held; else any between its neighbours
        candidates = range(span[0], span[1] + 1) if span is not None else range(last_known + 1)
        lost = lost_iterations(index, readable, (i for i in candidates if i not in journaled))
        found.append(PartDamage(ITERATIONS, relative_name(part, run_root), skipped[part], lost))
    return tuple(found)


def last_iteration(spans: Sequence[Span], recovered_last: int | None, meta: Mapping[str, object]) -> int:
    """The highest iteration a rank is known to have reached: its readable parts, its journal, its ``meta.json``."""
    last = max((span[1] for span in spans if span is not None), default=-1)
    if recovered_last is not None:
        last = max(last, recovered_last)
    recorded = meta.get("iterations")
    if isinstance(recorded, int) and not isinstance(recorded, bool):
        last = max(last, recorded - 1)
    return last
