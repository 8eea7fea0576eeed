"""Screenshots of every dashboard tab at 1600x1000, for docs/dashboard.md (``make screenshots``).

Usage: ``python scripts/screenshots.py [--traces build/screenshot-traces] [--run NAME] [--out docs/images]``.

The traces folder is filled by ``memprof demo --no-serve`` when it holds no run yet (a few minutes on a CPU:
the demo's models profiled, planned, their schedules executed and measured). The dashboard is served on
127.0.0.1 and a free port, headless Chromium (Debian's ``chromium`` and ``chromedriver``, as the browser tests
use; ``scripts/install_browser.sh``) opens each tab of ``--run`` (default: the first profiled run that has a
measured schedule) and saves the window as ``<out>/dashboard-<tab>.png``.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
WINDOW = (1600, 1000)
TABS: tuple[tuple[str, str], ...] = (("Runs", "runs"), ("Overview", "overview"), ("Layers", "layers"),
                                     ("Timeline", "timeline"), ("Planner", "planner"), ("Export", "export"))
WAIT_S = 60.0


def _wait(condition: Callable[[], object], what: str, timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.1)
    raise TimeoutError(f"timed out waiting for {what}")


def _settled(chrome: Any) -> bool:
    from selenium.webdriver.common.by import By

    return not chrome.find_elements(By.CSS_SELECTOR, "[data-dash-is-loading='true']")


def capture(chrome: Any, url: str, run: str, out_dir: Path) -> list[Path]:
    """Opens every tab of ``run`` on the dashboard at ``url`` and saves each window; returns the files."""
    from selenium.webdriver.common.by import By

    from dashboard import ids

    out_dir.mkdir(parents=True, exist_ok=True)
    chrome.set_window_size(*WINDOW)
    # the page itself 1600x1000 (the window's size would include the browser's own frame)
    chrome.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {"width": WINDOW[0], "height": WINDOW[1],
                                                                  "deviceScaleFactor": 1, "mobile": False})
    chrome.get(f"{url}?run={run}")
    _wait(lambda: chrome.find_elements(By.CSS_SELECTOR, f"#{ids.RUNS_TABLE} tr td"), "the runs table")
    shots = []
    for label, slug in TABS:
        tab = chrome.find_element(By.XPATH, f"//div[@id='{ids.TABS}']/div[span[text()='{label}']]")
        tab.click()
        _wait(lambda: "tab--selected" in (tab.get_attribute("class") or ""), f"the {label} tab")  # noqa: B023
        time.sleep(0.5)  # the tab's callbacks start
        _wait(lambda: _settled(chrome), f"the {label} tab's figures")
        time.sleep(1.0)  # plotly's last redraw
        path = out_dir / f"dashboard-{slug}.png"
        chrome.save_screenshot(str(path))
        shots.append(path)
        if label == "Planner":  # the Pareto figure and the measured runs sit below the fold
            pareto = chrome.find_element(By.ID, ids.PLANNER_PARETO_GRAPH)
            chrome.execute_script("arguments[0].scrollIntoView();", pareto)
            time.sleep(0.5)
            path = out_dir / "dashboard-planner-pareto.png"
            chrome.save_screenshot(str(path))
            shots.append(path)
            chrome.execute_script("window.scrollTo(0, 0);")
    return shots


def _driver() -> Any:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--hide-scrollbars",
                 f"--window-size={WINDOW[0]},{WINDOW[1]}", f"--user-data-dir={tempfile.mkdtemp(prefix='shots-')}"):
        options.add_argument(flag)
    return webdriver.Chrome(service=Service(shutil.which("chromedriver") or "/usr/bin/chromedriver"), options=options)


def default_run(traces: Path) -> str:
    """The first profiled run (by name) with a measured schedule beside it, else the first readable run."""
    from dashboard.data import TraceStore

    store = TraceStore(traces)
    rows = [store.summary(entry) for entry in store.runs()]
    profiled = [r["name"] for r in rows if r["kind"] == "profiled" and not r["error"]]
    measured = {str(r["kind"]).rsplit(" of ", 1)[-1] for r in rows if str(r["kind"]).startswith("measured")}
    with_schedule = [name for name in profiled if any(m in name for m in measured)]
    choices = with_schedule or profiled or [r["name"] for r in rows if not r["error"]]
    if not choices:
        raise SystemExit(f"no readable run in {traces}")
    return sorted(choices)[0]


def main(argv: list[str] | None = None) -> int:
    """Fills the traces folder if needed, serves it and saves one screenshot per tab."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", type=Path, default=ROOT / "build" / "screenshot-traces")
    parser.add_argument("--run", default=None, help="the run to show (default: a profiled run with a measured schedule)")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "images")
    args = parser.parse_args(argv)
    if not args.traces.is_dir() or not any(args.traces.iterdir()):
        subprocess.run([sys.executable, "-m", "cli", "demo", "--no-serve", "--out", str(args.traces)], check=True,
                       cwd=ROOT)
    import logging

    from werkzeug.serving import make_server

    logging.getLogger("werkzeug").setLevel(logging.ERROR)

    from dashboard.app import create_app

    server = make_server("127.0.0.1", 0, create_app(args.traces).server, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    chrome = _driver()
    try:
        run = args.run or default_run(args.traces)
        shots = capture(chrome, f"http://127.0.0.1:{server.server_port}/", run, args.out)
    finally:
        chrome.quit()
        server.shutdown()
    print("\n".join(str(p.relative_to(ROOT) if p.is_relative_to(ROOT) else p) for p in shots))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
