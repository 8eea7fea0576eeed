"""The dashboard on a 100,000-iteration run against a 100-iteration one: overview, picker, timeline, layers.

Run ``python -m benchmarks.bench_long_dashboard [--iterations 100000] [--every 100] [--short 100]
[--part-iterations 16] [--repeats 5] [--no-browser]``.

Synthetic runs of a 100-module model (:func:`tests.dashboard.long_run.write_long_run`): a long run whose
first 10, every ``--every``-th and one spiking iteration kept their detail (1,010 of 100,000: 100 layers
rows and 404 events each), twice per ``--part-iterations`` (iterations per batch; the worker writes 16): with
the parts merged after each batch, as the writer does (:mod:`memprof.trace.format.compaction`), and left one per batch
and table, the layout before compaction; and a short run of ``--short`` iterations, all detailed (as every
run was before the detail policy). Medians of ``--repeats`` runs of:

- opening: ``load_trace`` (every footer) and reading the summary (the iterations table), on a new store;
- overview, cold: a new store: opening, the headline, both figures, encoded to JSON as Dash sends them;
- overview, warm: the same with the summary cached (what every later visit costs); and a whole request
  to a Dash server that has read the run (HTTP, JSON encoding);
- picker: the detailed iterations' options and the note, encoded;
- timeline and layers of one detailed iteration (a different one each time: nothing cached but the
  opened trace), figure and table encoded; the first detail read of an opened trace is apart (the
  reader lists the written iterations then, once);
- with Chromium (headless): the time from loading the page (``?run=NAME``, a fresh server) until the
  overview's peaks graph is drawn, and from ticking the run again in the Runs table and opening the
  Overview tab (page loaded, the server has the summary) until it is drawn again.

Target (issue 19): the overview of a 100,000-iteration run in at most 2 s; the timeline of one iteration
as fast as on a short run.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import plotly.io

from dashboard import callbacks as cb
from dashboard import ids
from dashboard.app import create_app
from dashboard.cache import BoundedCache
from dashboard.data import TraceStore
from tests.dashboard.long_run import LongRun, write_long_run

OVERVIEW_TARGET_S = 2.0
_OVERVIEW_OUTPUTS = [(ids.OVERVIEW_HEADLINE, "children"), (ids.OVERVIEW_PEAKS, "figure"),
                     (ids.OVERVIEW_BREAKDOWN, "figure")]


def _median_s(fn: Callable[[int], object], repeats: int) -> float:
    """Median seconds of ``fn(i)`` over ``repeats`` calls (``i`` = 0, 1, ...)."""
    times = []
    for i in range(repeats):
        start = time.perf_counter()
        fn(i)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _encode(*figures: Any) -> int:
    """Bytes of the figures as Dash sends them."""
    return sum(len(plotly.io.to_json(f, validate=False)) for f in figures)


def _overview(store: TraceStore, name: str) -> int:
    _, peaks, breakdown = cb.overview_view(store, [name])
    return _encode(peaks, breakdown)


def _layers(store: TraceStore, name: str, iteration: int) -> int:
    rows, tree = cb.layers_view(store, [name], iteration, "weight_bytes")
    return len(json.dumps(rows)) + _encode(tree)


def _request(client: Any, name: str) -> None:
    body = {"output": ".." + "...".join(f"{i}.{p}" for i, p in _OVERVIEW_OUTPUTS) + "..",
            "outputs": [{"id": i, "property": p} for i, p in _OVERVIEW_OUTPUTS],
            "inputs": [{"id": ids.SELECTED_RUNS, "property": "data", "value": [name]}],
            "changedPropIds": [f"{ids.SELECTED_RUNS}.data"], "state": []}
    response = client.post("/_dash-update-component", json=body)
    if response.status_code != 200:
        raise RuntimeError(f"overview request failed with {response.status_code}")


def bench_run(root: Path, name: str, run: LongRun, repeats: int, cold_repeats: int) -> dict[str, Any]:
    """Times every view of run ``name``, the only run of the traces folder ``root``."""
    fresh = lambda: TraceStore(root, BoundedCache())  # noqa: E731
    result: dict[str, Any] = {"name": name, "iterations": run.iterations, "detail": len(run.detail),
                              "parts": len(list((root / name).glob("*.parquet/part-*.parquet")))}
    result["open_s"] = _median_s(lambda _: fresh().iterations(name), cold_repeats)
    result["overview_cold_s"] = _median_s(lambda _: _overview(fresh(), name), cold_repeats)
    store = fresh()
    result["payload_kib"] = _overview(store, name) / 1024
    result["overview_warm_s"] = _median_s(lambda _: _overview(store, name), repeats)
    client = create_app(root).server.test_client()
    _request(client, name)  # the server reads the run once
    result["overview_http_s"] = _median_s(lambda _: _request(client, name), repeats)
    _, peaks, breakdown = cb.overview_view(store, [name])
    result["points"] = max(len(t.x) for t in (*peaks.data, *breakdown.data))
    result["picker_s"] = _median_s(lambda _: json.dumps([cb.iteration_options(store, [name]),
                                                         cb.detail_note(store, [name])]), repeats)
    result["options"] = len(cb.iteration_options(store, [name])[0])
    # one detailed iteration after another from the end, none cached; the first read of the opened trace apart
    wanted = list(reversed(run.detail))
    start = time.perf_counter()
    store.timeline(name, wanted[0])
    result["first_detail_s"] = time.perf_counter() - start
    result["timeline_s"] = _median_s(lambda i: _encode(cb.timeline_view(store, [name], wanted[1 + i])[0]), repeats)
    result["layers_s"] = _median_s(lambda i: _layers(store, name, wanted[1 + repeats + i]), repeats)
    return result


def _drawn_script(iterations: int) -> str:
    """JavaScript: whether the overview of a run of ``iterations`` iterations is drawn and nothing is loading."""
    return (f"return !!document.querySelector('#{ids.OVERVIEW_PEAKS} .scatterlayer .trace') && "
            f"document.getElementById('{ids.OVERVIEW_HEADLINE}').textContent.startsWith('Peak ') && "
            f"document.getElementById('{ids.OVERVIEW_DETAIL}').textContent.includes('{iterations:,} iterations') && "
            "!document.querySelector(\"[data-dash-is-loading='true']\");")


def _browse(chrome: Any, url: str, name: str, iterations: int) -> tuple[float, float]:
    """Seconds until the overview is drawn: from loading the page, and from ticking the run again."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    wait = WebDriverWait(chrome, 120, poll_frequency=0.02)
    tab = "//div[@id='" + ids.TABS + "']/div[span[text()='{}']]"
    box = (f"//div[@id='{ids.RUNS_TABLE}']//tr[td[@data-dash-column='name' and normalize-space(.)='{name}']]"
           "/td[contains(@class, 'dash-select-cell')]//input")
    start = time.perf_counter()
    chrome.get(f"{url}?run={name}")
    wait.until(lambda c: c.find_elements(By.XPATH, tab.format("Overview")) and c.find_elements(By.XPATH, box))
    chrome.find_element(By.XPATH, tab.format("Overview")).click()
    wait.until(lambda c: c.execute_script(_drawn_script(iterations)))
    loaded = time.perf_counter() - start
    # the Runs table lives on its own tab: untick the run there, then tick it and open the Overview again
    chrome.find_element(By.XPATH, tab.format("Runs")).click()
    wait.until(lambda c: c.find_elements(By.XPATH, box))
    chrome.find_element(By.XPATH, box).click()
    wait.until(lambda c: "No run chosen." in c.find_element(By.ID, ids.RUNS_SELECTION).text)
    start = time.perf_counter()
    chrome.find_element(By.XPATH, box).click()
    chrome.find_element(By.XPATH, tab.format("Overview")).click()
    wait.until(lambda c: c.execute_script(_drawn_script(iterations)))
    return loaded, time.perf_counter() - start


