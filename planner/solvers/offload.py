"""Offload: ROTOR's persistent DP with a third choice per stage -- keep, recompute, or offload to host memory.

The table and its recurrence are in ``offload_fill.py``; this module reads schedules out of it (the DP table
computed apart from the schedule rebuilt from it) and solves each budget on its own grid, as rotor does
(``budget_grid.py``). Transfers cost what :mod:`planner.simulation.streams` says, with the chain's
:class:`~planner.model.transfer.TransferCosts` (the documented default when it has none).

What it guarantees: within the budget (and the host cap), the fastest schedule among ROTOR's persistent
ones in which some stages of the first forward sweep offload a-bar - a after their ``F_all`` and prefetch
it back while the stage above runs its backward (``reference/offload.py`` enumerates that family and the
tests hold the DP to it). Without a usable link (a bandwidth of 0, a host cap of 0, nothing to move) it is
rotor's DP and returns rotor's schedules; with transfers that cost nothing it is never slower than rotor,
whose schedules it contains.
"""

from __future__ import annotations

from functools import partial

import numpy as np

from memprof.units import format_bytes
from planner.errors import TableTooLargeError
from planner.model.chain import Chain
from planner.model.schedule import Op, OpKind
from planner.model.schedule_params import ScheduleParams
from planner.solvers import rotor, rotor_fill
from planner.solvers.budget_grid import Minimum, lowest_budget, plan_on_own_grid
from planner.solvers.common import Plan, infeasible
from planner.solvers.discretize import DEFAULT_SLOTS, discretize
from planner.solvers.offload_fill import HOST_SLOTS, Costs, OffloadTable, fill, least_memory, table_bytes_for
from planner.solvers.store_all import store_all_ops, store_all_peak_bytes

MAX_TABLE_BYTES = 2**30
"""The most memory the value and choice tables may take (about L^2/2 x host slots x memory slots)."""


def usable(chain: Chain) -> bool:
    """Whether offloading can help at all: a usable link and some stage with a-bar above a."""
    return chain.transfer_costs.usable and any(chain.offload_bytes(s) > 0 for s in range(1, chain.length + 1))


def compute_table(chain: Chain, reference_bytes: int, slots: int = DEFAULT_SLOTS,
                  host_slots: int = HOST_SLOTS) -> OffloadTable:
    """Fills the DP on the grid of ``slots`` slots spanning ``reference_bytes``.

    Raises:
        TableTooLargeError: the tables would take more than ``MAX_TABLE_BYTES``.
    """
    grid = discretize(chain, slots, reference_bytes)
    costs = Costs.of_grid(grid, host_slots)
    size = table_bytes_for(grid, costs.host_slots)
    if size > MAX_TABLE_BYTES:
        raise TableTooLargeError(
            f"the offload DP's tables would take {format_bytes(size)} for {chain.length} stages, {slots} slots and "
            f"{costs.host_slots} host slots (limit {format_bytes(MAX_TABLE_BYTES)}); use fewer slots or rotor"
        )
    return fill(costs, rotor.compute_table(chain, grid=grid))


def root_slots(table: OffloadTable, budget_bytes: int) -> int:
    """The memory ``m`` of the root state for ``budget_bytes`` (``a^0`` taken out; may be negative)."""
    grid = table.costs.grid
    return min(grid.budget_slots(budget_bytes), grid.slots) - int(grid.a[0])


def threshold_bytes(table: OffloadTable) -> int | None:
    """The smallest budget with a schedule on the table's grid, store-all's peak capping it."""
    root = table.value[1][0, table.costs.host_slots]
    finite = np.flatnonzero(np.isfinite(root))
    top = store_all_peak_bytes(table.costs.grid.chain)
    if finite.size == 0:
        return top
    return min(table.costs.grid.to_bytes(int(finite[0]) + int(table.costs.grid.a[0])), top)


