"""``make gpu-check``: every GPU test and the GPU benchmark on this machine's CUDA device, written to docs/gpu.md.

Run ``python3 scripts/gpu_check.py`` (what ``make gpu-check`` does) from anywhere; it needs only the standard
library to start. Step by step:

1. Find a Python whose torch sees a CUDA device, asking each candidate in a subprocess (:data:`PROBE`): the
   project's ``.venv``, then ``.venv-gpu`` (made by an earlier run of this script), then the Python running this
   script and ``python3`` on the PATH (GPU machines often ship a CUDA build of torch). If none does and
   ``nvidia-smi`` reports no device, print one line saying so and exit 0: a CPU machine, such as CI, where this
   script runs so it cannot rot. If ``nvidia-smi`` reports a device and the package registry answers, make
   ``.venv-gpu`` with the pinned torch (``torch==2.13.0`` from PyPI is its CUDA build on Linux x86-64) and the
   project (``pip install -e .[test]``); nothing is downloaded anywhere else. With a device and no registry, say
   what to install, exit 1.
2. ``pytest -m gpu`` on the test files that hold GPU tests, with a time limit (and ``pytest-timeout`` per test
   where installed), its JUnit XML read for each test's result.
3. ``python -m benchmarks.bench_gpu``, with a time limit, its results read from the JSON lines it appends.
4. ``docs/gpu.md`` written atomically (``memprof/atomic.py``): device, driver, CUDA, torch, date, the command,
   each check's number and result, each GPU test's result.

Exit status: 0 with no CUDA here, or when every GPU test passed and no check failed; 1 otherwise (the report is
written either way, when the tests or the benchmark ran).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.error
import urllib.request
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # both modules below are standard library only: no environment needed yet

from benchmarks.gpu_targets import (  # noqa: E402
    CATALOGUE,
    ERROR,
    FAIL,
    CheckResult,
    read_results,
    results_table,
    tally,
)
from memprof.atomic import write_atomically  # noqa: E402

DOCS = ROOT / "docs" / "gpu.md"
GPU_VENV = ".venv-gpu"
TORCH_SPEC = "torch==2.13.0"
COMMAND = "make gpu-check"
PREFIX = "gpu-check:"
BENCH_ARGS: list[str] = []  # more arguments of benchmarks/bench_gpu.py (the tests' CPU smoke run sets some)
MEASURED_MARK = "- Measured:"  # the line a report of a real run has and the placeholder has not

USE, MAKE_VENV, NONE, STUCK = "use", "make_venv", "none", "stuck"
MISSING = "not there"  # a candidate that does not exist: left out of the one-line answer

PROBE = r"""
import importlib.util, json, sys
out = {"python": sys.executable, "version": sys.version.split()[0]}
out["modules"] = [m for m in ("pytest", "pytest_timeout", "transformers", "pandas", "pyarrow")
                  if importlib.util.find_spec(m) is not None]
try:
    import torch
except ModuleNotFoundError:
    out["error"] = "no torch"
except Exception as exc:
    out["error"] = f"torch fails to import ({type(exc).__name__}: {exc})"
else:
    out["torch"] = torch.__version__
    out["cuda_build"] = torch.version.cuda
    try:
        out["cuda_available"] = bool(torch.cuda.is_available())
        if out["cuda_available"]:
            out["device"] = torch.cuda.get_device_name(0)
            out["capability"] = ".".join(str(v) for v in torch.cuda.get_device_capability(0))
    except Exception as exc:
        out["error"] = f"CUDA failed ({type(exc).__name__}: {exc})"
