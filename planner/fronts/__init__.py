"""What each budget buys: Pareto fronts of memory against time, the points each algorithm reaches, and the
planner's advice after a failed step."""
