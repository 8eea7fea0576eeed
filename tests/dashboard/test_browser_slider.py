"""Headless Chromium on the budget slider: once the chain's views are in the page, a release asks the server nothing
and shows what the server shows at that budget.

Skipped as ``test_browser.py`` is when chromium, chromedriver or selenium are missing.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from dashboard import ids
from dashboard.callbacks_planner import AUTO, planner_view
from dashboard.data import TraceStore
from dashboard.planning import planner_model
from dashboard.slider_views import snapped_budget
from tests.dashboard import test_browser as tb
from tests.dashboard.fixtures import Traces, make_traces, write_chain_run

pytestmark = pytest.mark.browser

By = tb.By
DEEP = "deep"
#: Records the outputs every callback request asks the server for, and counts those in flight.
RECORD = """
window.__asked = [];
if (!window.__askedFetch) {
    window.__inFlight = 0;
    window.__askedFetch = window.fetch;
    window.fetch = function (url, init) {
        if (String(url).includes('_dash-update-component') && init && init.body) {
            window.__asked.push(JSON.parse(init.body).output);
        }
        window.__inFlight += 1;
        return window.__askedFetch.apply(this, arguments).finally(() => { window.__inFlight -= 1; });
    };
}
"""


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> Traces:
    traces = make_traces(tmp_path_factory.mktemp("slider") / "traces")
    write_chain_run(traces.root / DEEP, 50)  # as the slider's benchmark
    return traces


@pytest.fixture(scope="module")
def server(traces: Traces) -> Iterator[tb.Server]:
    srv = tb.Server(traces.root)
    yield srv
    srv.close()


driver = tb.driver
downloads = tb.downloads


def _views_loaded(chrome) -> bool:
    """Whether the page holds the chain's views: the views callback was asked and nothing is in flight."""
    return bool(chrome.execute_script("return window.__inFlight === 0"
                                      " && window.__asked.some(o => o.includes('planner-views.data'));")) \
        and tb.settled(chrome)


def _drag(chrome, fraction: float) -> None:
    """Drags the slider's handle to ``fraction`` of its rail and releases it."""
    rail = chrome.find_element(By.ID, ids.PLANNER_BUDGET)
    handle = chrome.find_element(By.CSS_SELECTOR, f"#{ids.PLANNER_BUDGET} [role='slider']")
    chrome.execute_script("arguments[0].scrollIntoView({block: 'center'});", rail)
    offset = rail.location["x"] + fraction * rail.size["width"] - (handle.location["x"] + handle.size["width"] / 2)
    tb.webdriver.ActionChains(chrome).click_and_hold(handle).move_by_offset(int(offset), 0).release().perform()


def test_a_release_is_drawn_in_the_page_as_the_server_draws_it(driver, server, traces):
    tb.load(driver, server.url + f"?run={DEEP}")
    driver.execute_script(RECORD)
    tb.open_tab(driver, "Planner")
    tb.wait_for(driver, lambda: "predicted makespan" in tb.text_of(driver, ids.PLANNER_MAKESPAN) and tb.settled(driver),
                "the first schedule")
    tb.wait_for(driver, lambda: _views_loaded(driver), "the slider's views")
    store = TraceStore(traces.root)
    model = planner_model(store, DEEP, None)
    handle = driver.find_element(By.CSS_SELECTOR, f"#{ids.PLANNER_BUDGET} [role='slider']")
    for fraction in (0.2, 0.55, 0.9):
        before = tb.text_of(driver, ids.PLANNER_BUDGET_TEXT)
        driver.execute_script("window.__asked = [];")
        _drag(driver, fraction)
        tb.wait_for(driver, lambda before=before: tb.text_of(driver, ids.PLANNER_BUDGET_TEXT) != before
                    and tb.settled(driver), "the texts after the release")
        budget = snapped_budget(model, float(handle.get_attribute("aria-valuenow")))
        texts, peak, makespan, ops, _, pareto, choice = planner_view(store, [DEEP], AUTO, budget)
        shown = [tb.text_of(driver, i) for i in (ids.PLANNER_BUDGET_TEXT, ids.PLANNER_PEAK, ids.PLANNER_MAKESPAN,
                                                 ids.PLANNER_SCHEDULE_TEXT)]
        assert shown == [texts, peak, makespan, ops]
        star = driver.execute_script(f"const g = document.querySelector('#{ids.PLANNER_PARETO_GRAPH} "
                                     ".js-plotly-plot'); const a = g.layout.annotations; return [a[a.length - 1].x, "
                                     "a[a.length - 1].y, g.layout.shapes[g.layout.shapes.length - 1].x0];")
        expected = pareto["layout"]["annotations"][-1]
        assert star == [expected["x"], pytest.approx(expected["y"]), budget]
        # nothing asked of the server for the slider (other tabs' callbacks may run, none of the Planner's)
        asked = driver.execute_script("return window.__asked;")
        assert not [o for o in asked if "planner" in o], asked
        assert choice["budget_bytes"] == budget
    # the Export tab downloads the schedule the page shows
    tb.open_tab(driver, "Export")
    tb.wait_for(driver, lambda: "operations" in tb.text_of(driver, ids.EXPORT_SUMMARY), "the export summary")
    assert f"{len(model.front.schedule_at(budget).ops)} operations" in tb.text_of(driver, ids.EXPORT_SUMMARY)
    assert tb.severe(driver) == []
