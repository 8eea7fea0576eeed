"""The Dash application: ``create_app(traces_dir)``, fully offline (every asset served locally)."""

from __future__ import annotations

from pathlib import Path

import dash

from dashboard import callbacks, callbacks_planner, callbacks_slider, callbacks_tables
from dashboard.cache import BoundedCache
from dashboard.data import TraceStore
from dashboard.layout import build_layout

ASSETS_DIR = Path(__file__).with_name("assets")


def create_app(traces_dir: str | Path, cache: BoundedCache | None = None) -> dash.Dash:
    """Builds the dashboard for the runs under ``traces_dir``.

    Args:
        traces_dir: the folder of runs (it may be empty or missing: the page then says how to make
            a first trace).
        cache: the bounded cache of read traces and solved fronts; a new one when ``None``.

    Returns:
        The app; ``app.run(host=..., port=...)`` serves it, ``app.server`` is its Flask server.
    """
    store = TraceStore(traces_dir, cache)
    app = dash.Dash(
        __name__,
        title="memprof",
        serve_locally=True,  # no CDN: the dashboard must work without internet
        assets_folder=str(ASSETS_DIR),
        update_title="",  # '' (like None) keeps the tab's title while callbacks run
        external_scripts=[],
        external_stylesheets=[],
    )
    app.layout = build_layout(str(traces_dir))
    callbacks.register(app, store)
    callbacks_planner.register(app, store)
    callbacks_slider.register(app, store)  # the slider's positions drawn in the page
    callbacks_tables.register(app)  # server-side sorting by the numbers behind the binary units
    return app
