"""Schedules out of the planner: a JSON file and a self-contained Python file to paste into training code."""
