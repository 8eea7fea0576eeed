"""``memprof export-snapshot RUN_DIR --out FILE``: a memprof run as a PyTorch memory snapshot for memory_viz.

The file is written atomically; an existing one is replaced only with ``--force``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from cli.common import OptionError
from cli.runs import open_run


def register(subparsers: argparse._SubParsersAction) -> None:
    """Adds ``memprof export-snapshot`` to the ``memprof`` command."""
    parser = subparsers.add_parser(
        "export-snapshot", help="write a run as a PyTorch memory snapshot (.pickle) for memory_viz",
        description="Write a memprof run as the pickle torch.cuda.memory._dump_snapshot writes, so PyTorch's "
                    "memory_viz (https://pytorch.org/memory_viz) opens it: allocations synthesised from the "
                    "categories of each event, coloured by category, their frames naming module and phase.",
    )
    parser.add_argument("run_dir", help="a run directory (one rank of a distributed run)")
    parser.add_argument("--out", required=True, help="the .pickle file to write")
    parser.add_argument("--force", action="store_true", help="replace --out if it exists")
    parser.set_defaults(func=run_export_snapshot, reads_runs=True)  # its damage said once (cli.runs)


def run_export_snapshot(args: argparse.Namespace) -> int:
    """Writes the snapshot and says how to open it.

    Raises:
        TraceError: the run cannot be read.
        OutputExistsError: ``--out`` exists and ``--force`` was not given.
        OptionError: ``--out`` cannot be written.
    """
    from memprof.interop import export_snapshot, load_snapshot

    out = Path(args.out)
    directory = out.parent if str(out.parent) else Path(".")
    if not directory.is_dir():
        raise OptionError(f"cannot write {out}: directory {directory} does not exist")
    if out.is_dir():
        raise OptionError(f"cannot write {out}: it is a directory; expected a file name")
    open_run(args.run_dir)  # every part read once: a damaged one is said even where the snapshot does not look
    try:
        export_snapshot(args.run_dir, out, force=args.force)
    except OSError as exc:
        raise OptionError(f"cannot write {out}: {exc.strerror or exc}") from None
    snapshot = load_snapshot(out)
    entries = sum(len(trace) for trace in snapshot["device_traces"])
    print(f"wrote {out}: {entries} allocator entries, {len(snapshot['segments'])} blocks live at the end")
    print(f"open it at https://pytorch.org/memory_viz, or: python -m torch.cuda._memory_viz trace_plot {out} "
          "-o memory.html")
    return 0
