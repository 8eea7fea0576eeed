"""From the training process to the trace: the journal between processes, the background worker that
analyses and writes, and the recovery of what a killed run left in its journal.

Imports neither torch nor pandas (the worker runs in its own process, started as
``python -m memprof.trace.pipeline.worker``).
"""
