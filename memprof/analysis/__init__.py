"""Analysis: from one iteration's raw record to the rows of the trace tables.

Torch-free and pandas-free on purpose: the background worker runs it without importing either
(``tests/memprof/test_imports.py`` checks). The flow is :mod:`~memprof.analysis.records` (the seam
with capture) -> :mod:`~memprof.analysis.attribution` (each block's category) ->
:mod:`~memprof.analysis.timeline` and :mod:`~memprof.analysis.layers` (event and layer rows), run per
iteration by :mod:`~memprof.analysis.iteration`.
"""
