"""Held-memory budget: each stage keeps one recomputation option, chosen to bound what the forward holds.

The persistent DPs bound the peak. Some users need a bound on something else: what the forward leaves
held for the backward (the activations "stash"): a pipeline-parallel stage holds that much per micro-batch
in flight, and torch.compile's ``activation_memory_budget`` is a fraction of it. Here every stage runs
``F_all`` once with one of its options (:mod:`planner.model.stage_option`; option 0 keeps everything) and the
backward runs in reverse, so the forward holds ``a^0 + sum_s a-bar_{k_s}^s`` when the loss starts and the
step recomputes ``sum_s r_{k_s}^s`` in the backward. The loss stage is not counted, unless it offers
chunked options (the head and its cross-entropy in chunks, :mod:`planner.discovery.loss_options`): then
what it holds counts too, and its option is chosen like any stage's (a selective option of the loss would
drop nothing for longer than it takes to recompute it, since its backward starts right after its forward).

Choosing ``k_s`` is a multiple-choice knapsack, solved on a grid of memory slots fixed by the chain (not
by the budget, so the recomputation never rises as the budget grows):

    H(s, m) = min over k of  r_k^s + H(s+1, m - w_k^s),   H(L+1, m) = 0,

``w_k^s`` being a-bar_k^s in slots, rounded up, so a schedule found within ``m`` slots holds at most
``m`` slots' bytes. The table is filled apart (:func:`compute_table`) from the choice read back from it
(:func:`rebuild`); ``reference/held.py`` is the exhaustive search the tests hold it against.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from memprof.units import format_bytes
from planner.model.chain import Chain, Stage
from planner.model.schedule import Op, OpKind
from planner.model.schedule_params import ScheduleParams
from planner.solvers import loss_choice
from planner.solvers.common import Plan, backward_all, infeasible

NAME = "held"
DEFAULT_HELD_SLOTS = 10_000
"""Slots spanning store-all's held bytes: the rounding costs at most one slot per stage (0.01% each)."""


@dataclass(frozen=True, eq=False)
class HeldTable:
    """The held-budget DP's table for one chain.

    Attributes:
        slot_bytes: bytes per memory slot.
        weights: per stage 1..L, a-bar of each option (0: keep everything) in slots, rounded up.
        recompute_ms: per stage 1..L, the recomputation ``B(s)`` adds with each option.
        cost: float64 ``(L+1, W+1)``: ``cost[s-1, m]`` is the least recomputation of stages ``s..L``
            holding at most ``m`` slots (inf: none fits); row ``L`` is zeros. ``W`` is store-all's slots.
        store_all_bytes: what stages 1..L hold keeping everything, in bytes: budgets at or above it keep
            everything (its rounded slots may lie above it).
    """

    slot_bytes: int
    weights: tuple[tuple[int, ...], ...]
    recompute_ms: tuple[tuple[float, ...], ...]
    cost: np.ndarray
    store_all_bytes: int

    @property
    def width(self) -> int:
        """Store-all's held memory in slots: the table's last column."""
        return self.cost.shape[1] - 1

    def min_held_bytes(self) -> int:
        """The smallest budget with a choice on this grid (every stage at its lightest option)."""
        lightest = int(np.flatnonzero(np.isfinite(self.cost[0]))[0]) * self.slot_bytes
        return min(lightest, self.store_all_bytes)


def counted_stages(chain: Chain) -> list[tuple[Stage, tuple[int, ...]]]:
    """The stages whose a-bar the held budget counts, each with the options it may take: stages 1..L with
    all of theirs, then the loss with its chunked ones when it has some (else it is not counted)."""
    out = [(stage, tuple(range(len(stage.options) + 1))) for stage in chain.stages[:-1]]
    if loss_choice.has_loss_options(chain):
        out.append((chain.stages[-1], loss_choice.chunk_choices(chain)))
    return out


def stage_choices(chain: Chain) -> list[list[tuple[int, float]]]:
    """``[(a-bar_k in bytes, r_k in ms)]`` for each counted stage (:func:`counted_stages`), keeping everything
    first."""
    return [[(stage.saved_with(k), stage.recompute_ms_with(k)) for k in options]
            for stage, options in counted_stages(chain)]


def store_all_held_bytes(chain: Chain) -> int:
    """What the counted stages hold for the backward when each keeps everything (a^0 not counted)."""
    return sum(stage.saved_bytes for stage, _ in counted_stages(chain))


