"""Capture: what runs in the training process (torch).

The profiler attaches hooks (:mod:`~memprof.capture.hooks`), reads the allocator's events through a
stream (:mod:`~memprof.capture.streams`: the native reporter in :mod:`~memprof.capture.native`, or
torch.profiler in :mod:`~memprof.capture.kineto`) and hands each iteration's raw record
(:class:`memprof.analysis.records.IterationRecord`) to a sink (:mod:`~memprof.capture.sinks`): analysed
inline, or journaled for the background worker.
"""
