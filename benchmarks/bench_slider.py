"""The budget slider in a real browser: from releasing the handle to the planner's figures redrawn.

Run ``python -m benchmarks.bench_slider [--stages 50] [--moves 15] [--verbose]``.

A synthetic run whose chain has ``--stages`` stages (``tests.dashboard.fixtures.write_chain_run``) is served
by the dashboard on 127.0.0.1; headless Chromium (Debian's ``chromium`` and ``chromedriver``, as the browser
tests use) opens its Planner tab, waits until the page has no request in flight (the chain's slider views
loaded, where the page has them), and drags the slider's handle ``--moves`` times to a new position. Each move
is timed in the page from the ``pointerup`` that releases the handle to the last ``plotly_afterplot`` of the
Planner's figures (every figure the slider changes redrawn), and the server's share up to the first answer of
``/_dash-update-component`` ("-" when the page drew the position without a request). Target: 100 ms for a
50-stage chain. The machine, the median and the slowest move are printed.

To compare with an older page, run it from a folder whose ``dashboard`` package is that page's (links to the
rest of the repository beside it): ``python -m`` imports from the current folder first.
"""

from __future__ import annotations

import argparse
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

TARGET_MS = 100.0
#: Records when the handle is released and when each planner figure finishes drawing (page clock, ms).
_PROBE = """
window.__bench = {release: null, plots: [], responses: [], reacts: [], clientside: []};
if (!window.__benchFetch) {
    window.__benchFetch = window.fetch;
    window.fetch = function () {
        return window.__benchFetch.apply(this, arguments).then(r => {
            window.__bench.responses.push(performance.now()); return r; });
    };
}
document.addEventListener('pointerup', () => { window.__bench.release = performance.now(); }, true);
document.addEventListener('mouseup', () => {
    if (window.__bench.release === null) { window.__bench.release = performance.now(); } }, true);
if (!window.__benchReact) {
    window.__benchReact = Plotly.react;
    Plotly.react = function (gd) {
        const t0 = performance.now();
        const out = window.__benchReact.apply(this, arguments);
        const t1 = performance.now();
        const id = gd.parentElement ? gd.parentElement.id : '?';
        Promise.resolve(out).then(() => window.__bench.reacts.push([id, t0, t1, performance.now()]));
        return out;
    };
}
const memprof = (window.dash_clientside || {}).memprof;  // the slider's client-side callback, where the page has it
if (memprof && !memprof.__benchWrapped) {
    const view = memprof.plannerView;
    memprof.plannerView = function () {
        const t0 = performance.now();
        const out = view.apply(this, arguments);
        window.__bench.clientside.push([t0, performance.now()]);
        return out;
    };
    memprof.__benchWrapped = true;
}
for (const id of arguments[0]) {
    const gd = document.querySelector('#' + id + ' .js-plotly-plot');
    if (gd && !gd.__benchHooked) {
        gd.on('plotly_afterplot', () => window.__bench.plots.push([id, performance.now()]));
        gd.__benchHooked = true;
    }
}
"""


#: Counts the page's requests still in flight, so the benchmark starts once the Planner tab has loaded everything
#: it asks for (the chain's slider views, where the page has them).
_IN_FLIGHT = """
if (!window.__inFlightFetch) {
    window.__inFlight = 0;
    window.__inFlightFetch = window.fetch;
    window.fetch = function () {
        window.__inFlight += 1;
        return window.__inFlightFetch.apply(this, arguments).finally(() => { window.__inFlight -= 1; });
    };
}
"""


def _quiet(chrome: Any, seconds: float = 0.5, timeout_s: float = 60.0) -> None:
    """Waits until no request has been in flight for ``seconds``."""
    deadline, since = time.perf_counter() + timeout_s, time.perf_counter()
    while time.perf_counter() < deadline:
        if chrome.execute_script("return window.__inFlight || 0"):
            since = time.perf_counter()
        elif time.perf_counter() - since >= seconds:
            return
        time.sleep(0.05)
    raise TimeoutError("the page kept asking the server")


