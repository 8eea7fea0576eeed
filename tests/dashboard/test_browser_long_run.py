"""A 20,000-iteration run in headless Chromium: the overview draws, a detailed iteration's timeline opens.

Skipped, as :mod:`tests.dashboard.test_browser` is, when Chromium, chromedriver or selenium are missing.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dashboard import ids
from dashboard.figures_overview import DETAIL_NAME, OVERVIEW_MAX_POINTS
from tests.dashboard.long_run import LongRun, write_long_run
from tests.dashboard.test_browser import (  # noqa: F401  (driver and downloads are fixtures used here)
    Server,
    downloads,
    driver,
    load,
    open_tab,
    screenshot,
    settled,
    severe,
    text_of,
    wait_for,
)

pytestmark = pytest.mark.browser

ITERATIONS = 20_000
_GRAPH = "document.querySelector('#{} .js-plotly-plot')"


@pytest.fixture(scope="module")
def long_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, LongRun]:
    root = tmp_path_factory.mktemp("browser-long") / "traces"
    return root, write_long_run(root / "long", ITERATIONS, every=100, part_iterations=100)


@pytest.fixture(scope="module")
def server(long_run) -> Iterator[Server]:
    srv = Server(long_run[0])
    yield srv
    srv.close()


def _traces(chrome, graph_id: str) -> list[dict]:
    """Name and point count of each drawn trace of a graph."""
    return chrome.execute_script(f"return {_GRAPH.format(graph_id)}._fullData.map("
                                 "t => ({name: t.name, points: t.x ? t.x.length : 0}));")


def _overview_drawn(chrome) -> bool:
    return (text_of(chrome, ids.OVERVIEW_HEADLINE).startswith("Peak ")
            and f"of {ITERATIONS:,} iterations have detail" in text_of(chrome, ids.OVERVIEW_DETAIL)
            and bool(chrome.find_elements("css selector", f"#{ids.OVERVIEW_PEAKS} .scatterlayer .trace"))
            and bool(chrome.find_elements("css selector", f"#{ids.OVERVIEW_BREAKDOWN} .scatterlayer .trace"))
            and settled(chrome))


def _opened(note: str) -> int | None:
    """The iteration in "... Iteration 5000 is open on the Layers and Timeline tabs."."""
    words = note.split(" is open")[0].split()
    return int(words[-1]) if " is open" in note and words[-1].isdigit() else None


def test_long_run_overview_and_a_detailed_timeline(driver, server, long_run):  # noqa: F811
    run = long_run[1]
    load(driver, server.url + "?run=long")
    started = time.perf_counter()
    open_tab(driver, "Overview")
    wait_for(driver, lambda: _overview_drawn(driver), "the long run's overview")
    seconds = time.perf_counter() - started
    traces = _traces(driver, ids.OVERVIEW_PEAKS)
    assert all(t["points"] <= OVERVIEW_MAX_POINTS for t in traces)
    assert {"name": DETAIL_NAME, "points": len(run.detail)} in traces
    assert all(t["points"] <= OVERVIEW_MAX_POINTS for t in _traces(driver, ids.OVERVIEW_BREAKDOWN))
    screenshot(driver, "overview-long-run")
    open_tab(driver, "Timeline")
    n = run.events_per_iteration
    wait_for(driver, lambda: text_of(driver, ids.TIMELINE_INFO) == f"{n:,} of {n:,} events drawn."
             and driver.find_elements("css selector", f"#{ids.TIMELINE_GRAPH} .scatterlayer .trace")
             and settled(driver), "the timeline of the highest detailed iteration")
    assert f"iteration {run.detailed_spike} (peak " in text_of(driver, ids.TIMELINE_ITERATION)
    assert f"of {ITERATIONS:,} iterations have detail" in text_of(driver, ids.TIMELINE_DETAIL)
    screenshot(driver, "timeline-long-run")
    assert severe(driver) == []
    print(f"{ITERATIONS:,}-iteration overview: drawn in the browser in {seconds:.2f} s")


def test_clicking_the_overview_opens_the_nearest_detailed_iteration(driver, server, long_run):  # noqa: F811
    from selenium.webdriver.common.action_chains import ActionChains

    run = long_run[1]
    load(driver, server.url + "?run=long")
    open_tab(driver, "Overview")
    wait_for(driver, lambda: _overview_drawn(driver), "the long run's overview")
    target = 5_000
    graph = _GRAPH.format(ids.OVERVIEW_PEAKS)
    # the pixel of the detail marker at ``target``, relative to the plot's drag layer
    x, y = driver.execute_script(
        f"const gd = {graph}; const t = gd._fullData.find(t => t.name === arguments[1]);"
        "const i = Array.from(t.x).indexOf(arguments[0]); const l = gd._fullLayout;"
        "return [l.xaxis.l2p(t.x[i]), l.yaxis.l2p(t.y[i])];", target, DETAIL_NAME)
    layer = driver.find_element("css selector", f"#{ids.OVERVIEW_PEAKS} .nsewdrag")
    box = layer.rect
    ActionChains(driver).move_to_element_with_offset(layer, x - box["width"] / 2, y - box["height"] / 2).click().perform()
    # the click lands on whichever point is nearest the pointer (a line's or a marker's): the note names the
    # detailed iteration nearest to it
    opened = wait_for(driver, lambda: _opened(text_of(driver, ids.OVERVIEW_DETAIL)) if settled(driver) else None,
                      "the clicked iteration")
    assert opened in run.detail and abs(opened - target) <= 100
    open_tab(driver, "Layers")
    wait_for(driver, lambda: f"iteration {opened} (peak " in text_of(driver, ids.LAYERS_ITERATION)
             and "blocks.0.attn" in text_of(driver, ids.LAYERS_TABLE) and settled(driver), "the clicked iteration's layers")
    assert severe(driver) == []
