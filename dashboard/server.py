"""Serving the dashboard: :func:`serve` (what ``memprof dashboard`` runs), its URL and the loopback check.

Dash itself is imported only when :func:`serve` builds the app, so that the command line can name the
missing ``dashboard`` extra in one line when it is not installed.
"""

from __future__ import annotations

import errno
import ipaddress
import socket
import threading
import warnings
import webbrowser
from pathlib import Path

from memprof.errors import MemprofError

DEFAULT_TRACES_DIR = "traces"
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8050


class ServeError(MemprofError):
    """The dashboard cannot listen where it was asked to (the port is taken, the host is unknown)."""


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

    Raises:
        ValueError: ``port`` is not in 1..65535.
        ServeError: nothing can listen on ``host:port`` (another program holds the port, the host is not
            an address of this machine).
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
    check_can_listen(host, int(port))
    app = create_app(traces_dir)
    url = dashboard_url(host, port)
    print(f"memprof dashboard: serving {Path(traces_dir).resolve()} at {url} (Ctrl+C to stop)", flush=True)
    if open_browser:
        threading.Timer(1.0, webbrowser.open, args=(url,)).start()
    app.run(host=host, port=int(port), debug=False)


def check_can_listen(host: str, port: int) -> None:
    """Binds ``host:port`` the way the server will, and lets it go at once.

    The server would otherwise print a few lines and exit the process when the port is taken; this says
    so as a :class:`ServeError` before the app is built. (Another program may still take the port in the
    instant between the check and the server's own bind.)

    Raises:
        ServeError: the address cannot be bound; the message says how to choose another.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET  # as the server chooses it
    try:
        address = socket.getaddrinfo(host, port, family, socket.SOCK_STREAM, socket.IPPROTO_TCP)[0][4]
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # the server sets it too
            probe.bind(address)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            hint = "another program is listening there; choose another port with --port"
        elif exc.errno == errno.EACCES:
            hint = "ports below 1024 need privileges; choose a higher one with --port"
        else:
            hint = "use an address of this machine with --host, e.g. 127.0.0.1"
        raise ServeError(f"cannot serve on {host}:{port}: {exc.strerror or exc}; {hint}") from None