def _driver(profile: Path | None = None) -> Any:
    """Headless Chromium with its profile in ``profile`` (a new temporary folder when ``None``)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--window-size=1600,1000", f"--user-data-dir={profile or tempfile.mkdtemp(prefix='bench-slider-')}"):
        options.add_argument(flag)
    return webdriver.Chrome(service=Service(shutil.which("chromedriver") or "/usr/bin/chromedriver"), options=options)


def _settled(chrome: Any) -> bool:
    from selenium.webdriver.common.by import By

    return not chrome.find_elements(By.CSS_SELECTOR, "[data-dash-is-loading='true']")


def _wait(chrome: Any, condition: Callable[[], object], timeout_s: float = 30.0) -> None:
    deadline = time.perf_counter() + timeout_s
    while time.perf_counter() < deadline:
        if condition():
            return
        time.sleep(0.01)
    raise TimeoutError("the page did not settle")


def measure(stages: int, moves: int, verbose: bool = False) -> dict[str, Any]:
    """Drags the slider ``moves`` times on a ``stages``-stage chain; returns each move's latency (ms)."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    from dashboard import ids
    from tests.dashboard.fixtures import write_chain_run
    from tests.dashboard.test_browser import Server

    root = Path(tempfile.mkdtemp(prefix="bench-slider-")) / "traces"
    write_chain_run(root / "deep", stages)
    server = Server(root)
    chrome: Any = _driver(root.parent / "chromium")
    # every Planner figure the slider redraws (the page before one time axis had a third, the memory figure)
    candidates = [ids.PLANNER_SCHEDULE_GRAPH, getattr(ids, "PLANNER_TIMELINE_GRAPH", ""), ids.PLANNER_PARETO_GRAPH]
    try:
        chrome.get(server.url + "?run=deep")
        chrome.execute_script(_IN_FLIGHT)
        planner_tab = f"//div[@id='{ids.TABS}']/div[span[text()='Planner']]"
        _wait(chrome, lambda: chrome.find_elements(By.XPATH, planner_tab))  # the page's layout drawn
        tab = chrome.find_element(By.XPATH, planner_tab)
        tab.click()
        _wait(chrome, lambda: "predicted makespan" in chrome.find_element(By.ID, ids.PLANNER_MAKESPAN).text
              and _settled(chrome))
        _quiet(chrome)  # the Planner tab's own requests done (the slider's views, where the page has them)
        time.sleep(1.0)
        graphs = [g for g in candidates if g and chrome.find_elements(By.CSS_SELECTOR, f"#{g} .js-plotly-plot")]
        rail = chrome.find_element(By.CSS_SELECTOR, f"#{ids.PLANNER_BUDGET}")
        width = rail.size["width"]
        latencies, server_ms, missed = [], [], 0
        for move in range(moves):
            handle = chrome.find_element(By.CSS_SELECTOR, f"#{ids.PLANNER_BUDGET} [role='slider']")
            chrome.execute_script(_PROBE, graphs)
            target = (0.1 + 0.8 * ((move * 7) % moves) / max(moves - 1, 1)) * width
            offset = target - (handle.location["x"] - rail.location["x"] + handle.size["width"] / 2)
            ActionChains(chrome).click_and_hold(handle).move_by_offset(int(offset), 0).release().perform()
            try:
                _wait(chrome, lambda: len({p[0] for p in chrome.execute_script(
                    "return window.__bench.plots")}) == len(graphs) and _settled(chrome), timeout_s=10.0)
            except TimeoutError:  # the handle did not move (a drag the page dropped): not a measurement
                missed += 1
                continue
            time.sleep(0.3)  # any late redraw counts too
            bench = chrome.execute_script("return window.__bench")
            latencies.append(max(p[1] for p in bench["plots"]) - bench["release"])
            answered = [t for t in bench["responses"] if t >= bench["release"]]
            if verbose:  # ms after the release: redrawn figures, answers, client-side callback, each Plotly.react
                at = bench["release"]
                print("drawn", [(p[0][8:16], round(p[1] - at)) for p in bench["plots"]],
                      "answers", [round(t - at) for t in answered],
                      "client-side", [(round(c[0] - at), round(c[1] - at)) for c in bench["clientside"]],
                      "react (start, returned, done)", [(r[0][8:16], *(round(t - at) for t in r[1:]))
                                                         for r in bench["reacts"]])
            # no request at all: the page drew the position from the chain's views (assets/planner.js)
            server_ms.append((min(answered) - bench["release"]) if answered else None)
    finally:
        chrome.quit()
        server.close()
        shutil.rmtree(root.parent, ignore_errors=True)  # the run and the browser's profile
    asked = [v for v in server_ms if v is not None]
    return {"stages": stages, "moves": len(latencies), "missed": missed, "latencies_ms": latencies,
            "response_ms": server_ms, "without_request": len(server_ms) - len(asked),
            "median_ms": statistics.median(latencies), "max_ms": max(latencies),
            "response_median_ms": statistics.median(asked) if asked else None}


def main(argv: list[str] | None = None) -> int:
    """Runs the benchmark and prints its table row."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stages", type=int, default=50)
    parser.add_argument("--moves", type=int, default=15)
    parser.add_argument("--verbose", action="store_true", help="print each move's redraws")
    args = parser.parse_args(argv)
    result = measure(args.stages, args.moves, args.verbose)
    print(f"machine: {platform.machine()} {platform.processor() or 'cpu'}, Python {platform.python_version()}")
    print("latencies (ms): " + ", ".join(f"{v:.0f}" for v in result["latencies_ms"]))
    print("of which the server's answer (ms; '-': drawn in the page without a request): " + ", ".join(
        "-" if v is None else f"{v:.0f}" for v in result["response_ms"]))  # the rest is the browser drawing
    print(f"moves drawn without a request: {result['without_request']} of {result['moves']}")
    met = "yes" if float(result["median_ms"]) <= TARGET_MS else "NO"
    print(f"| slider release to figures redrawn, {args.stages}-stage chain, {result['moves']} moves | "
          f"median {result['median_ms']:.0f} ms (max {result['max_ms']:.0f}) | <= {TARGET_MS:.0f} ms | {met} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
