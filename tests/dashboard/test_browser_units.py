"""Headless Chromium on the real page: binary units in tables and hovers, one planner time axis, the slider's value.

Skipped as ``test_browser.py`` is when chromium, chromedriver or selenium are missing.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from dashboard import ids
from memprof.units import format_bytes, parse_bytes
from tests.dashboard import test_browser as tb
from tests.dashboard.fixtures import Traces, make_traces, write_chain_run

pytestmark = pytest.mark.browser

By = tb.By
DEEP = "deep"


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> Traces:
    traces = make_traces(tmp_path_factory.mktemp("units") / "traces")
    write_chain_run(traces.root / DEEP, 50)  # a 50-stage chain, as the slider's benchmark
    return traces


@pytest.fixture(scope="module")
def server(traces: Traces) -> Iterator[tb.Server]:
    srv = tb.Server(traces.root)
    yield srv
    srv.close()


driver = tb.driver
downloads = tb.downloads


def _column(chrome, table: str, column: str) -> list[str]:
    cells = chrome.find_elements(By.CSS_SELECTOR, f"#{table} td[data-dash-column='{column}']")
    return [cell.text for cell in cells]


def _drawn(chrome, graph: str, trace: str) -> bool:
    """Whether plotly has drawn the graph with a trace named ``trace``."""
    return bool(chrome.execute_script(f"const g = {graph}; return !!(g && g._fullData && "
                                      f"g._fullData.some(t => t.name === '{trace}'));"))


def _planner(chrome, url: str) -> None:
    tb.load(chrome, url)
    tb.open_tab(chrome, "Planner")
    tb.wait_for(chrome, lambda: "predicted makespan" in tb.text_of(chrome, ids.PLANNER_MAKESPAN) and tb.settled(chrome),
                "the first schedule")


def test_runs_table_sorts_peaks_by_bytes(driver, server):
    tb.load(driver, server.url + "?run=mlp")
    header = driver.find_element(By.CSS_SELECTOR, f"#{ids.RUNS_TABLE} th[data-dash-column='peak'] .column-header--sort")
    header.click()  # ascending
    def ascending() -> bool:
        peaks = [parse_bytes(p) for p in _column(driver, ids.RUNS_TABLE, "peak") if p.endswith("B")]
        return len(peaks) >= 3 and peaks == sorted(peaks) and tb.settled(driver)
    tb.wait_for(driver, ascending, "the runs sorted by peak")
    peaks = [p for p in _column(driver, ids.RUNS_TABLE, "peak") if p.endswith("B")]
    assert all(p.split()[-1] in ("B", "KiB", "MiB", "GiB") for p in peaks)
    # the ticked run stays ticked after sorting: every tab still shows it
    assert "Showing mlp." in tb.text_of(driver, ids.RUNS_SELECTION)
    assert tb.severe(driver) == []


def test_layers_table_shows_binary_units_never_raw_integers(driver, server):
    tb.load(driver, server.url + "?run=mlp")
    tb.open_tab(driver, "Layers")
    tb.wait_for(driver, lambda: _column(driver, ids.LAYERS_TABLE, "weight_bytes_text") and tb.settled(driver),
                "the layers table")
    headers = [th.text for th in driver.find_elements(By.CSS_SELECTOR, f"#{ids.LAYERS_TABLE} th")]
    assert not any("(B)" in h for h in headers)
    for column in ("weight_bytes_text", "saved_bytes_text", "output_bytes_text"):
        cells = _column(driver, ids.LAYERS_TABLE, column)
        assert cells and all(cell.split()[-1] in ("B", "KiB", "MiB", "GiB") for cell in cells), (column, cells)
    assert tb.severe(driver) == []


def test_timeline_has_one_hover_per_point_with_phase_module_and_total(driver, server):
    tb.load(driver, server.url + "?run=mlp")
    tb.open_tab(driver, "Timeline")
    graph = f"document.querySelector('#{ids.TIMELINE_GRAPH} .js-plotly-plot')"
    tb.wait_for(driver, lambda: "events drawn" in tb.text_of(driver, ids.TIMELINE_INFO) and tb.settled(driver)
                and _drawn(driver, graph, "allocated"), "the timeline")
    total = driver.execute_script(f"return {graph}._fullData.findIndex(t => t.name === 'allocated');")
    driver.execute_script(f"Plotly.Fx.hover({graph}, [{{curveNumber: {total}, pointNumber: 3}}]);")
    labels = driver.execute_script(f"return Array.from({graph}.querySelectorAll('.hoverlayer .hovertext'))"
                                   ".map(e => e.textContent);")
    assert len(labels) == 1, labels  # one label, not one per category
    assert "allocated " in labels[0] and " ms, " in labels[0] and ("KiB" in labels[0] or "MiB" in labels[0])
    title = driver.execute_script(f"return {graph}._fullLayout.yaxis.title.text;")
    assert title.startswith("allocated memory (") and title.endswith("iB)")


def test_planner_schedule_and_memory_share_one_time_axis(driver, server):
    _planner(driver, server.url + f"?run={DEEP}")
    graph = f"document.querySelector('#{ids.PLANNER_SCHEDULE_GRAPH} .js-plotly-plot')"
    tb.wait_for(driver, lambda: _drawn(driver, graph, "B"), "the schedule figure")
    axes = driver.execute_script(f"const g = {graph}; return [g._fullData.map(t => t.xaxis), "
                                 "g._fullData.map(t => t.yaxis), g._fullLayout.yaxis.domain, g._fullLayout.yaxis2.domain];")
    assert set(axes[0]) == {"x"} and set(axes[1]) == {"y", "y2"}  # one x axis; schedule on y, memory on y2
    assert axes[2][0] > axes[3][1]
    bar = driver.execute_script(f"return {graph}._fullData.findIndex(t => t.type === 'bar');")
    driver.execute_script(f"Plotly.Fx.hover({graph}, [{{curveNumber: {bar}, pointNumber: 0}}]);")
    hover = driver.execute_script(f"return {graph}.querySelector('.hoverlayer').textContent;")
    assert "memory: up to " in hover and "while it runs" in hover  # hovering an operation says its memory
    # zooming the x axis moves both rows
    driver.execute_script(f"Plotly.relayout({graph}, {{'xaxis.range': [10, 20]}});")
    assert driver.execute_script(f"return {graph}._fullLayout.xaxis.range;") == [10, 20]
    assert tb.severe(driver) == []


def test_slider_shows_its_value_while_dragging(driver, server):
    _planner(driver, server.url + f"?run={DEEP}")
    handle = driver.find_element(By.CSS_SELECTOR, f"#{ids.PLANNER_BUDGET} [role='slider']")
    tooltip = f"#{ids.PLANNER_BUDGET} .dash-slider-tooltip"
    before = driver.find_element(By.CSS_SELECTOR, tooltip).text
    assert before == format_bytes(float(handle.get_attribute("aria-valuenow")))
    makespan = tb.text_of(driver, ids.PLANNER_MAKESPAN)
    actions = tb.webdriver.ActionChains(driver)
    actions.click_and_hold(handle).move_by_offset(120, 0).perform()
    try:
        during = driver.find_element(By.CSS_SELECTOR, tooltip).text
        assert during != before and during == format_bytes(float(handle.get_attribute("aria-valuenow")))
    finally:
        tb.webdriver.ActionChains(driver).release().perform()
    tb.wait_for(driver, lambda: tb.settled(driver) and tb.text_of(driver, ids.PLANNER_MAKESPAN) != makespan,
                "the figures after the release")
    assert tb.severe(driver) == []


def test_cpu_runs_offload_points_are_marked_as_needing_a_gpu(driver, server):
    _planner(driver, server.url + f"?run={DEEP}")
    names = driver.execute_script(f"return document.querySelector('#{ids.PLANNER_PARETO_GRAPH} .js-plotly-plot')"
                                  "._fullData.map(t => t.name);")
    offload = [n for n in names if n.startswith("offload")]
    assert offload and all(n.endswith("(needs a GPU)") for n in offload)


def test_every_tab_screenshot(driver, server, tmp_path: Path):
    """The screenshot script's own path through the page (scripts/screenshots.py), on the synthetic runs."""
    from tests.scripts import load_script

    screenshots = load_script("screenshots")
    shots = screenshots.capture(driver, server.url, "mlp", tmp_path)
    expected = [f"dashboard-{slug}.png" for _, slug in screenshots.TABS]
    expected.insert(expected.index("dashboard-planner.png") + 1, "dashboard-planner-pareto.png")
    assert [p.name for p in shots] == expected
    assert all(p.stat().st_size > 10_000 for p in shots)
