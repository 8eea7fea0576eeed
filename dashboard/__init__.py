"""The dashboard: a Dash app over a folder of traces, and the server that runs it.

Needs the ``dashboard`` extra (``pip install 'memprof[dashboard]'``: Dash and Plotly), which is why its
names load on first use: ``import dashboard`` alone imports neither.
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dashboard.app import create_app
    from dashboard.server import ServeError, serve

_LAZY = {"ServeError": "dashboard.server", "create_app": "dashboard.app", "serve": "dashboard.server"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'dashboard' has no attribute {name!r}")


__all__ = ["ServeError", "create_app", "serve"]
