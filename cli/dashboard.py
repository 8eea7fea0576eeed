"""``memprof dashboard [TRACES_DIR] [--port 8050] [--host 127.0.0.1] [--open]``: serves the dashboard.

The server lives in :mod:`dashboard.server`; this module only reads the options. Without the ``dashboard``
extra (dash, plotly) the command says how to install it, in one line.
"""

from __future__ import annotations

import argparse

from cli.common import port_number, require_dashboard_extra
from dashboard.server import DEFAULT_HOST, DEFAULT_PORT, DEFAULT_TRACES_DIR, serve


def register(subparsers: argparse._SubParsersAction) -> None:
    """Adds ``memprof dashboard`` to the ``memprof`` command."""
    parser = subparsers.add_parser("dashboard", help="serve the web dashboard for a folder of traces",
                                   description="Serve the memprof dashboard (runs, layers, timelines, planner).")
    parser.add_argument("traces_dir", nargs="?", default=DEFAULT_TRACES_DIR, metavar="TRACES_DIR",
                        help=f"folder of runs (default: {DEFAULT_TRACES_DIR}/)")
    parser.add_argument("--port", type=port_number, default=DEFAULT_PORT,
                        help=f"TCP port, 1..65535 (default: {DEFAULT_PORT})")
    parser.add_argument("--host", default=DEFAULT_HOST,
                        help=f"interface to bind (default: {DEFAULT_HOST}; others expose the traces to the network)")
    parser.add_argument("--open", action="store_true", help="open the dashboard in the default browser")
    parser.set_defaults(func=run_dashboard)


def run_dashboard(args: argparse.Namespace) -> int:
    """Serves the dashboard until interrupted.

    Raises:
        MissingExtraError: dash or plotly is not installed.
        ServeError: nothing can listen on ``--host``:``--port``.
    """
    require_dashboard_extra()
    serve(args.traces_dir, args.host, args.port, open_browser=args.open)
    return 0
