"""Slow, obviously correct twins of the solvers, for the tests to hold the fast ones against.

Each module here solves the same problem as its namesake in :mod:`planner.solvers` by plain recursion or
enumeration over the same memory rule; :mod:`planner.solvers.exact` (an algorithm users may choose on
small chains) judges every DP by the simulator's own rules instead.
"""
