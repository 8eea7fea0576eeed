"""Interop with PyTorch's CUDA memory snapshots (``torch.cuda.memory._dump_snapshot``, viewed by memory_viz).

:func:`import_snapshot` turns a snapshot into a memprof trace (timeline, peak, allocator cache, categories
and modules read from the allocations' stack frames); :func:`export_snapshot` writes a trace as a snapshot
that memory_viz opens. Both are torch-free; the file is read by a restricted unpickler
(:func:`load_snapshot`). ``docs/trace-format.md`` ("PyTorch snapshots") lists every field read and written.

Public names load on first use (the exporter needs the trace reader, which needs pandas).
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from memprof.interop.exporter import export_snapshot, snapshot_of
    from memprof.interop.importer import import_snapshot
    from memprof.interop.snapshot_file import load_snapshot, write_snapshot

_LAZY = {
    "export_snapshot": "memprof.interop.exporter",
    "import_snapshot": "memprof.interop.importer",
    "load_snapshot": "memprof.interop.snapshot_file",
    "snapshot_of": "memprof.interop.exporter",
    "write_snapshot": "memprof.interop.snapshot_file",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["export_snapshot", "import_snapshot", "load_snapshot", "snapshot_of", "write_snapshot"]
