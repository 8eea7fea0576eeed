"""The dashboard in headless Chromium on runs that went wrong or are still running, and the timeline's drill-down.

A run with a garbage Parquet part, a run killed with SIGKILL, a run whose training process appends
iterations while the page is open (the page must pick them up on its own), and a click on the timeline
listing the tensors alive at that moment. Screenshots land in ``test-artifacts/screenshots/``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dashboard import ids
from dashboard.layout import LIVE_REFRESH_MS
from memprof.trace.parts import table_parts
from tests.dashboard import test_browser as browser
from tests.dashboard.test_browser import (
    Server,
    load,
    open_tab,
    screenshot,
    settled,
    severe,
    text_of,
    wait_for,
)

pytestmark = pytest.mark.browser
# the same headless Chromium as the other browser tests (their module's fixtures)
driver, downloads = browser.driver, browser.downloads

REPO = Path(__file__).resolve().parents[2]
# A training process for the runs below: argv = out_dir run_id iterations seconds_between kill_after
TRAIN = textwrap.dedent("""
    import sys, time
    import torch
    from torch import nn
    from examples import zoo
    from memprof import MemoryProfiler

    out_dir, run_id, steps, pause = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 4))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    profiler = MemoryProfiler(model, optimizer, out_dir=out_dir, run_id=run_id, print_period=0, background=False,
                              detail_first=2, detail_every=1, stack_min_bytes=4096)
    for i in range(steps):
        zoo.train_step(model, optimizer, (torch.randn(32, 64), torch.randint(0, 4, (32,))))
        profiler.record_stats()
        print("done", i, flush=True)
        time.sleep(pause)
    if len(sys.argv) > 5:
        time.sleep(600)  # killed here, never closed
    profiler.close()
""")


def _train(root: Path, run_id: str, steps: int, pause_s: float, hang: bool = False) -> subprocess.Popen:
    script = root.parent / "train.py"
    script.write_text(TRAIN)
    argv = [sys.executable, str(script), str(root), run_id, str(steps), str(pause_s), *(["hang"] if hang else [])]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=REPO)


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``real`` (12 iterations, closed), ``damaged`` (its copy, the first events part garbage) and ``killed``."""
    root = tmp_path_factory.mktemp("health") / "traces"
    root.mkdir()
    _train(root, "real", 12, 0.0).wait(timeout=300)
    shutil.copytree(root / "real", root / "damaged")
    table_parts(root / "damaged", "events")[0].write_bytes(os.urandom(3000))
    killed = _train(root, "killed", 3, 0.0, hang=True)
    for _ in range(3):
        assert killed.stdout.readline().startswith(b"done")
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    return root


@pytest.fixture(scope="module")
def server(root: Path) -> Iterator[Server]:
    srv = Server(root)
    yield srv
    srv.close()


def _row_text(chrome, name: str) -> str:
    for row in chrome.find_elements("css selector", f"#{ids.RUNS_TABLE} tr"):
        cells = row.find_elements("css selector", "td")
        if any(cell.text == name for cell in cells):
            return " | ".join(cell.text for cell in cells)
    return ""


def test_a_run_with_a_garbage_part_opens_with_one_line_on_every_tab(driver, server):
    load(driver, server.url + "?run=damaged")
    wait_for(driver, lambda: "damaged part" in text_of(driver, ids.RUN_PROBLEM), "the problem line")
    line = text_of(driver, ids.RUN_PROBLEM)
    # detail every iteration: the first events part was merged from 8 (0-7), all lost with it
    assert line.startswith("Run damaged: 1 damaged part skipped: lost the timeline of iterations 0-7 ")
    assert line.endswith("; 4 of 12 iterations are intact.")
    assert "/tmp" not in line and "Arrow" not in line and "Error" not in line
    row = _row_text(driver, "damaged")
    assert "| 12 |" in row and "interrupted" not in row  # its iterations are all counted
    for label in ("Overview", "Layers", "Timeline", "Planner", "Export"):
        open_tab(driver, label)
        wait_for(driver, lambda: settled(driver), f"the {label} tab")
        problem = driver.find_element("id", ids.RUN_PROBLEM)
        assert problem.is_displayed() and problem.text == line, label  # the same line, above every tab
        if label == "Overview":
            wait_for(driver, lambda: text_of(driver, ids.OVERVIEW_HEADLINE).startswith("Peak ") and driver.find_elements(
                "css selector", f"#{ids.OVERVIEW_PEAKS} .main-svg") and settled(driver), "the headline and peaks")
            screenshot(driver, "damaged-run-overview")
        if label == "Timeline":
            wait_for(driver, lambda: "events drawn" in text_of(driver, ids.TIMELINE_INFO), "a timeline")
    assert severe(driver) == []