print(json.dumps(out))
"""
"""Run by each candidate Python: what its torch is and whether it sees a CUDA device, as one JSON line."""


# --------------------------------------------------------------------------- 1. which Python
@dataclass(frozen=True)
class Probe:
    """What one candidate Python reported (``error`` says why it has no usable torch, if so)."""

    label: str
    python: str
    torch: str | None = None
    cuda_build: str | None = None
    cuda_available: bool = False
    device: str | None = None
    capability: str | None = None
    version: str = ""
    modules: tuple[str, ...] = ()
    error: str = ""

    def describe(self) -> str:
        """This candidate in a few words, for the one-line answer."""
        if self.torch is None:
            return f"{self.label}: {self.error or 'no torch'}"
        return f"{self.label}: torch {self.torch}, cuda_available={self.cuda_available}"


@dataclass(frozen=True)
class Gpu:
    """One device ``nvidia-smi`` lists."""

    name: str
    driver: str
    memory: str


@dataclass(frozen=True)
class Choice:
    """What to do: ``use`` ``python``; ``make_venv`` (then use it); ``none`` (no CUDA: say ``message``, exit 0);
    ``stuck`` (a device but no way to a CUDA torch: say ``message``, exit 1)."""

    action: str
    message: str
    probe: Probe | None = None


def choose_python(probes: Iterable[Probe], gpus: Sequence[Gpu], registry_reachable: Callable[[], bool]) -> Choice:
    """Which Python runs the GPU checks, from what the candidates report; pure, so tests inject the reports.

    Args:
        probes: the candidates' reports in order of preference; consumed lazily, up to the first whose torch sees
            a CUDA device (later candidates are not asked).
        gpus: the devices ``nvidia-smi`` reports (empty: none, or no ``nvidia-smi``).
        registry_reachable: whether the package registry answers; asked only when ``gpus`` is not empty and no
            candidate has CUDA, so a CPU machine never contacts it.

    Returns:
        The first candidate with CUDA (``use``); else, with no device, ``none`` and its one line; else
        ``make_venv`` when the registry answers, ``stuck`` when it does not.
    """
    seen = []
    for found in probes:
        if found.cuda_available:
            return Choice(USE, f"{PREFIX} {found.label} ({found.python}): torch {found.torch}, CUDA "
                               f"{found.cuda_build}, {found.device}", found)
        seen.append(found)
    described = "; ".join(p.describe() for p in seen if p.error != MISSING) or "no Python found"
    if not gpus:
        return Choice(NONE, f"{PREFIX} no CUDA device here ({described}; nvidia-smi: no device); nothing to check")
    names = ", ".join(g.name for g in gpus)
    if registry_reachable():
        return Choice(MAKE_VENV, f"{PREFIX} nvidia-smi sees {names} but no torch here has CUDA ({described}); "
                                 f"making {GPU_VENV} with the CUDA build of the pinned torch")
    return Choice(STUCK, f"{PREFIX} nvidia-smi sees {names} but no torch here has CUDA ({described}) and the "
                         f"package registry cannot be reached; install a CUDA build of torch for python3 (or carry "
                         f"its wheels) and run `{COMMAND}` again")


def candidates(root: Path) -> list[tuple[str, str]]:
    """``(label, python)`` in order of preference: the project's venv, the GPU venv, this Python, python3."""
    found = [(".venv", str(root / ".venv" / "bin" / "python")), (GPU_VENV, str(root / GPU_VENV / "bin" / "python")),
             ("this Python", sys.executable)]
    system = shutil.which("python3")
    if system:
        found.append(("python3 on PATH", system))
    unique, seen = [], set()
    for label, python in found:
        key = os.path.abspath(python)  # not realpath: a venv's python links to the same interpreter as the system's
        if key not in seen:
            seen.add(key)
            unique.append((label, python))
    return unique


def parse_probe(label: str, python: str, stdout: str) -> Probe:
    """The :class:`Probe` a candidate's :data:`PROBE` output says (its last line), or one naming what went wrong."""
    lines = stdout.strip().splitlines()
    try:
        raw = json.loads(lines[-1]) if lines else None
    except ValueError:
        raw = None
    if not isinstance(raw, dict):
        return Probe(label, python, error=f"the probe printed no report ({stdout.strip()[-200:]!r})")
    return Probe(label, python, torch=raw.get("torch"), cuda_build=raw.get("cuda_build"),
                 cuda_available=bool(raw.get("cuda_available")), device=raw.get("device"),
                 capability=raw.get("capability"), version=str(raw.get("version", "")),
                 modules=tuple(raw.get("modules", ())), error=str(raw.get("error", "")))


def probe(label: str, python: str, timeout_s: float = 120.0) -> Probe:
    """Asks ``python`` what its torch is (importing torch and starting CUDA can take tens of seconds)."""
    if not Path(python).exists():
        return Probe(label, python, error=MISSING)
    try:
        done = subprocess.run([python, "-c", PROBE], capture_output=True, text=True, timeout=timeout_s,
                              cwd=tempfile.gettempdir())  # not the checkout: its folders must not shadow packages
    except subprocess.TimeoutExpired:
        return Probe(label, python, error=f"no answer in {timeout_s:.0f} s")
    except OSError as exc:
        return Probe(label, python, error=f"cannot run ({exc})")
    return parse_probe(label, python, done.stdout)