def bench_browser(roots: dict[str, Path], runs: dict[str, LongRun], repeats: int) -> dict[str, tuple[float, float]] | str:
    """Per run (alone in its traces folder), the medians of :func:`_browse` on a fresh server each time; or why
    they were not measured."""
    chromium, driver_path = shutil.which("chromium"), shutil.which("chromedriver")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        return "selenium is not installed"
    if not chromium or not driver_path:
        return "chromium or chromedriver is missing (scripts/install_browser.sh)"
    from werkzeug.serving import make_server

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    profile = tempfile.mkdtemp(prefix="memprof-chromium-")
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--window-size=1400,1100", f"--user-data-dir={profile}"):
        options.add_argument(flag)
    chrome = webdriver.Chrome(service=Service(driver_path), options=options)
    results: dict[str, tuple[float, float]] = {}
    try:
        for name, run in runs.items():
            times = []
            for _ in range(repeats):
                server = make_server("127.0.0.1", 0, create_app(roots[name]).server, threaded=True)  # cold
                thread = threading.Thread(target=server.serve_forever, daemon=True)
                thread.start()
                try:
                    times.append(_browse(chrome, f"http://127.0.0.1:{server.server_port}/", name, run.iterations))
                finally:
                    server.shutdown()
                    thread.join(timeout=10)
            results[name] = (statistics.median(t[0] for t in times), statistics.median(t[1] for t in times))
    finally:
        chrome.quit()
        shutil.rmtree(profile, ignore_errors=True)
    return results