def held_bytes(chain: Chain, options: tuple[int, ...]) -> int:
    """What the counted stages hold for the backward with option ``options[i]`` each (a^0 not counted)."""
    return sum(stage.saved_with(k) for (stage, _), k in zip(counted_stages(chain), options, strict=True))


def compute_table(chain: Chain, slots: int = DEFAULT_HELD_SLOTS) -> HeldTable:
    """Fills ``H(s, m)`` for every stage and every memory 0..W slots.

    Raises:
        ValueError: ``slots`` is not a whole number >= 1.
    """
    if isinstance(slots, bool) or not isinstance(slots, int) or slots < 1:
        raise ValueError(f"slots must be a whole number >= 1, found {slots!r}")
    choices = stage_choices(chain)
    slot_bytes = max(1, -(-store_all_held_bytes(chain) // slots))
    weights = tuple(tuple(-(-kept // slot_bytes) for kept, _ in stage) for stage in choices)
    width = sum(w[0] for w in weights)
    cost = np.full((len(choices) + 1, width + 1), np.inf)
    cost[len(choices)] = 0.0
    for s in range(len(choices) - 1, -1, -1):
        for w, (_, r) in zip(weights[s], choices[s], strict=True):
            # keeping w slots leaves m - w for the stages after s
            np.minimum(cost[s, w:], r + cost[s + 1, : width + 1 - w], out=cost[s, w:])
    recompute = tuple(tuple(r for _, r in stage) for stage in choices)
    return HeldTable(slot_bytes, weights, recompute, cost, store_all_held_bytes(chain))


def rebuild(table: HeldTable, held_budget_bytes: int) -> tuple[int, ...]:
    """The choice of each counted stage (an index into its :func:`stage_choices`: its option for stages 1..L)
    that recomputes least within ``held_budget_bytes`` (ties: the choice holding less).

    Raises:
        InfeasibleBudgetError: the budget is below every stage's lightest option (the minimum is named).
    """
    if held_budget_bytes >= table.store_all_bytes:
        return (0,) * len(table.weights)
    m = min(held_budget_bytes // table.slot_bytes, table.width)
    if m < 0 or not np.isfinite(table.cost[0, m]):
        detail = f"held memory, {table.width} slots of {format_bytes(table.slot_bytes)}"
        if all(len(w) == 1 for w in table.weights):
            detail += ("; no stage has recomputation options: record the ops of a step (MemoryProfiler(..., "
                       "ops=True) or memprof profile-ops) to get some")
        raise infeasible(NAME, held_budget_bytes, table.min_held_bytes(), detail)
    chosen = []
    for s, (weights, recompute) in enumerate(zip(table.weights, table.recompute_ms, strict=True)):
        fits = [(recompute[k] + table.cost[s + 1, m - w], w, k) for k, w in enumerate(weights) if w <= m]
        _, w, k = min(fits)
        chosen.append(k)
        m -= w
    return tuple(chosen)


def held_ops(chain: Chain, options: tuple[int, ...]) -> tuple[Op, ...]:
    """``F_all(s)`` with ``options[s-1]`` for each stage, the loss (with ``options[L]`` when given), then
    ``B(L+1) .. B(1)``."""
    top = chain.length + 1
    forward = [Op(OpKind.F_ALL, s, k) for s, k in enumerate(options[: top - 1], start=1)]
    loss = options[top - 1] if len(options) == top else 0
    return tuple(forward + [Op(OpKind.F_ALL, top, loss)] + backward_all(top, 1))


def min_held_bytes(chain: Chain, slots: int = DEFAULT_HELD_SLOTS) -> int:
    """The smallest held budget :func:`plan` accepts (each stage at its lightest option, on the grid)."""
    return compute_table(chain, slots).min_held_bytes()


def plan(chain: Chain, held_budget_bytes: int, slots: int = DEFAULT_HELD_SLOTS) -> Plan:
    """The schedule that recomputes least while stages 1..L hold at most ``held_budget_bytes`` for the
    backward.

    Raises:
        InfeasibleBudgetError: the budget is below the least the options can hold (named).
    """
    table = compute_table(chain, slots)
    options = tuple(choices[i] for (_, choices), i in zip(counted_stages(chain), rebuild(table, held_budget_bytes),
                                                          strict=True))
    kept = held_bytes(chain, options)
    if kept > held_budget_bytes:
        raise AssertionError(f"held DP chose options holding {kept} bytes over the budget {held_budget_bytes}")
    return Plan(held_ops(chain, options), ScheduleParams(held_budget_bytes=held_budget_bytes, held_bytes=kept,
                                                         options=tuple(options), slots=slots,
                                                         slot_bytes=table.slot_bytes))
