"""Benchmarks (not part of the test suite): run each as ``python -m benchmarks.<name>``."""
