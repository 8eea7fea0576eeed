"""A new user's run, driven in the browser: a Hugging Face GPT-2 trained with AdamW under ``MemoryProfiler``.

A 4-block ``GPT2LMHeadModel`` built from a config with its defaults (``use_cache=True``), random weights (nothing
downloaded), trained 30 iterations in a plain loop with ``record_stats()`` after each, as the README says; then
the dashboard is served on the run and headless Chromium opens every tab: Runs, Overview, Layers, Timeline (a
click lists the tensors alive), Planner (the slider moved) and Export (the schedule downloaded), each with real
content and no error on the page or in its console. Screenshots go to ``test-artifacts/screenshots/``.

Skipped as ``test_browser.py`` is when chromium, chromedriver or selenium are missing, and without transformers.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from dashboard import ids
from memprof.units import format_bytes
from tests.dashboard import test_browser as tb

transformers = pytest.importorskip("transformers")

# profiling the 30 iterations and opening six tabs take about a minute on the shared 2-core machine
pytestmark = [pytest.mark.browser, pytest.mark.slow]

By = tb.By
RUN = "gpt2-user"
ITERATIONS = 30
BLOCKS = tuple(f"transformer.h.{i}" for i in range(4))
BATCH, SEQ = 4, 64


def _train(traces: Path) -> None:
    """What a new user writes: a model from a config, AdamW, a plain loop, ``record_stats()`` every iteration."""
    import torch

    from memprof import MemoryProfiler

    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=4, n_embd=128, n_head=4, vocab_size=1024, n_positions=128)
    model = transformers.GPT2LMHeadModel(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    profiler = MemoryProfiler(model, optimizer, out_dir=traces, run_id=RUN, print_period=0)
    for _ in range(ITERATIONS):
        tokens = torch.randint(0, config.vocab_size, (BATCH, SEQ))
        loss = model(input_ids=tokens, labels=tokens).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        profiler.record_stats()
    profiler.close()


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The traces folder holding the one profiled run (shared by the module's tests)."""
    root = tmp_path_factory.mktemp("hf-gpt2") / "traces"
    _train(root)
    return root


@pytest.fixture(scope="module")
def server(traces: Path) -> Iterator[tb.Server]:
    srv = tb.Server(traces)
    yield srv
    srv.close()


driver = tb.driver
downloads = tb.downloads


def _ready(chrome, what: str, condition) -> None:  # noqa: ANN001
    # 90 s: under CI's parallel slow suite the GPT-2 run's callbacks once took over the default 30 s to settle
    tb.wait_for(chrome, lambda: condition() and tb.settled(chrome), what, timeout_s=3 * tb.WAIT_S)


def _no_errors(chrome, tab: str) -> None:  # noqa: ANN001
    """Nothing wrong said on the page (the problem line above every tab) nor in the console."""
    assert not chrome.find_element(By.ID, ids.RUN_PROBLEM).is_displayed(), tb.text_of(chrome, ids.RUN_PROBLEM)
    assert tb.text_of(chrome, ids.STATUS) == ""  # the run was found and opened
    assert tb.severe(chrome) == [], f"console errors on the {tab} tab"
    tb.screenshot(chrome, f"hf-gpt2-{tab.lower()}")


def test_runs_and_overview_show_the_30_iterations(driver, server):
    tb.load(driver, server.url + f"?run={RUN}")
    _ready(driver, "the run ticked", lambda: f"Showing {RUN}." in tb.text_of(driver, ids.RUNS_SELECTION))

    def cell(column: str) -> str:
        return driver.find_element(By.CSS_SELECTOR, f"#{ids.RUNS_TABLE} td[data-dash-column='{column}']").text

    assert (cell("model"), cell("state"), cell("iterations")) == ("GPT2LMHeadModel", "closed", str(ITERATIONS))
    _no_errors(driver, "Runs")
    tb.open_tab(driver, "Overview")
    peaks = f"document.querySelector('#{ids.OVERVIEW_PEAKS} .js-plotly-plot')"
    _ready(driver, "the overview", lambda: tb.text_of(driver, ids.OVERVIEW_HEADLINE).startswith("Peak ")
           and driver.execute_script(f"return !!({peaks} && {peaks}._fullData && {peaks}._fullData.length)"))
    assert f" of {ITERATIONS} iterations have detail" in tb.text_of(driver, ids.OVERVIEW_DETAIL) or \
        f"All {ITERATIONS} iterations have detail" in tb.text_of(driver, ids.OVERVIEW_DETAIL)
    xs = driver.execute_script(f"return Array.from({peaks}._fullData[0].x);")
    assert sorted(set(xs)) == list(range(ITERATIONS))  # one point per iteration
    assert re.match(r"Peak [\d.]+ (KiB|MiB) allocated at iteration \d+", tb.text_of(driver, ids.OVERVIEW_HEADLINE))
    _no_errors(driver, "Overview")