def test_a_killed_run_is_marked_interrupted(driver, server):
    load(driver, server.url + "?run=killed")
    wait_for(driver, lambda: "killed or crashed" in text_of(driver, ids.RUN_PROBLEM), "the interrupted line")
    assert "interrupted" in _row_text(driver, "killed").split(" | ")
    assert "closed" in _row_text(driver, "real").split(" | ")
    assert text_of(driver, ids.RUN_PROBLEM) == ("Run killed: its process ended without closing it (killed or "
                                                "crashed); the 3 iterations it completed are shown.")
    screenshot(driver, "interrupted-run")
    assert severe(driver) == []


def _iterations_shown(chrome) -> int:
    found = re.search(r"All ([\d,]+) iterations have detail", text_of(chrome, ids.OVERVIEW_DETAIL))
    return int(found.group(1).replace(",", "")) if found else 0


def _runs_count(chrome, name: str) -> int:
    """The Runs table's iteration count of run ``name`` (0 while it shows none), read in one script: the table is
    redrawn under the test on every tick."""
    text = chrome.execute_script(f"""
        for (const row of document.querySelectorAll('#{ids.RUNS_TABLE} tr')) {{
            if (![...row.querySelectorAll('td')].some(cell => cell.textContent === arguments[0])) continue;
            const cell = row.querySelector('td[data-dash-column="iterations"]');
            return cell ? cell.textContent : '';
        }}
        return '';""", name)
    text = str(text or "").replace(",", "").strip()
    return int(text) if text.isdigit() else 0


def test_a_live_run_refreshes_on_its_own(driver, server, root):
    live = _train(root, "live", 40, 0.5)
    try:
        assert live.stdout.readline().startswith(b"done")
        load(driver, server.url + "?run=live")
        assert "running" in _row_text(driver, "live").split(" | ")
        listed = wait_for(driver, lambda: _runs_count(driver, "live"), "the live run's count in the Runs table")
        # no reload, no click: the Runs table's row follows the run on the same interval
        wait_for(driver, lambda: _runs_count(driver, "live") >= listed + 3, "the Runs count going up")
        screenshot(driver, "live-run-runs-table")
        open_tab(driver, "Overview")
        wait_for(driver, lambda: _iterations_shown(driver) >= 1, "the live run's first iterations")
        first = _iterations_shown(driver)
        # no reload, no click: the interval reads the new parts
        wait_for(driver, lambda: _iterations_shown(driver) >= first + 3, "iterations appended while the page is open")
        screenshot(driver, "live-run")
    finally:
        live.kill()
        live.wait()
    assert severe(driver) == []


def _append_slower(run_dir: Path, iteration: int, factor: float) -> None:
    """A detailed iteration like iteration 0 whose modules take ``factor`` times as long."""
    import pyarrow as pa

    from memprof import load_trace
    from memprof.schema import LAYERS_SCHEMA
    from memprof.trace.format.writer import TraceWriter
    from tests.dashboard.fixtures import activation_profile, event_rows, iteration_row

    layers = load_trace(run_dir).read("layers", iterations=[0])
    layers = layers.assign(iteration=iteration, forward_ms=layers.forward_ms * factor,
                           backward_ms=layers.backward_ms * factor)
    events = event_rows(iteration, activation_profile(1), start_ns=iteration * 10**9)
    writer = TraceWriter(run_dir)
    writer.append("layers", pa.Table.from_pandas(layers, schema=LAYERS_SCHEMA, preserve_index=False))
    writer.append("events", events)
    writer.append("iterations", [iteration_row(iteration, events)])


def _makespan_ms(chrome) -> float:
    found = re.search(r"predicted makespan ([\d.]+) ms", text_of(chrome, ids.PLANNER_MAKESPAN))
    return float(found.group(1)) if found else 0.0