def probes(root: Path) -> Iterable[Probe]:
    """Each candidate's report, asked only when the one before had no CUDA."""
    for label, python in candidates(root):
        yield probe(label, python)


def parse_nvidia_smi(text: str) -> list[Gpu]:
    """The devices in ``nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader``."""
    gpus = []
    for line in text.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 3 and parts[0]:
            gpus.append(Gpu(parts[0], parts[1], parts[2]))
    return gpus


def nvidia_smi() -> list[Gpu]:
    """The devices ``nvidia-smi`` reports; none when it is missing or fails."""
    command = shutil.which("nvidia-smi")
    if command is None:
        return []
    try:
        done = subprocess.run([command, "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return parse_nvidia_smi(done.stdout) if done.returncode == 0 else []


def registry_reachable(timeout_s: float = 5.0) -> bool:
    """Whether the package index pip would use answers (``PIP_INDEX_URL``, else PyPI)."""
    url = os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple/")
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=timeout_s):
            return True
    except urllib.error.HTTPError:
        return True  # it answered, if not with a page
    except (urllib.error.URLError, OSError, ValueError):
        return False


def make_venv(root: Path, torch_spec: str) -> str:
    """Creates ``.venv-gpu`` with ``torch_spec`` and the project (``-e .[test]``); returns its Python.

    Raises:
        subprocess.CalledProcessError: a step failed (its output is on the console above).
    """
    venv = root / GPU_VENV
    python = str(venv / "bin" / "python")
    print(f"{PREFIX} creating {venv} ({torch_spec}, then the project): a few minutes", flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    for args in (["--upgrade", "pip"], [torch_spec], ["-e", f"{root}[test]"]):
        subprocess.run([python, "-m", "pip", "install", "-q", *args], check=True, cwd=root)
    return python


# --------------------------------------------------------------------------- 2. the GPU tests
@dataclass(frozen=True)
class CaseResult:
    """One test's outcome from the JUnit XML: ``passed``, ``failed``, ``error`` or ``skipped``."""

    name: str
    outcome: str
    seconds: float
    message: str = ""


@dataclass
class GpuTests:
    """The GPU tests' run: each result, pytest's exit code (``None``: killed at the limit), what else to say."""

    results: list[CaseResult] = field(default_factory=list)
    returncode: int | None = None
    seconds: float = 0.0
    note: str = ""

    @property
    def ok(self) -> bool:
        """Every test passed or was skipped, and pytest finished."""
        return self.returncode in (0, 5) and not any(r.outcome in ("failed", "error") for r in self.results)

    def counts(self) -> str:
        """``12 passed, 1 failed``: the outcomes that occurred."""
        order = ("passed", "failed", "error", "skipped")
        found = {o: sum(1 for r in self.results if r.outcome == o) for o in order}
        return ", ".join(f"{n} {o}" for o, n in found.items() if n) or "no tests"


def gpu_test_files(root: Path) -> list[str]:
    """The test files that hold GPU-marked tests (``@pytest.mark.gpu`` or ``pytestmark = pytest.mark.gpu``),
    relative to ``root``; collecting only these keeps out modules whose extras a GPU machine may lack."""
    pattern = re.compile(r"\bpytest\.mark\.gpu\b")
    return sorted(str(p.relative_to(root)) for p in (root / "tests").rglob("test_*.py")
                  if pattern.search(p.read_text(encoding="utf-8", errors="replace")))


def parse_junit(text: str) -> list[CaseResult]:
    """Each test case of a pytest JUnit XML report (``--junitxml``), in the report's order.

    A case with a ``failure`` is ``failed``; with an ``error`` (a fixture, or a file that failed to collect)
    ``error``, which wins over the others; with ``skipped`` ``skipped``; else ``passed``.

    Raises:
        xml.etree.ElementTree.ParseError: not XML (a report cut short).
    """
    results = []
    for case in ET.fromstring(text).iter("testcase"):
        name = "::".join(part for part in (case.get("classname", ""), case.get("name", "")) if part)
        outcome, message = "passed", ""
        for tag in ("skipped", "failure", "error"):  # the later wins: an error in teardown after a failure
            found = case.find(tag)
            if found is not None:
                outcome = {"skipped": "skipped", "failure": "failed", "error": "error"}[tag]
                message = found.get("message") or (found.text or "").strip()
        results.append(CaseResult(name, outcome, float(case.get("time", 0) or 0), " ".join(message.split())[:300]))
    return results


def _environment(root: Path) -> dict[str, str]:
    """The environment of the children: the checkout importable without being installed, output unbuffered."""
    path = os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1"}


def _run_logged(command: list[str], root: Path, log: Path, timeout_s: float) -> tuple[int | None, float]:
    """Runs ``command`` in ``root`` with its output in ``log``; ``(exit code or None when killed, seconds)``."""
    started = time.perf_counter()
    with open(log, "w", encoding="utf-8") as out:
        child = subprocess.Popen(command, cwd=root, env=_environment(root), stdout=out, stderr=subprocess.STDOUT,
                                 start_new_session=True)  # its own group: killed with its children at the limit
        try:
            code: int | None = child.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
            code = None
    return code, time.perf_counter() - started


def _tail(log: Path, lines: int = 5) -> str:
    text = log.read_text(encoding="utf-8", errors="replace").strip().splitlines() if log.exists() else []
    return " / ".join(text[-lines:])


def run_gpu_tests(python: str, root: Path, files: Sequence[str], work: Path, timeout_s: float,
                  per_test_s: float | None) -> GpuTests:
    """``pytest -m gpu`` on ``files`` within ``timeout_s`` (``per_test_s``: pytest-timeout's limit per test)."""
    if not files:
        return GpuTests(returncode=5, note="no test file holds a GPU-marked test")
    junit, log = work / "gpu-tests.xml", work / "gpu-tests.log"
    command = [python, "-m", "pytest", "-m", "gpu", "-q", "-rA", "-p", "no:cacheprovider",
               "--continue-on-collection-errors", f"--junitxml={junit}", *files]
    if per_test_s is not None:
        command.append(f"--timeout={per_test_s:.0f}")
    code, seconds = _run_logged(command, root, log, timeout_s)
    run = GpuTests(returncode=code, seconds=seconds)
    if code is None:
        run.note = f"killed at the {timeout_s:.0f} s limit: "
    if junit.exists():
        try:
            run.results = parse_junit(junit.read_text(encoding="utf-8"))
        except ET.ParseError as exc:
            run.note += f"the JUnit report is unreadable ({exc}); "
    elif code is not None:
        run.note += "pytest wrote no JUnit report; "
    if not run.results:
        run.note += f"pytest said: {_tail(log)}"
    run.note = run.note.strip().rstrip(";:")
    return run


# --------------------------------------------------------------------------- 3. the benchmark
@dataclass
class BenchRun:
    """The benchmark's results (those it finished), its exit code (``None``: killed), and what else to say."""

    results: list[CheckResult] = field(default_factory=list)
    returncode: int | None = None
    seconds: float = 0.0
    note: str = ""

    @property
    def ok(self) -> bool:
        """It finished and no check failed or raised."""
        return self.returncode == 0 and not any(r.status in (FAIL, ERROR) for r in self.results)


def run_benchmark(python: str, root: Path, work: Path, timeout_s: float) -> BenchRun:
    """``python -m benchmarks.bench_gpu`` within ``timeout_s``; the results it appended, finished or not."""
    results, log = work / "bench-gpu.jsonl", work / "bench-gpu.log"
    results.unlink(missing_ok=True)
    command = [python, "-m", "benchmarks.bench_gpu", "--out", str(results), *BENCH_ARGS]
    code, seconds = _run_logged(command, root, log, timeout_s)
    run = BenchRun(returncode=code, seconds=seconds)
    if results.exists():
        run.results = read_results(results.read_text(encoding="utf-8"))
    if code is None:
        run.note = f"killed at the {timeout_s:.0f} s limit; the checks after the last row did not run"
    elif code != 0:
        run.note = f"exit code {code}: {_tail(log)}"
    return run


# --------------------------------------------------------------------------- 4. docs/gpu.md
@dataclass(frozen=True)
class Machine:
    """What the report says the numbers were measured on."""

    device: str
    driver: str
    memory: str
    cuda: str
    torch: str
    python: str


def machine(chosen: Probe, gpus: Sequence[Gpu]) -> Machine:
    """The device and software of the run, from the chosen Python's report and ``nvidia-smi``'s."""
    gpu = gpus[0] if gpus else Gpu(chosen.device or "unknown", "unknown (no nvidia-smi)", "unknown")
    device = f"{chosen.device or gpu.name} (compute capability {chosen.capability or '?'})"
    return Machine(device, gpu.driver, gpu.memory, f"{chosen.cuda_build} (torch's build)", str(chosen.torch),
                   f"{chosen.version} ({chosen.label}: {chosen.python})")


def _catalogue() -> list[str]:
    lines = ["| check | what | target |", "| --- | --- | --- |"]
    lines += [f"| `{t.check}` | {t.what} | {t.target} |" for t in CATALOGUE]
    return lines


HOW_TO_RUN = (
    f"On a machine with an NVIDIA GPU, from a checkout: `{COMMAND}` (or `python3 scripts/gpu_check.py`; "
    "`--artifacts DIR` keeps the JUnit XML, the benchmark's JSON lines and both logs). Nothing to prepare: it "
    "uses the first Python whose torch sees the device (the project's `.venv`, `.venv-gpu`, then `python3`; GPU "
    "images usually ship one with a CUDA torch) and the checkout without installing it; only when no torch there "
    "has CUDA and the package registry answers does it make `.venv-gpu` with the CUDA build of the pinned torch. "
    "The GPU tests are given 150 s, the benchmark 240 s. On a machine without CUDA it prints one line and exits 0; "
    "CI runs it that way."
)


def _paragraph(text: str) -> str:
    """``text`` wrapped at 110 columns, as the project's Markdown is."""
    return textwrap.fill(text, width=110, break_long_words=False, break_on_hyphens=False)


def render_not_measured() -> str:
    """``docs/gpu.md`` until the first run on a GPU: says plainly that nothing CUDA has been measured."""
    lines = [
        "# GPU check",
        "",
        _paragraph("**Not measured yet.** memprof's CUDA paths have NOT been run on a GPU: no GPU has been lent to "
                   "the project so far. Everything in the other documents was measured on CPUs; what they say of "
                   "CUDA (the caching allocator's numbers, the reserved-memory model behind `estimate`, "
                   "`snapshot_on_oom`, offload on a side stream, weight streaming, the transfer bandwidths) is "
                   "untested on a device. The GPU-marked tests (`grep -rl mark.gpu tests/`) are skipped on every "
                   "run."),
        "",
        _paragraph(f"`{COMMAND}` replaces this page with the numbers of its first run on a GPU. The benchmark is "
                   "sized to take about 3 minutes on an H100 and the whole command under 8, set-up included (an "
                   "estimate: it has not run on one yet)."),
        "",
        "## What it will measure",
        "",
        _paragraph("Every test marked `gpu` (`pytest -m gpu`, each test's result listed here), then "
                   "`benchmarks/bench_gpu.py` on GPT-2 small (random weights from `GPT2Config`, batch 8 x 512, "
                   "fp32, AdamW), each check's number against its target:"),
        "",
        *_catalogue(),
        "",
        "## How to run it",
        "",
        _paragraph(HOW_TO_RUN),
    ]
    return "\n".join(lines) + "\n"


def render_report(machine_: Machine, date: str, command: str, tests: GpuTests, bench: BenchRun,
                  total_seconds: float) -> str:
    """``docs/gpu.md`` after a run: what it ran on, each check's number and result, each GPU test's result
    (``command``: Markdown, as :func:`invocation` gives it)."""
    lines = [
        "# GPU check",
        "",
        f"{MEASURED_MARK} {date}",
        f"- Device: {machine_.device}, {machine_.memory}; driver {machine_.driver}",
        f"- CUDA {machine_.cuda}; torch {machine_.torch}; Python {machine_.python}",
        f"- Command: {command} ({total_seconds:.0f} s in all: GPU tests {tests.seconds:.0f} s, benchmark "
        f"{bench.seconds:.0f} s)",
        "",
        "## Checks (`benchmarks/bench_gpu.py`)",
        "",
        _paragraph(f"{tally(bench.results)}." + (f" {bench.note}." if bench.note else "")),
        "",
        results_table(bench.results) if bench.results else "No check finished.",
        "",
        "## GPU tests (`pytest -m gpu`)",
        "",
        _paragraph(f"{tests.counts()}." + (f" {tests.note}." if tests.note else "")),
        "",
    ]
    if tests.results:
        lines += ["| test | result | seconds | message |", "| --- | --- | ---: | --- |"]
        lines += [f"| `{r.name}` | {r.outcome} | {r.seconds:.2f} | {r.message.replace('|', '/')} |"
                  for r in tests.results]
        lines.append("")
    lines += ["## Targets", "", *_catalogue(), "", "## How to run it", "", _paragraph(HOW_TO_RUN)]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- the command
def invocation(argv: Sequence[str], by_make: bool) -> str:
    """The command as the report shows it (Markdown): this script and its arguments, and whether make ran it."""
    text = f"`{shlex.join(['python3', 'scripts/gpu_check.py', *argv])}`"
    return f"{text}, run by `{COMMAND}`" if by_make else text


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="scripts/gpu_check.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--docs", type=Path, default=DOCS, help="the report to write (default docs/gpu.md)")
    parser.add_argument("--torch-spec", default=TORCH_SPEC, help=f"torch for {GPU_VENV} (default {TORCH_SPEC})")
    parser.add_argument("--tests-timeout", type=float, default=150.0, help="seconds for all GPU tests")
    parser.add_argument("--per-test-timeout", type=float, default=90.0, help="seconds per test (pytest-timeout)")
    parser.add_argument("--bench-timeout", type=float, default=240.0, help="seconds for the benchmark")
    parser.add_argument("--artifacts", type=Path, help="keep the JUnit XML, the results and the logs here")
    parser.add_argument("--placeholder", action="store_true",
                        help="write the not-measured page to --docs and stop (no device needed)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Finds CUDA, runs the GPU tests and the benchmark, writes the report; see the module's docstring."""
    args = parse_args(argv)
    if args.placeholder:
        write_atomically(args.docs, render_not_measured())
        return 0
    started = time.perf_counter()
    gpus = nvidia_smi()
    choice = choose_python(probes(ROOT), gpus, registry_reachable)
    if choice.action == NONE:
        print(choice.message)
        return 0
    if choice.action == STUCK:
        print(choice.message, file=sys.stderr)
        return 1
    print(choice.message, flush=True)
    chosen = choice.probe
    if choice.action == MAKE_VENV:
        chosen = probe(GPU_VENV, make_venv(ROOT, args.torch_spec))
        if not chosen.cuda_available:
            print(f"{PREFIX} {GPU_VENV} was made but its torch sees no CUDA device ({chosen.describe()}); check the "
                  "driver (nvidia-smi) against the CUDA version of the torch build", file=sys.stderr)
            return 1
    assert chosen is not None
    date = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as scratch:
        work = args.artifacts or Path(scratch)
        work.mkdir(parents=True, exist_ok=True)
        files = gpu_test_files(ROOT)
        print(f"{PREFIX} pytest -m gpu on {len(files)} files (at most {args.tests_timeout:.0f} s)", flush=True)
        per_test = args.per_test_timeout if "pytest_timeout" in chosen.modules else None
        tests = run_gpu_tests(chosen.python, ROOT, files, work, args.tests_timeout, per_test)
        print(f"{PREFIX} GPU tests: {tests.counts()} in {tests.seconds:.0f} s {tests.note}".rstrip(), flush=True)
        print(f"{PREFIX} benchmarks/bench_gpu.py (at most {args.bench_timeout:.0f} s)", flush=True)
        bench = run_benchmark(chosen.python, ROOT, work, args.bench_timeout)
        print(f"{PREFIX} benchmark: {tally(bench.results)} in {bench.seconds:.0f} s {bench.note}".rstrip(), flush=True)
    command = invocation(sys.argv[1:] if argv is None else argv, "MAKELEVEL" in os.environ)
    report = render_report(machine(chosen, gpus), date, command, tests, bench, time.perf_counter() - started)
    write_atomically(args.docs, report)
    print(f"{PREFIX} wrote {args.docs}", flush=True)
    return 0 if tests.ok and bench.ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