def test_layers_list_the_four_transformer_blocks(driver, server):
    tb.load(driver, server.url + f"?run={RUN}")
    tb.open_tab(driver, "Layers")
    _ready(driver, "the layers table", lambda: "transformer" in tb.text_of(driver, ids.LAYERS_TABLE)
           and driver.find_elements(By.CSS_SELECTOR, f"#{ids.LAYERS_TREE} .main-svg"))
    # the table's own filter: the rows of class GPT2Block
    box = driver.find_element(By.CSS_SELECTOR, f"#{ids.LAYERS_TABLE} th.dash-filter[data-dash-column='kind'] input")
    box.send_keys("GPT2Block" + tb.Keys.ENTER)
    cells = f"#{ids.LAYERS_TABLE} td[data-dash-column='module']"
    _ready(driver, "the blocks", lambda: len(driver.find_elements(By.CSS_SELECTOR, cells)) == len(BLOCKS))
    assert sorted(c.text for c in driver.find_elements(By.CSS_SELECTOR, cells)) == list(BLOCKS)
    weights = [c.text for c in driver.find_elements(By.CSS_SELECTOR, f"#{ids.LAYERS_TABLE} td[data-dash-column="
                                                                      "'weight_bytes_text']")]
    # ln_1, attn (c_attn, c_proj), ln_2, mlp (c_fc, c_proj) of n_embd 128, float32: the same in every block
    block = 4 * (2 * 128 + (128 * 384 + 384) + (128 * 128 + 128) + 2 * 128 + (128 * 512 + 512) + (512 * 128 + 128))
    assert weights == [format_bytes(block)] * len(BLOCKS)
    _no_errors(driver, "Layers")


def test_timeline_click_lists_the_tensors_alive(driver, server):
    tb.load(driver, server.url + f"?run={RUN}")
    tb.open_tab(driver, "Timeline")
    graph = f"document.getElementById('{ids.TIMELINE_GRAPH}').querySelector('.js-plotly-plot')"
    _ready(driver, "the timeline", lambda: "events drawn" in tb.text_of(driver, ids.TIMELINE_INFO)
           and driver.execute_script(f"return !!({graph} && {graph}._fullData && {graph}._fullData.length)"))
    driver.execute_script(f"{graph}.scrollIntoView({{block: 'center'}});")
    # a real click at the highest moment (hovermode "x": any height above it picks it)
    dx, dy = driver.execute_script(f"""
        const gd = {graph}; const xs = gd._fullData[0].x; const total = new Array(xs.length).fill(0);
        for (const t of gd._fullData)
            if (t.x && t.x.length === xs.length && t.stackgroup) t.y.forEach((v, i) => total[i] += v);
        let best = 0; for (let i = 1; i < total.length; i++) if (total[i] > total[best]) best = i;
        const xa = gd._fullLayout.xaxis, ya = gd._fullLayout.yaxis, box = gd.getBoundingClientRect();
        return [xa._offset + xa.l2p(xs[best]) - box.width / 2, ya._offset + ya._length / 2 - box.height / 2];""")
    plot = driver.find_element(By.CSS_SELECTOR, f"#{ids.TIMELINE_GRAPH} .js-plotly-plot")
    tb.webdriver.ActionChains(driver).move_to_element_with_offset(plot, int(dx), int(dy)).pause(0.3).click().perform()
    _ready(driver, "the tensors list",
           lambda: re.match(r"\d+ tensors alive at", tb.text_of(driver, ids.TIMELINE_TENSORS_NOTE)))
    cells = [c.text for c in driver.find_elements(By.CSS_SELECTOR, f"#{ids.TIMELINE_TENSORS} td")]
    assert "weights" in cells and "optimizer_state" in cells and "feature_maps" in cells
    # the token embedding, 1024 x 128 float32, is alive at every moment
    assert format_bytes(1024 * 128 * 4) in cells
    _no_errors(driver, "Timeline")