def test_the_planner_follows_a_live_runs_new_detail(driver, server, root):
    """The Planner tab open on a run still written: its chain is costed again from the new detailed iterations."""
    from memprof.trace.liveness import writer_record
    from tests.dashboard.fixtures import write_chain_run

    run_dir = root / "planned-live"
    write_chain_run(run_dir, stages=6, iterations=2)
    meta_path = run_dir / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta_path.write_text(json.dumps({**meta, "status": "running", "writer": writer_record()}))  # this process
    try:
        load(driver, server.url + "?run=planned-live")
        open_tab(driver, "Planner")
        before = wait_for(driver, lambda: _makespan_ms(driver), "the Planner's makespan")
        for iteration in (2, 3, 4):  # three times slower: the medians of iterations 1-4 are the new times
            _append_slower(run_dir, iteration, 3.0)
        # no reload, no click: the next tick's stamp shows new detail, and the chain is costed again
        after = wait_for(driver, lambda: _makespan_ms(driver) > 2.5 * before and _makespan_ms(driver),
                         "the makespan of the chain costed again")
        assert after == pytest.approx(3 * before, rel=0.01)
        screenshot(driver, "live-run-planner")
    finally:
        meta_path.write_text(json.dumps({**meta, "status": "closed"}))
    assert severe(driver) == []


def _callback_requests(chrome) -> int:
    return int(chrome.execute_script("return performance.getEntriesByType('resource')"
                                     ".filter(e => e.name.includes('_dash-update-component')).length"))


def test_a_finished_run_sends_no_refresh_requests(driver, server):
    load(driver, server.url + "?run=real")
    wait_for(driver, lambda: "Showing real." in text_of(driver, ids.RUNS_SELECTION) and settled(driver), "real")
    time.sleep(1.0)
    before = _callback_requests(driver)
    time.sleep(2.5 * LIVE_REFRESH_MS / 1000)  # two ticks, were the interval on
    assert _callback_requests(driver) == before
    assert not driver.find_element("id", ids.RUN_PROBLEM).is_displayed()


def test_a_click_on_the_timeline_lists_the_tensors_alive_then(driver, server):
    load(driver, server.url + "?run=real")
    open_tab(driver, "Timeline")
    graph = f"document.getElementById('{ids.TIMELINE_GRAPH}').querySelector('.js-plotly-plot')"
    wait_for(driver, lambda: driver.execute_script(f"return {graph} && {graph}._fullData.length > 0"), "the plot")
    # a real mouse click on the highest point of the plot, as offsets from the plot's centre
    driver.execute_script(f"{graph}.scrollIntoView({{block: 'center'}});")
    wait_for(driver, lambda: settled(driver) and "events drawn" in text_of(driver, ids.TIMELINE_INFO), "the timeline")
    # hovermode "x" with no distance limit: a click anywhere above an x picks that moment; take the highest one
    dx, dy = driver.execute_script(f"""
        const gd = {graph}; const xs = gd._fullData[0].x; const total = new Array(xs.length).fill(0);
        for (const t of gd._fullData) if (t.x && t.x.length === xs.length && t.stackgroup) t.y.forEach((v, i) => total[i] += v);
        let best = 0; for (let i = 1; i < total.length; i++) if (total[i] > total[best]) best = i;
        const xa = gd._fullLayout.xaxis, ya = gd._fullLayout.yaxis, box = gd.getBoundingClientRect();
        return [xa._offset + xa.l2p(xs[best]) - box.width / 2, ya._offset + ya._length / 2 - box.height / 2];""")
    from selenium.webdriver.common.action_chains import ActionChains

    plot = driver.find_element("css selector", f"#{ids.TIMELINE_GRAPH} .js-plotly-plot")
    ActionChains(driver).move_to_element_with_offset(plot, int(dx), int(dy)).pause(0.3).click().perform()
    wait_for(driver, lambda: re.match(r"\d+ tensors alive at", text_of(driver, ids.TIMELINE_TENSORS_NOTE)),
             "the tensors list")
    note = text_of(driver, ids.TIMELINE_TENSORS_NOTE)
    cells = wait_for(driver, lambda: [c.text for c in driver.find_elements(
        "css selector", f"#{ids.TIMELINE_TENSORS} td")], "the tensors' rows")
    assert "weights" in cells and "optimizer_state" in cells
    assert any(c.startswith("torch.") for c in cells)  # the call that made an allocation
    assert any(c.endswith("in train_step") for c in cells)  # and, for the large ones, where in the user's code
    sizes = [c for c in cells if re.fullmatch(r"[\d.]+ (B|KiB|MiB)", c)]
    assert sizes and sizes[0] == "64.0 KiB"  # the largest first
    screenshot(driver, "timeline-drilldown")
    assert note.startswith(f"{len(sizes)} tensors alive at") or "not listed" in note
    assert severe(driver) == []
