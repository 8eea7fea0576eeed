"""Dashboard responsiveness: the budget slider's server time and the first render of a huge timeline.

Run ``python -m benchmarks.bench_dashboard [--stages 100] [--events 1000000] [--moves 40]``.

- Slider: a synthetic run whose chain has ``--stages`` stages; the Pareto front is solved once when
  the chain is opened (reported apart), then the slider callback is timed at ``--moves`` budgets
  from the minimum feasible budget to store-all, both as the callback body and as the whole HTTP
  request through the Dash server (JSON encoding included). Target: at most 150 ms.
- Timeline: a synthetic run whose one iteration has ``--events`` events; first render is timed from
  a cold cache (reading the Parquet columns, min/max downsampling, building the figure and encoding
  it as the server sends it); a zoom (re-bucketing on the warm cache) is timed too. Target: 3 s.

Results are printed and written to ``benchmarks/results/dashboard.md``.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import plotly.io

from dashboard import ids
from dashboard.app import create_app
from dashboard.callbacks import timeline_view, zoom_state
from dashboard.callbacks_planner import AUTO, planner_bounds, planner_view
from dashboard.data import TraceStore
from tests.dashboard.fixtures import write_big_events, write_chain_run

RESULTS_PATH = Path(__file__).parent / "results" / "dashboard.md"
SLIDER_TARGET_MS = 150.0
TIMELINE_TARGET_S = 3.0


def _timed(fn: Callable[[], object]) -> tuple[float, object]:
    start = time.perf_counter()
    value = fn()
    return time.perf_counter() - start, value


def _payload(outputs: list[tuple[str, str]], inputs: list[tuple[str, str, object]], changed: str) -> dict:
    """The body of a ``/_dash-update-component`` request, as the Dash renderer sends it."""
    return {
        "output": ".." + "...".join(f"{i}.{p}" for i, p in outputs) + "..",
        "outputs": [{"id": i, "property": p} for i, p in outputs],
        "inputs": [{"id": i, "property": p, "value": v} for i, p, v in inputs],
        "changedPropIds": [changed],
        "state": [],
    }


SLIDER_OUTPUTS = [(ids.PLANNER_BUDGET_TEXT, "children"), (ids.PLANNER_PEAK, "children"),
                  (ids.PLANNER_MAKESPAN, "children"), (ids.PLANNER_SCHEDULE_TEXT, "children"),
                  (ids.PLANNER_SCHEDULE_GRAPH, "figure"),
                  (ids.PLANNER_PARETO_GRAPH, "figure"), (ids.PLANNER_CHOICE, "data")]
TIMELINE_OUTPUTS = [(ids.TIMELINE_GRAPH, "figure"), (ids.TIMELINE_INFO, "children")]


def bench_slider(root: Path, stages: int, moves: int) -> dict[str, float]:
    """Times the slider callback on a chain of ``stages`` stages."""
    write_chain_run(root / "deep", stages)
    app = create_app(root)
    store = TraceStore(root)
    open_s, bounds = _timed(lambda: planner_bounds(store, ["deep"], AUTO))
    low, high = bounds[0], bounds[1]
    budgets = np.linspace(low, high, moves)
    body_ms = [1e3 * _timed(lambda b=b: planner_view(store, ["deep"], AUTO, float(b)))[0] for b in budgets]
    client = app.server.test_client()
    client.get("/")

    def request(budget: float) -> None:
        body = _payload(SLIDER_OUTPUTS, [(ids.PLANNER_BUDGET, "value", budget), (ids.SELECTED_RUNS, "data", ["deep"]),
                                         (ids.PLANNER_CONTAINER, "value", AUTO)], f"{ids.PLANNER_BUDGET}.value")
        response = client.post("/_dash-update-component", json=body)
        if response.status_code != 200:
            raise RuntimeError(f"slider request failed with {response.status_code}: {response.get_data(as_text=True)}")

    request(float(budgets[0]))  # the server's own cache: the one DP solve happens here
    http_ms = [1e3 * _timed(lambda b=b: request(float(b)))[0] for b in budgets]
    return {"stages": stages, "moves": moves, "open_s": open_s,
            "body_median_ms": statistics.median(body_ms), "body_max_ms": max(body_ms),
            "http_median_ms": statistics.median(http_ms), "http_max_ms": max(http_ms)}


def bench_timeline(root: Path, events: int) -> dict[str, float]:
    """Times the first render of a timeline of ``events`` events, and a zoom."""
    write_big_events(root / "big", events)
    store = TraceStore(root)
    read_s, frame = _timed(lambda: store.timeline("big", 0))
    first_s, (figure, note) = _timed(lambda: timeline_view(store, ["big"], 0))
    encode_s, encoded = _timed(lambda: plotly.io.to_json(figure, validate=False))
    times = frame["time_ms"].to_numpy()
    zoom = zoom_state({"xaxis.range[0]": float(times[len(times) // 3]), "xaxis.range[1]": float(times[len(times) // 2])},
                      ["big"], 0)
    zoom_s, _ = _timed(lambda: timeline_view(store, ["big"], 0, zoom))
    # The whole request on a cold server: read, downsample, build, encode.
    client = create_app(root).server.test_client()
    client.get("/")
    body = _payload(TIMELINE_OUTPUTS, [(ids.SELECTED_RUNS, "data", ["big"]), (ids.TIMELINE_ITERATION, "value", 0),
                                       (ids.TIMELINE_ZOOM, "data", None)], f"{ids.TIMELINE_ITERATION}.value")
    http_s, response = _timed(lambda: client.post("/_dash-update-component", json=body))
    if response.status_code != 200:
        raise RuntimeError(f"timeline request failed with {response.status_code}")
    return {"events": events, "read_s": read_s, "first_render_s": read_s + first_s + encode_s,
            "figure_s": first_s, "encode_s": encode_s, "http_cold_s": http_s, "zoom_s": zoom_s,
            "points": len(figure.data[0].x), "payload_kib": len(encoded) / 1024, "note": note}


def report(slider: dict, timeline: dict) -> str:
    """The results as Markdown."""
    ok = lambda good: "yes" if good else "NO"  # noqa: E731
    lines = [
        "# Dashboard responsiveness",
        "",
        f"Measured {_dt.datetime.now().isoformat(timespec='seconds')} on {platform.machine()} "
        f"({platform.processor() or 'cpu'}), Python {platform.python_version()}; "
        "`python -m benchmarks.bench_dashboard`.",
        "",
        "| measurement | value | target | met |",
        "| --- | --- | --- | --- |",
        f"| slider callback, {slider['stages']}-stage chain, median of {slider['moves']} budgets (body) "
        f"| {slider['body_median_ms']:.1f} ms (max {slider['body_max_ms']:.1f}) | <= {SLIDER_TARGET_MS:.0f} ms "
        f"| {ok(slider['body_max_ms'] <= SLIDER_TARGET_MS)} |",
        f"| slider callback through the Dash server (HTTP, JSON encoding) | {slider['http_median_ms']:.1f} ms "
        f"(max {slider['http_max_ms']:.1f}) | <= {SLIDER_TARGET_MS:.0f} ms | {ok(slider['http_median_ms'] <= SLIDER_TARGET_MS)} |",
        f"| opening the chain (one DP solve + every algorithm's points) | {slider['open_s']:.2f} s | once per run | |",
        f"| timeline first render, {timeline['events']:,} events (read + downsample + figure + encode) "
        f"| {timeline['first_render_s']:.2f} s | <= {TIMELINE_TARGET_S:.0f} s "
        f"| {ok(timeline['first_render_s'] <= TIMELINE_TARGET_S)} |",
        f"| of which: reading the columns | {timeline['read_s']:.2f} s | | |",
        f"| of which: downsampling + figure | {timeline['figure_s']:.2f} s | | |",
        f"| of which: JSON encoding ({timeline['payload_kib']:.0f} KiB, {timeline['points']:,} points per series) "
        f"| {timeline['encode_s']:.2f} s | | |",
        f"| timeline first render through a cold Dash server (HTTP) | {timeline['http_cold_s']:.2f} s "
        f"| <= {TIMELINE_TARGET_S:.0f} s | {ok(timeline['http_cold_s'] <= TIMELINE_TARGET_S)} |",
        f"| timeline zoom (re-bucket the visible range, warm cache) | {1e3 * timeline['zoom_s']:.0f} ms | | |",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stages", type=int, default=100)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--moves", type=int, default=40)
    parser.add_argument("--no-write", action="store_true", help="print only; do not update the results file")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="memprof-bench-") as tmp:
        slider = bench_slider(Path(tmp) / "slider", args.stages, args.moves)
        timeline = bench_timeline(Path(tmp) / "timeline", args.events)
    text = report(slider, timeline)
    print(text)
    print(json.dumps({"slider": slider, "timeline": {k: v for k, v in timeline.items() if k != "note"}}, indent=1))
    if not args.no_write:
        RESULTS_PATH.parent.mkdir(parents=True, exist_ok=True)
        RESULTS_PATH.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