def rebuild(table: OffloadTable, budget_bytes: int) -> tuple[Op, ...]:
    """The DP's schedule within ``budget_bytes``, read from the table (store-all at or above its peak).

    Raises:
        InfeasibleBudgetError: no schedule fits on this grid (the message names the grid's minimum).
    """
    costs = table.costs
    grid = costs.grid
    chain = grid.chain
    if budget_bytes >= store_all_peak_bytes(chain):
        return store_all_ops(chain)
    m, r = root_slots(table, budget_bytes), costs.host_slots
    if m < 0 or not np.isfinite(table.value[1][0, r, m]):
        raise infeasible("offload", int(budget_bytes), threshold_bytes(table),
                         f"{grid.slots} slots of {format_bytes(grid.slot_bytes)}")
    top = grid.top
    ops: list[Op] = []
    stack: list[list[Op] | tuple[int, int, int, int]] = [(1, m, 0, r)]
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            ops += item
            continue
        s, m, p, r = item
        fetch = [Op(OpKind.PREFETCH, p)] if p > 0 and p == s - 1 else []
        if s == top:
            ops += [Op(OpKind.F_ALL, top), Op(OpKind.B, top)] + fetch
            continue
        code = int(table.choice[s][p, r, m])
        if code < 0:
            raise AssertionError(f"rebuild reached an infeasible state D({s}, {m}, {p}, {r}); the table is inconsistent")
        if code == 0:
            ops.append(Op(OpKind.F_ALL, s))
            stack += [fetch + [Op(OpKind.B, s)], (s + 1, m - int(grid.abar[s]), p, r)]
        elif code == 1:
            ops += [Op(OpKind.F_ALL, s), Op(OpKind.OFFLOAD, s)]
            stack += [fetch + [Op(OpKind.B, s)], (s + 1, m - int(grid.a[s]), s, r - int(costs.host[s]))]
        else:
            j = s + code - 2
            x_b = int(costs.off[p]) if fetch else 0
            ops += [Op(OpKind.F_CK, s)] + [Op(OpKind.F_NONE, k) for k in range(s + 1, j + 1)]
            stack += [fetch + rotor.rebuild_part(table.rotor, s, j, m - x_b), (j + 1, m - int(grid.a[j]), p, r)]
    return tuple(ops)


def floor_bytes(chain: Chain) -> int:
    """The family's least memory on 1-byte slots, the host cap left out: no grid solves a smaller budget."""
    width = max(store_all_peak_bytes(chain), 1)
    grid = discretize(chain, width, width)
    found = least_memory(Costs.of_grid(grid), rotor_fill.least_memory(grid, "rotor"))
    return int(min(found, width)) if np.isfinite(found) else width


def minimum(chain: Chain, slots: int = DEFAULT_SLOTS, host_slots: int = HOST_SLOTS) -> Minimum | None:
    """The minimum feasible budget, each budget on its own grid (see :mod:`budget_grid`)."""
    top = store_all_peak_bytes(chain)

    def threshold(reference: int) -> int | None:
        return threshold_bytes(compute_table(chain, reference, slots, host_slots))

    return lowest_budget(threshold, top, slots, floor_bytes(chain))


def min_budget_bytes(chain: Chain, slots: int = DEFAULT_SLOTS) -> int:
    """The smallest budget for which :func:`plan` finds a schedule (each budget on its own grid; a chain with
    nothing to offload is rotor's, :mod:`planner.solvers.handover`)."""
    found = minimum(chain, slots)
    assert found is not None, "store-all's peak always has a schedule"
    return found.budget_bytes


def plan(chain: Chain, budget_bytes: int, slots: int = DEFAULT_SLOTS) -> Plan:
    """The fastest schedule of the family within ``budget_bytes`` on the budget's own grid.

    Raises:
        InfeasibleBudgetError: the budget is below the minimum feasible one (named).
        TableTooLargeError: the chain is too long for the tables at this many slots.
    """
    def solve_on(reference: int, budget: int) -> Plan:
        table = compute_table(chain, reference, slots)
        ops = rebuild(table, budget)
        offloaded = [op.stage for op in ops if op.kind is OpKind.OFFLOAD]
        return Plan(ops, ScheduleParams(slots=slots, slot_bytes=table.costs.grid.slot_bytes, offloaded=tuple(offloaded),
                                        transfer=chain.transfer_costs.source))

    return plan_on_own_grid("offload", budget_bytes, store_all_peak_bytes(chain), solve_on,
                            partial(minimum, chain, slots), f"{slots} slots spanning each budget")
