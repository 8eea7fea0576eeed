"""The real dashboard server driven by headless Chromium: pages, slider, downloads, escaping.

Skipped (with the reason) when Debian's ``chromium`` and ``chromedriver`` or selenium are missing;
``scripts/install_browser.sh`` installs them. Screenshots land in ``test-artifacts/screenshots/``.
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from dashboard import ids
from dashboard.app import create_app
from tests.dashboard.fixtures import HTML_NAME, Traces, make_traces, write_big_events

pytestmark = pytest.mark.browser

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
SCREENSHOTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "screenshots"
FLAGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
         "--disable-background-networking", "--disable-component-update", "--disable-sync", "--no-first-run",
         "--window-size=1400,1100")
WAIT_S = 30

webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (pip install -e '.[test]')")
if not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()):
    pytest.skip(f"chromium ({CHROMIUM}) or chromedriver ({CHROMEDRIVER}) is missing; run scripts/install_browser.sh",
                allow_module_level=True)

from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402


class Server:
    """The dashboard's Flask server on 127.0.0.1 and a free port, in a background thread."""

    def __init__(self, traces_dir: Path) -> None:
        from werkzeug.serving import make_server

        logging.getLogger("werkzeug").setLevel(logging.ERROR)
        self.app = create_app(traces_dir)
        self._server = make_server("127.0.0.1", 0, self.app.server, threaded=True)
        self.url = f"http://127.0.0.1:{self._server.server_port}/"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._thread.join(timeout=10)


BIG_EVENTS = 1_000_000


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> Traces:
    traces = make_traces(tmp_path_factory.mktemp("browser") / "traces")
    write_big_events(traces.root / "big", BIG_EVENTS)
    _write_gpt2_with_ops(traces.root / OPTIONS_RUN)
    return traces


OPTIONS_RUN = "gpt2-ops"


def _write_gpt2_with_ops(run_dir: Path) -> None:
    """A small GPT-2 profiled with a planning pass (its blocks get recomputation options), and torch.compile
    points stored beside it as ``memprof profile-ops --compile-baseline`` stores them."""
    import torch

    from memprof import MemoryProfiler, load_trace
    from planner.measure.compile_baseline import CompilePoint, write_compile_points
    from tests.planner.real_models import gpt2

    real = gpt2()
    optimizer = torch.optim.SGD(real.model.parameters(), lr=1e-3)
    with tempfile.TemporaryDirectory() as tmp:
        with MemoryProfiler(real.model, optimizer, out_dir=Path(tmp), print_period=0, background=False,
                            ops=True) as prof:
            for _ in range(3):
                optimizer.zero_grad(set_to_none=True)
                real.loss(real.model, real.make_batch(4)).backward()
                optimizer.step()
                prof.record_stats()
        shutil.copytree(prof.run_dir, run_dir)
    # the view shows options in use: priced at their measured dispatch, this tiny GPT-2's blocks would use none
    meta = json.loads((run_dir / "meta.json").read_text())
    (run_dir / "meta.json").write_text(json.dumps({**meta, "selective_overhead_us_per_op": 0.0}))
    peak = int(load_trace(run_dir).iterations.peak_allocated_bytes.max())
    write_compile_points(run_dir, [CompilePoint(activation_memory_budget=budget, step_peak_bytes=int(peak * (0.6 + budget / 2)),
                                        held_bytes=int(peak * budget / 2), flops=10**9, step_ms=20.0)
                           for budget in (1.0, 0.5, 0.1)])


@pytest.fixture(scope="module")
def server(traces: Traces) -> Iterator[Server]:
    srv = Server(traces.root)
    yield srv
    srv.close()


