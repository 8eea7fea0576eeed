"""``memprof dashboard [TRACES_DIR] [--port 8050] [--host 127.0.0.1]``: serves the dashboard."""

from __future__ import annotations

import argparse
import ipaddress
import threading
import warnings
import webbrowser
from pathlib import Path

DEFAULT_TRACES_DIR = "traces"
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8050


def is_loopback(host: str) -> bool:
    """Whether ``host`` only accepts connections from this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def dashboard_url(host: str, port: int) -> str:
    """The address to open in a browser for a server bound to ``host:port``."""
    shown = "127.0.0.1" if host in ("0.0.0.0", "") else ("[::1]" if host == "::" else host)
    if ":" in shown and not shown.startswith("["):
        shown = f"[{shown}]"
    return f"http://{shown}:{port}/"


def serve(traces_dir: str | Path = DEFAULT_TRACES_DIR, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT,
          open_browser: bool = False) -> None:
    """Serves the dashboard until interrupted; prints the URL first.

    Args:
        traces_dir: the folder of runs.
        host: the interface to bind; anything but loopback exposes the traces to the network, which
            is warned about.
        port: the TCP port.
        open_browser: open the URL in the default browser once the server is starting.
    """
    from dashboard.app import create_app

    if not (1 <= int(port) <= 65535):
        raise ValueError(f"port must be between 1 and 65535, found {port}")
    if not is_loopback(host):
        warnings.warn(f"serving on {host}, which other machines can reach: anyone on the network can read "
                      f"the traces in {traces_dir}; use --host 127.0.0.1 to keep them local", stacklevel=2)
    if not Path(traces_dir).is_dir():
        warnings.warn(f"no traces folder at {traces_dir}: the dashboard will show how to make a first trace",
                      stacklevel=2)
    app = create_app(traces_dir)
    url = dashboard_url(host, port)
    print(f"memprof dashboard: serving {Path(traces_dir).resolve()} at {url} (Ctrl+C to stop)", flush=True)
    if open_browser:
        threading.Timer(1.0, webbrowser.open, args=(url,)).start()
    app.run(host=host, port=int(port), debug=False)


def _run(args: argparse.Namespace) -> int:
    serve(args.traces_dir, args.host, args.port, open_browser=args.open)
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Adds the ``dashboard`` sub-command to the ``memprof`` command."""
    parser = subparsers.add_parser("dashboard", help="serve the web dashboard for a folder of traces",
                                   description="Serve the memprof dashboard (runs, layers, timelines, planner).")
    parser.add_argument("traces_dir", nargs="?", default=DEFAULT_TRACES_DIR, metavar="TRACES_DIR",
                        help=f"folder of runs (default: {DEFAULT_TRACES_DIR}/)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"TCP port (default: {DEFAULT_PORT})")
    parser.add_argument("--host", default=DEFAULT_HOST,
                        help=f"interface to bind (default: {DEFAULT_HOST}; others expose the traces to the network)")
    parser.add_argument("--open", action="store_true", help="open the dashboard in the default browser")
    parser.set_defaults(func=_run)