def test_planner_shows_the_minimum_budget_and_follows_the_slider(driver, server, traces):
    import planner
    from memprof import load_trace

    chain = planner.chain_from_trace(load_trace(traces / RUN))
    low = planner.min_feasible_budget(chain)
    tb.load(driver, server.url + f"?run={RUN}")
    tb.open_tab(driver, "Planner")
    _ready(driver, "the first schedule", lambda: "predicted makespan" in tb.text_of(driver, ids.PLANNER_MAKESPAN)
           and "F_" in tb.text_of(driver, ids.PLANNER_SCHEDULE_TEXT))
    message = tb.text_of(driver, ids.PLANNER_MESSAGE)
    assert all(block in message for block in BLOCKS), message  # the chain found: the four blocks
    assert f"Budgets from {format_bytes(low)} (the minimum feasible)" in message  # as `memprof plan` says
    assert driver.find_element(By.CSS_SELECTOR, f"#{ids.PLANNER_BUDGET} [role='slider']").get_attribute(
        "aria-valuemin") == str(low)
    rail = driver.find_element(By.ID, ids.PLANNER_BUDGET)

    def drag_to(end: str) -> None:  # a little past the rail's end: its minimum or its maximum
        handle = driver.find_element(By.CSS_SELECTOR, f"#{ids.PLANNER_BUDGET} [role='slider']")
        target = rail.location["x"] - 5 if end == "left" else rail.location["x"] + rail.size["width"] + 5
        tb.webdriver.ActionChains(driver).click_and_hold(handle).move_by_offset(
            int(target - handle.location["x"]), 0).release().perform()

    # the slider starts at selective's optimum, which may be the minimum itself: from the top end first
    drag_to("right")
    _ready(driver, "the schedule at the highest budget",
           lambda: not tb.text_of(driver, ids.PLANNER_BUDGET_TEXT).startswith(f"budget {format_bytes(low)} "))
    before = (tb.text_of(driver, ids.PLANNER_BUDGET_TEXT), tb.text_of(driver, ids.PLANNER_MAKESPAN))
    drag_to("left")
    _ready(driver, "the schedule at the lowest budget",
           lambda: tb.text_of(driver, ids.PLANNER_BUDGET_TEXT) not in ("", before[0]))
    assert tb.text_of(driver, ids.PLANNER_BUDGET_TEXT).startswith(f"budget {format_bytes(low)} for the whole step")
    assert tb.text_of(driver, ids.PLANNER_MAKESPAN) != before[1]  # less memory, more recomputation
    bars = f"document.querySelector('#{ids.PLANNER_SCHEDULE_GRAPH} .js-plotly-plot')._fullData"
    assert driver.execute_script(f"return {bars}.filter(t => t.type === 'bar').length") >= 2
    _no_errors(driver, "Planner")


def test_export_shows_and_downloads_the_schedule(driver, server, downloads):
    from planner.model.schedule import Schedule

    tb.load(driver, server.url + f"?run={RUN}")
    tb.open_tab(driver, "Planner")
    _ready(driver, "a schedule", lambda: "F_" in tb.text_of(driver, ids.PLANNER_SCHEDULE_TEXT))
    shown = tb.text_of(driver, ids.PLANNER_SCHEDULE_TEXT)
    tb.open_tab(driver, "Export")
    _ready(driver, "the export summary", lambda: "operations, predicted peak" in tb.text_of(driver, ids.EXPORT_SUMMARY))
    summary = tb.text_of(driver, ids.EXPORT_SUMMARY)
    assert summary.startswith(f"rotor schedule of run {RUN}") or summary.startswith(f"selective schedule of run {RUN}")
    for old in downloads.glob("*.json"):
        old.unlink()
    driver.find_element(By.ID, ids.EXPORT_JSON_BUTTON).click()
    files = tb.wait_for(driver, lambda: list(downloads.glob("*.json")),
                        "the JSON download")
    schedule = Schedule.from_json(json.loads(files[0].read_text(encoding="utf-8")))
    assert " ".join(str(op) for op in schedule.ops) == shown.split("\n\n")[0]
    # the chain of the four blocks (the last one joined with the final layer norm: "transformer.h.3..transformer.ln_f")
    assert all(any(name.startswith(block) for name in schedule.chain.module_names) for block in BLOCKS)
    _no_errors(driver, "Export")
