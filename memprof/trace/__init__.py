"""The trace on disk: its contract, the journal between processes, writing, and reading.

:mod:`~memprof.trace.schema` is the contract; :mod:`~memprof.trace.journal` carries raw records to
:mod:`~memprof.trace.worker`, which writes Parquet parts through :mod:`~memprof.trace.writer`;
:mod:`~memprof.trace.reader` (with :mod:`~memprof.trace.recovery` for a killed run and
:mod:`~memprof.trace.ranks` for distributed runs) is the one way everything else reads a trace.
The worker's modules import neither torch nor pandas; the reader uses pandas.
"""
