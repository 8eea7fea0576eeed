"""``memprof import-snapshot FILE --out DIR``: a PyTorch CUDA memory snapshot as a memprof run.

The run is built beside ``--out`` and renamed into place: a failed import leaves nothing behind, and an
existing ``--out`` is replaced only with ``--force`` (and only once the new run is complete).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from cli.common import OptionError, whole_number


def register(subparsers: argparse._SubParsersAction) -> None:
    """Adds ``memprof import-snapshot`` to the ``memprof`` command."""
    parser = subparsers.add_parser(
        "import-snapshot", help="turn a PyTorch CUDA memory snapshot (.pickle) into a memprof run",
        description="Read the pickle torch.cuda.memory._dump_snapshot wrote (segments and device_traces) and "
                    "write a memprof run: timeline, peaks, allocator cache, categories and modules read from "
                    "the stack frames. Open it with memprof dashboard or memprof report.",
    )
    parser.add_argument("snapshot", help="the snapshot pickle")
    parser.add_argument("--out", required=True, help="the run directory to create, e.g. traces/<run>")
    parser.add_argument("--run-id", default=None, help="the run's name (default: the --out folder's name)")
    parser.add_argument("--device", type=whole_number(0), default=None,
                        help="import only this CUDA device (default: every device; several go to rank=<i>/)")
    parser.add_argument("--force", action="store_true", help="replace --out if it exists")
    parser.set_defaults(func=run_import)


def run_import(args: argparse.Namespace) -> int:
    """Imports the snapshot and prints what the run holds.

    Raises:
        SnapshotFormatError: the file is not a snapshot memprof reads.
        OutputExistsError: ``--out`` exists and ``--force`` was not given.
        OptionError: ``--out`` cannot be written.
    """
    from memprof.interop import import_snapshot
    from memprof.trace import load_trace
    from memprof.units import format_bytes

    try:
        out = import_snapshot(args.snapshot, args.out, args.run_id, device=args.device, force=args.force)
    except OSError as exc:
        raise OptionError(f"cannot write {args.out}: {exc.strerror or exc}") from None
    runs = [out] if (out / "meta.json").is_file() else sorted(out.glob("rank=*"))
    for run in runs:
        trace = load_trace(run)
        frame = trace.iterations
        peak = frame.loc[frame.peak_allocated_bytes.idxmax()]
        print(f"wrote {run}: {trace.meta['device']}, {len(frame)} iteration(s), peak "
              f"{format_bytes(int(peak.peak_allocated_bytes))} allocated in iteration {int(peak.iteration)} "
              f"({peak.peak_phase}), {format_bytes(int(frame.peak_reserved_bytes.max()))} reserved")
    print(f"open it with: memprof dashboard {Path(args.out).parent}")
    return 0
