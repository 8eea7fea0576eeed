"""Example models for ``memprof demo``, the tests and the benchmarks: not part of the library's API."""
