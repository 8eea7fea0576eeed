"""The trace on disk: writing a run's Parquet parts atomically, merging them (compaction), the ops table.

Imports neither torch nor pandas: the background worker writes through these modules.
"""