def report(rows: list[dict[str, Any]], browser: dict[str, tuple[float, float]] | str, repeats: int, cold: int) -> str:
    """The results as a Markdown table, one column per run."""
    ms = lambda s: f"{1e3 * s:.0f} ms" if s < 1 else f"{s:.2f} s"  # noqa: E731
    header = ["measurement", *(f"{r['iterations']:,} it., {r['detail']:,} detailed, {r['parts']:,} files" for r in rows)]
    lines = [f"| {' | '.join(header)} |", "|" + " --- |" * len(header)]

    def line(label: str, cell: Callable[[dict[str, Any]], str]) -> None:
        lines.append(f"| {label} | " + " | ".join(cell(r) for r in rows) + " |")

    line("opening the run: footers + summary (reader)", lambda r: ms(r["open_s"]))
    line(f"overview, cold store (open + figures + JSON); target <= {OVERVIEW_TARGET_S:.0f} s",
         lambda r: ms(r["overview_cold_s"]))
    line("overview, summary cached (figures + JSON)", lambda r: ms(r["overview_warm_s"]))
    line("overview through the Dash server (HTTP, summary cached)", lambda r: ms(r["overview_http_s"]))
    line("overview: most points in a trace; JSON sent", lambda r: f"{r['points']:,}; {r['payload_kib']:.0f} KiB")
    line("iteration picker (options + note, JSON)", lambda r: f"{ms(r['picker_s'])} ({r['options']:,} options)")
    line("first detail read of an opened run (reader lists written iterations)", lambda r: ms(r["first_detail_s"]))
    line("timeline of one detailed iteration (read + figure + JSON)", lambda r: ms(r["timeline_s"]))
    line("layers of one detailed iteration (read + table + treemap JSON)", lambda r: ms(r["layers_s"]))
    if isinstance(browser, dict):
        line("browser: page load until the overview is drawn (cold server)", lambda r: ms(browser[r["name"]][0]))
        line("browser: run ticked again, Overview opened, until drawn", lambda r: ms(browser[r["name"]][1]))
        lines.append("\nA page load includes the page's own start (scripts, layout: about the short run's time) and the "
                     "first callbacks of every tab (runs table, layers, timeline, planner), all on the same cores.")
    else:
        lines.append(f"\nBrowser not measured: {browser}.")
    return "\n".join([f"Medians of {repeats} runs ({cold} of the cold ones and the browser's); "
                      "`python -m benchmarks.bench_long_dashboard`.", "", *lines, ""])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=100_000)
    parser.add_argument("--every", type=int, default=100)
    parser.add_argument("--short", type=int, default=100)
    parser.add_argument("--part-iterations", type=int, nargs="+", default=[16])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-browser", action="store_true")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="memprof-bench-") as tmp:
        # one folder per run: the Runs table (read on page load) then summarises that run only
        layouts = [(f"long-{part}{'' if compact else '-flat'}", part, compact)
                   for part in args.part_iterations for compact in (True, False)]
        roots = {name: Path(tmp) / name for name in ("short", *(name for name, _, _ in layouts))}
        runs = {"short": write_long_run(roots["short"] / "short", args.short, every=1)}
        for name, part, compact in layouts:
            runs[name] = write_long_run(roots[name] / name, args.iterations, args.every, part, compact=compact)
        cold = max(1, min(3, args.repeats))
        rows = [bench_run(roots[name], name, run, args.repeats, cold) for name, run in runs.items()]
        browser = "--no-browser" if args.no_browser else bench_browser(roots, runs, cold)
    print(report(rows, browser, args.repeats, cold))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