@pytest.fixture(scope="module")
def downloads(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("downloads")


@pytest.fixture(scope="module")
def driver(downloads: Path) -> Iterator[webdriver.Chrome]:
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    profile = tempfile.mkdtemp(prefix="memprof-chromium-")
    for flag in (*FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    options.add_experimental_option("prefs", {"download.default_directory": str(downloads),
                                              "download.prompt_for_download": False})
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    chrome = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    chrome.execute_cdp_cmd("Browser.setDownloadBehavior", {"behavior": "allow", "downloadPath": str(downloads)})
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    yield chrome
    chrome.quit()
    shutil.rmtree(profile, ignore_errors=True)


def screenshot(chrome: webdriver.Chrome, name: str) -> None:
    """Saves the whole page (not only the window) as ``test-artifacts/screenshots/<name>.png``."""
    width, height = chrome.get_window_size()["width"], chrome.get_window_size()["height"]
    full = int(chrome.execute_script("return document.documentElement.scrollHeight"))
    chrome.set_window_size(width, max(height, full + 40))
    try:
        chrome.save_screenshot(str(SCREENSHOTS / f"{name}.png"))
    finally:
        chrome.set_window_size(width, height)


def wait_for(chrome: webdriver.Chrome, condition: Callable[[], object], what: str,
             timeout_s: float = WAIT_S) -> object:
    """Waits until ``condition()`` is truthy (at most ``timeout_s``); fails naming ``what`` and the console so far."""
    try:
        return WebDriverWait(chrome, timeout_s, poll_frequency=0.1).until(lambda _: condition())
    except Exception as exc:  # selenium's TimeoutException carries no useful message
        shot = SCREENSHOTS / f"FAILED-{'-'.join(what.split())}.png"
        chrome.save_screenshot(str(shot))
        raise AssertionError(f"timed out waiting for {what} (screenshot {shot}); "
                             f"console: {chrome.get_log('browser')}") from exc


def text_of(chrome: webdriver.Chrome, element_id: str) -> str:
    """The text content of an element, also when it is hidden (a closed <details>)."""
    found = chrome.find_elements(By.ID, element_id)
    return (found[0].get_attribute("textContent") or "") if found else ""


def severe(chrome: webdriver.Chrome) -> list[dict]:
    """Browser console entries at SEVERE level since the last call."""
    return [entry for entry in chrome.get_log("browser") if entry["level"] == "SEVERE"]


def open_tab(chrome: webdriver.Chrome, label: str) -> None:
    tab = chrome.find_element(By.XPATH, f"//div[@id='{ids.TABS}']/div[span[text()='{label}']]")
    tab.click()
    wait_for(chrome, lambda: "tab--selected" in (tab.get_attribute("class") or ""), f"tab {label} selected")


def settled(chrome: webdriver.Chrome) -> bool:
    """Whether no Dash callback is running (nothing marked as loading)."""
    return not chrome.find_elements(By.CSS_SELECTOR, "[data-dash-is-loading='true']")


def load(chrome: webdriver.Chrome, url: str) -> None:
    chrome.get(url)
    wait_for(chrome, lambda: chrome.find_elements(By.CSS_SELECTOR, f"#{ids.RUNS_TABLE} tr td"), "the runs table")


PAGES: tuple[tuple[str, str, Callable[[webdriver.Chrome], bool]], ...] = (
    ("Runs", "runs", lambda c: "Showing mlp." in text_of(c, ids.RUNS_SELECTION)),
    ("Overview", "overview", lambda c: text_of(c, ids.OVERVIEW_HEADLINE).startswith("Peak ")
     and c.find_elements(By.CSS_SELECTOR, f"#{ids.OVERVIEW_BREAKDOWN} .main-svg")),
    ("Layers", "layers", lambda c: HTML_NAME in text_of(c, ids.LAYERS_TABLE)
     and c.find_elements(By.CSS_SELECTOR, f"#{ids.LAYERS_TREE} .main-svg")),
    ("Timeline", "timeline", lambda c: "events drawn" in text_of(c, ids.TIMELINE_INFO)
     and c.find_elements(By.CSS_SELECTOR, f"#{ids.TIMELINE_GRAPH} .main-svg")),
    ("Planner", "planner", lambda c: "predicted makespan" in text_of(c, ids.PLANNER_MAKESPAN)
     and "F_" in text_of(c, ids.PLANNER_SCHEDULE_TEXT)),
    ("Export", "export", lambda c: "operations, predicted peak" in text_of(c, ids.EXPORT_SUMMARY)),
)


def test_every_page_loads_without_console_errors(driver, server):
    load(driver, server.url + "?run=mlp")
    for label, shot, ready in PAGES:
        open_tab(driver, label)
        wait_for(driver, lambda ready=ready: ready(driver) and settled(driver), f"the {label} page")
        screenshot(driver, shot)
        assert severe(driver) == [], f"console errors on the {label} page"
    # A module named like an HTML tag is shown as text: no <img> element was created from it.
    assert driver.find_elements(By.CSS_SELECTOR, "img[src='x']") == []


def test_budget_slider_changes_makespan_and_schedule(driver, server):
    load(driver, server.url + "?run=mlp")
    open_tab(driver, "Planner")
    wait_for(driver, lambda: "predicted makespan" in text_of(driver, ids.PLANNER_MAKESPAN) and settled(driver),
             "the first schedule")
    before = (text_of(driver, ids.PLANNER_MAKESPAN), text_of(driver, ids.PLANNER_SCHEDULE_TEXT))
    handle = driver.find_element(By.CSS_SELECTOR, f"#{ids.PLANNER_BUDGET} [role='slider']")
    start = float(handle.get_attribute("aria-valuenow"))
    handle.click()
    # Up to store-all's whole-step peak: the slider starts half-way, below the front's last point, so the
    # schedule must change (half-way down may still be the same optimum: the front has few points).
    for _ in range(60):
        handle.send_keys(Keys.ARROW_RIGHT)
    wait_for(driver, lambda: settled(driver) and text_of(driver, ids.PLANNER_MAKESPAN) != before[0],
             "a new makespan after moving the slider")
    after = (text_of(driver, ids.PLANNER_MAKESPAN), text_of(driver, ids.PLANNER_SCHEDULE_TEXT))
    assert float(handle.get_attribute("aria-valuenow")) > start
    assert after[0] != before[0] and after[1] != before[1]
    assert "for the whole step" in text_of(driver, ids.PLANNER_BUDGET_TEXT)
    assert text_of(driver, ids.PLANNER_PEAK).startswith("predicted step peak ")
    screenshot(driver, "planner-after-slider")
    assert severe(driver) == []


def test_planner_shows_each_blocks_option_and_torch_compiles_points(driver, server):
    load(driver, server.url + f"?run={OPTIONS_RUN}")
    open_tab(driver, "Planner")
    wait_for(driver, lambda: "predicted makespan" in text_of(driver, ids.PLANNER_MAKESPAN) and settled(driver),
             "the first schedule")
    assert "recomputation options" in text_of(driver, ids.PLANNER_MESSAGE)
    handle = driver.find_element(By.CSS_SELECTOR, f"#{ids.PLANNER_BUDGET} [role='slider']")
    handle.click()
    for _ in range(60):  # down to the lowest budget, where the DP gives blocks options
        handle.send_keys(Keys.ARROW_LEFT)
    wait_for(driver, lambda: settled(driver) and "recomputation options:" in text_of(driver, ids.PLANNER_SCHEDULE_TEXT),
             "a schedule whose blocks use recomputation options")
    schedule = driver.find_element(By.ID, ids.PLANNER_SCHEDULE_GRAPH).text
    assert "F_all [" in schedule  # the legend names each option used
    pareto = driver.find_element(By.ID, ids.PLANNER_PARETO_GRAPH).text
    assert "selective" in pareto and "torch.compile" in pareto and "budget 0.5" in pareto
    screenshot(driver, "planner-options")
    assert severe(driver) == []


def _downloaded(folder: Path, suffix: str) -> list[Path]:
    return [p for p in folder.glob(f"*{suffix}") if not p.name.endswith(".crdownload")]


def test_export_downloads_parse(driver, server, downloads):
    from planner.model.schedule import Schedule

    load(driver, server.url + "?run=mlp")
    open_tab(driver, "Planner")
    wait_for(driver, lambda: "F_" in text_of(driver, ids.PLANNER_SCHEDULE_TEXT) and settled(driver), "a schedule")
    shown = text_of(driver, ids.PLANNER_SCHEDULE_TEXT)
    open_tab(driver, "Export")
    wait_for(driver, lambda: "operations" in text_of(driver, ids.EXPORT_SUMMARY), "the export summary")
    driver.find_element(By.ID, ids.EXPORT_JSON_BUTTON).click()
    files = wait_for(driver, lambda: _downloaded(downloads, ".json"), "the JSON download")
    schedule = Schedule.from_json(json.loads(files[0].read_text(encoding="utf-8")))
    assert " ".join(str(op) for op in schedule.ops) == shown
    assert schedule.predicted_makespan_ms is not None
    driver.find_element(By.ID, ids.EXPORT_PY_BUTTON).click()
    scripts = wait_for(driver, lambda: _downloaded(downloads, ".py"), "the Python download")
    source = scripts[0].read_text(encoding="utf-8")
    compile(source, scripts[0].name, "exec")  # a standalone, valid Python file
    assert "torch" in source
    assert severe(driver) == []


def _drawn(chrome: webdriver.Chrome) -> tuple[int, int] | None:
    """``(drawn, total)`` from the timeline's note, e.g. "3,995 of 1,000,000 events drawn"."""
    words = text_of(chrome, ids.TIMELINE_INFO).split()
    if len(words) < 3 or words[1] != "of":
        return None
    return int(words[0].replace(",", "")), int(words[2].replace(",", ""))


def test_million_event_timeline_renders_and_zooms(driver, server):
    load(driver, server.url + "?run=big")
    started = time.perf_counter()
    open_tab(driver, "Timeline")
    wait_for(driver, lambda: _drawn(driver) and driver.find_elements(
        By.CSS_SELECTOR, f"#{ids.TIMELINE_GRAPH} .scatterlayer .trace") and settled(driver), "the 1M-event timeline")
    seconds = time.perf_counter() - started
    drawn, total = _drawn(driver)
    assert total == BIG_EVENTS and drawn <= 4000
    screenshot(driver, "timeline-1M-events")
    # Zoom into a tenth of the iteration: the server re-buckets the visible range only.
    graph = f"document.querySelector('#{ids.TIMELINE_GRAPH} .js-plotly-plot')"
    # Wait for the re-bucketed data itself (the point count alone may be the same before and after).
    def rebucketed() -> bool:
        xs = driver.execute_script(f"return Array.from({graph}._fullData[0].x);")
        return bool(xs) and sum(300 <= x <= 400 for x in xs) >= len(xs) - 2 and settled(driver)

    # A relayout issued while Dash is still applying the first render can be dropped by the page,
    # as a user's first drag sometimes is: zoom again, as a user would, at most three times.
    for _ in range(3):
        driver.execute_script(f"Plotly.relayout({graph}, {{'xaxis.range': [300, 400]}});")
        try:
            WebDriverWait(driver, 10, poll_frequency=0.1).until(lambda _: rebucketed())
            break
        except Exception:  # selenium's TimeoutException: try the zoom again
            continue
    wait_for(driver, rebucketed, "the zoomed timeline")
    zoomed = driver.execute_script(f"return Array.from({graph}._fullData[0].x);")
    inside = [x for x in zoomed if 300 <= x <= 400]
    assert len(zoomed) <= 4000 and len(inside) >= len(zoomed) - 2
    # Before the zoom, the 4,000 points spanned the whole 1,000 ms; now they sit in 100 ms.
    assert len(inside) > drawn * 0.5
    assert severe(driver) == []
    print(f"1M-event timeline: first render in the browser {seconds:.2f} s")


def test_ranks_of_a_distributed_run_are_compared(driver, server):
    load(driver, server.url + "?run=ddp/rank=0")
    open_tab(driver, "Overview")
    box = driver.find_element(By.ID, ids.OVERVIEW_RANKS_BOX)
    wait_for(driver, lambda: box.is_displayed() and "Rank 1 peaks highest" in text_of(driver, ids.OVERVIEW_RANKS_TEXT)
             and driver.find_elements(By.CSS_SELECTOR, f"#{ids.OVERVIEW_RANKS} .main-svg .scatterlayer .trace")
             and settled(driver), "the ranks comparison")
    assert len(driver.find_elements(By.CSS_SELECTOR, f"#{ids.OVERVIEW_RANKS} .scatterlayer .trace")) == 2
    driver.execute_script("arguments[0].scrollIntoView();", box)
    screenshot(driver, "overview-ranks")
    assert severe(driver) == []
    load(driver, server.url + "?run=mlp")  # a single-process run has no ranks section
    open_tab(driver, "Overview")
    wait_for(driver, lambda: text_of(driver, ids.OVERVIEW_HEADLINE).startswith("Peak ") and settled(driver),
             "the overview of mlp")
    assert not driver.find_element(By.ID, ids.OVERVIEW_RANKS_BOX).is_displayed()


def test_traversal_in_the_address_is_refused(driver, server):
    load(driver, server.url + "?run=../../etc")
    wait_for(driver, lambda: "Refused run '../../etc'" in text_of(driver, ids.STATUS), "the refusal")
    assert severe(driver) == []


def test_empty_folder_shows_how_to_start(driver, tmp_path_factory):
    empty = Server(tmp_path_factory.mktemp("empty"))
    try:
        driver.get(empty.url)
        wait_for(driver, lambda: "profiler.record_stats()" in text_of(driver, ids.RUNS_EMPTY), "the help text")
        screenshot(driver, "runs-empty-folder")
        for label, _, _ in PAGES[1:]:
            open_tab(driver, label)
            time.sleep(0.2)
            wait_for(driver, lambda: settled(driver), f"the empty {label} page")
        assert severe(driver) == []
    finally:
        empty.close()
