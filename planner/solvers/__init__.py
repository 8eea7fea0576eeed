"""One module per rematerialization algorithm; :mod:`planner.solve` dispatches to them by name.

Every module exposes ``plan(chain, budget_bytes, slots) -> Plan`` (raising
:class:`~planner.errors.InfeasibleBudgetError` when the budget is too small) and
``min_budget_bytes(chain, slots) -> int``.
"""
