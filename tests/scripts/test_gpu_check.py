"""``scripts/gpu_check.py`` (``make gpu-check``) on a machine without CUDA: every part that needs no device.

Which Python it picks from what the candidates report (injected: no torch is asked), the one line and exit 0
without CUDA (also end to end, as CI runs it), the JUnit XML it reads, the GPU test files it collects, and
``docs/gpu.md``: the report from sample results, and the not-measured page that is committed until a GPU run.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks.gpu_targets import CATALOGUE, ERROR, FAIL, INFO, PASS, CheckResult
from tests.scripts import ROOT, load_script

gpu_check = load_script("gpu_check")
Probe, Gpu = gpu_check.Probe, gpu_check.Gpu
CPU_VENV = Probe(".venv", "/repo/.venv/bin/python", torch="2.13.0+cpu", cuda_available=False)
NO_TORCH = Probe("python3 on PATH", "/usr/bin/python3", error="no torch")
MISSING = Probe(".venv-gpu", "/repo/.venv-gpu/bin/python", error=gpu_check.MISSING)
CUDA = Probe("python3 on PATH", "/opt/torch/bin/python3", torch="2.11.0+cu130", cuda_build="13.0",
             cuda_available=True, device="NVIDIA H100 80GB HBM3", capability="9.0", version="3.12.3",
             modules=("pytest", "pytest_timeout"))
H100 = Gpu("NVIDIA H100 80GB HBM3", "580.159.04", "81559 MiB")


def _never() -> bool:
    raise AssertionError("the package registry was asked on a machine that must not download anything")


def _only(*probes: Probe):
    """The probes in order, failing if the chooser asks for one more (candidates after a CUDA one are not run)."""
    yield from probes
    raise AssertionError("a candidate after the chosen one was asked")


# --------------------------------------------------------------------------- choosing the Python
def test_without_cuda_or_a_device_it_is_one_line_and_nothing_is_downloaded() -> None:
    choice = gpu_check.choose_python([CPU_VENV, MISSING, NO_TORCH], [], _never)
    assert choice.action == gpu_check.NONE and choice.probe is None
    assert choice.message == ("gpu-check: no CUDA device here (.venv: torch 2.13.0+cpu, cuda_available=False; "
                              "python3 on PATH: no torch; nvidia-smi: no device); nothing to check")
    assert "\n" not in choice.message and ".venv-gpu" not in choice.message  # a missing candidate is not news
    assert gpu_check.choose_python([], [], _never).message.startswith("gpu-check: no CUDA device here (no Python")


def test_the_first_python_whose_torch_sees_cuda_is_chosen_and_later_ones_are_not_asked() -> None:
    later = Probe("python3 on PATH", "/usr/bin/python3", torch="2.13.0", cuda_available=True, device="other")
    choice = gpu_check.choose_python(_only(CPU_VENV, MISSING, CUDA), [H100], _never)
    assert choice.action == gpu_check.USE and choice.probe == CUDA
    assert "/opt/torch/bin/python3" in choice.message and "NVIDIA H100" in choice.message
    # found without nvidia-smi too (containers often lack it), and the earlier candidate wins over a later one
    assert gpu_check.choose_python(_only(CUDA), [], _never).probe == CUDA
    assert gpu_check.choose_python([CUDA, later], [], _never).probe == CUDA


def test_a_device_without_a_cuda_torch_makes_the_gpu_venv_only_when_the_registry_answers() -> None:
    asked = []
    choice = gpu_check.choose_python([CPU_VENV, NO_TORCH], [H100], lambda: asked.append(1) or True)
    assert choice.action == gpu_check.MAKE_VENV and asked == [1]
    assert ".venv-gpu" in choice.message and "NVIDIA H100" in choice.message
    stuck = gpu_check.choose_python([CPU_VENV], [H100], lambda: False)
    assert stuck.action == gpu_check.STUCK
    assert "install a CUDA build of torch" in stuck.message and "make gpu-check" in stuck.message


def test_candidates_come_in_order_without_repeats(tmp_path: Path) -> None:
    labels = [label for label, _ in gpu_check.candidates(tmp_path)]
    assert labels[:2] == [".venv", ".venv-gpu"]
    pythons = [python for _, python in gpu_check.candidates(tmp_path)]
    assert len(pythons) == len(set(pythons))


def test_a_probe_report_is_read_and_a_broken_one_says_what_it_printed() -> None:
    report = ('{"python": "/p", "version": "3.12.3", "modules": ["pytest"], "torch": "2.13.0+cu128", '
              '"cuda_build": "12.8", "cuda_available": true, "device": "NVIDIA H200", "capability": "9.0"}')
    found = gpu_check.parse_probe("x", "/p", "a warning first\n" + report)
    assert found.cuda_available and found.device == "NVIDIA H200" and found.modules == ("pytest",)
    broken = gpu_check.parse_probe("x", "/p", "Segmentation fault")
    assert not broken.cuda_available and "Segmentation fault" in broken.error
    assert gpu_check.probe("x", "/no/such/python").error == gpu_check.MISSING


def test_the_probe_runs_in_a_real_python() -> None:
    found = gpu_check.probe("this", sys.executable)
    assert found.torch == torch.__version__ and found.cuda_available == torch.cuda.is_available()
    assert "pytest" in found.modules and not found.error


def test_nvidia_smi_lines_are_parsed() -> None:
    text = "NVIDIA H100 80GB HBM3, 580.159.04, 81559 MiB\nNVIDIA H200, 580.159.03, 143771 MiB\n"
    assert gpu_check.parse_nvidia_smi(text) == [H100, Gpu("NVIDIA H200", "580.159.03", "143771 MiB")]
    assert gpu_check.parse_nvidia_smi("") == []
    assert gpu_check.parse_nvidia_smi("No devices were found\n") == []


# --------------------------------------------------------------------------- the GPU tests
JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" errors="1" failures="1"
skipped="1" tests="5" time="3.2"><testcase classname="tests.memprof.test_profiler"
name="test_cuda_allocated_bytes_are_the_caching_allocators" time="1.250" /><testcase
classname="tests.planner.model.test_transfer" name="test_measuring_on_cuda_gives_a_plausible_link" time="0.5"><failure
message="AssertionError: assert 3.1 &lt; 2">long traceback</failure></testcase><testcase
classname="tests.memprof.estimation.test_cuda" name="test_the_cuda_estimate[gpt2]" time="0.01"><skipped
type="pytest.skip" message="needs a CUDA device (run on a GPU machine)">skip</skipped></testcase><testcase
classname="" name="tests.planner.executor.test_weights" time="0"><error message="collection failure">ImportError
</error></testcase><testcase classname="tests.memprof.test_failure" name="test_oom" time="2"><failure
message="boom" /><error message="failed on teardown with &quot;RuntimeError&quot;" /></testcase></testsuite>
</testsuites>"""


def test_the_junit_report_gives_each_tests_outcome() -> None:
    results = gpu_check.parse_junit(JUNIT)
    assert [(r.name, r.outcome) for r in results] == [
        ("tests.memprof.test_profiler::test_cuda_allocated_bytes_are_the_caching_allocators", "passed"),
        ("tests.planner.model.test_transfer::test_measuring_on_cuda_gives_a_plausible_link", "failed"),
        ("tests.memprof.estimation.test_cuda::test_the_cuda_estimate[gpt2]", "skipped"),
        ("tests.planner.executor.test_weights", "error"),
        ("tests.memprof.test_failure::test_oom", "error"),
    ]
    assert results[0].seconds == 1.25 and results[1].message == "AssertionError: assert 3.1 < 2"
    assert results[4].message == 'failed on teardown with "RuntimeError"'
    run = gpu_check.GpuTests(results, returncode=1)
    assert not run.ok and run.counts() == "1 passed, 1 failed, 2 error, 1 skipped"
    assert gpu_check.GpuTests([results[0], results[2]], returncode=0).ok
    assert not gpu_check.GpuTests([results[0]], returncode=None).ok  # killed at the limit


def test_every_file_with_gpu_tests_is_collected() -> None:
    files = gpu_check.gpu_test_files(ROOT)
    assert {"tests/memprof/estimation/test_cuda.py", "tests/memprof/capture/test_oom_snapshot.py",
            "tests/memprof/test_profiler.py", "tests/planner/executor/test_offload.py",
            "tests/planner/executor/test_weights.py", "tests/planner/model/test_transfer.py"} <= set(files)
    assert all("mark.gpu" in (ROOT / f).read_text(encoding="utf-8") for f in files)
    assert "tests/scripts/test_mutants.py" not in files and "tests/scripts/test_gpu_check.py" not in files


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the test would run, not skip")
def test_without_cuda_the_gpu_tests_skip_cleanly_and_the_report_says_so(tmp_path: Path) -> None:
    run = gpu_check.run_gpu_tests(sys.executable, ROOT, ["tests/planner/model/test_transfer.py"], tmp_path, 120, None)
    assert run.returncode == 0 and run.ok, run.note
    assert [r.outcome for r in run.results] == ["skipped"]
    assert run.results[0].name.endswith("test_measuring_on_cuda_gives_a_plausible_link")
    assert "needs a CUDA device" in run.results[0].message


# --------------------------------------------------------------------------- docs/gpu.md
def _sample() -> tuple:
    checks = [
        CheckResult("estimate.allocated", "estimate vs allocated", "9.1 GiB", "9.0 GiB", "+0.42%", "within 1%", PASS),
        CheckResult("plan.rotor.peak", "rotor peak", "5.0 GiB", "4.5 GiB", "+11.11%", "within 5% + 1 MiB", FAIL,
                    "budget 4.6 GiB"),
        CheckResult("plan.rotor.time", "rotor time", "120.0 ms", "100.0 ms", "+20.00%", "reported", INFO),
        CheckResult("snapshot", "the snapshot check", status=ERROR, note="OutOfMemoryError: a | b"),
    ]
    tests = gpu_check.GpuTests(gpu_check.parse_junit(JUNIT)[:3], returncode=1, seconds=40.0)
    bench = gpu_check.BenchRun(checks, returncode=0, seconds=170.0)
    return gpu_check.machine(CUDA, [H100]), tests, bench


def test_the_report_has_the_machine_every_check_and_every_test() -> None:
    machine, tests, bench = _sample()
    command = gpu_check.invocation(["--torch-spec", "torch==2.13.0", "--artifacts", "/tmp/out dir"], by_make=True)
    assert command == ("`python3 scripts/gpu_check.py --torch-spec torch==2.13.0 --artifacts '/tmp/out dir'`, run by "
                       "`make gpu-check`")
    assert gpu_check.invocation([], by_make=False) == "`python3 scripts/gpu_check.py`"
    text = gpu_check.render_report(machine, "2026-12-01 10:00 UTC", command, tests, bench, 230.0)
    assert text.startswith("# GPU check\n\n- Measured: 2026-12-01 10:00 UTC\n")
    assert "NVIDIA H100 80GB HBM3 (compute capability 9.0), 81559 MiB; driver 580.159.04" in text
    assert "CUDA 13.0 (torch's build); torch 2.11.0+cu130; Python 3.12.3" in text
    assert f"- Command: {command} (230 s in all: GPU tests 40 s, benchmark 170 s)\n" in text
    assert "1 pass, 1 fail, 1 info, 1 error." in text
    assert ("| `estimate.allocated` | estimate vs allocated | 9.1 GiB | 9.0 GiB | +0.42% | within 1% | **pass** |  |"
            in text)
    assert "| **fail** | budget 4.6 GiB |" in text
    assert "OutOfMemoryError: a \\| b" in text  # a pipe in a note does not break the table
    assert "1 passed, 1 failed, 1 skipped." in text
    assert "| `tests.planner.model.test_transfer::test_measuring_on_cuda_gives_a_plausible_link` | failed | 0.50 |" in text
    assert "Not measured" not in text
    assert all(f"`{target.check}`" in text for target in CATALOGUE)


def test_a_killed_benchmark_and_a_missing_junit_report_are_said() -> None:
    machine, _, _ = _sample()
    tests = gpu_check.GpuTests([], returncode=None, seconds=150.0, note="killed at the 150 s limit")
    bench = gpu_check.BenchRun([], returncode=None, seconds=240.0, note="killed at the 240 s limit")
    text = gpu_check.render_report(machine, "d", "`x`", tests, bench, 400.0)
    assert "no results. killed at the 240 s limit." in text and "No check finished." in text
    assert "no tests. killed at the 150 s limit." in text


def test_the_committed_page_is_the_not_measured_one_until_a_gpu_run_replaces_it() -> None:
    committed = (ROOT / "docs" / "gpu.md").read_text(encoding="utf-8")
    if gpu_check.MEASURED_MARK in committed:  # written by a run on a GPU: a report, not the placeholder
        assert "## Checks (`benchmarks/bench_gpu.py`)" in committed and "## GPU tests" in committed
        return
    assert committed == gpu_check.render_not_measured()
    assert "have NOT been run on a GPU" in committed and "make gpu-check" in committed
    assert all(f"`{target.check}`" in committed for target in CATALOGUE)


def test_the_placeholder_option_writes_the_page(tmp_path: Path) -> None:
    assert gpu_check.main(["--placeholder", "--docs", str(tmp_path / "gpu.md")]) == 0
    assert (tmp_path / "gpu.md").read_text(encoding="utf-8") == gpu_check.render_not_measured()
    assert [p.name for p in tmp_path.iterdir()] == ["gpu.md"]  # atomic: no temporary file left


# --------------------------------------------------------------------------- end to end, as CI runs it
@pytest.mark.skipif(torch.cuda.is_available(), reason="asserts the answer of a machine without CUDA")
def test_on_this_cpu_machine_the_command_prints_one_line_and_exits_0() -> None:
    docs_before = (ROOT / "docs" / "gpu.md").read_bytes()
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_check.py")], capture_output=True, text=True,
                          timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpu-check: no CUDA device here (")
    assert lines[0].endswith("nvidia-smi: no device); nothing to check") and "cuda_available=False" in lines[0]
    assert done.stderr == ""
    assert (ROOT / "docs" / "gpu.md").read_bytes() == docs_before
    assert not (ROOT / ".venv-gpu").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU smoke arguments")
def test_the_benchmark_subprocess_leaves_its_results_as_json_lines(tmp_path: Path, monkeypatch) -> None:
    # The checks that need CUDA answer "skipped" at once: the run's plumbing without its minutes.
    monkeypatch.setattr(gpu_check, "BENCH_ARGS", ["--device", "cpu", "--size", "tiny", "--only", "estimate", "link"])
    run = gpu_check.run_benchmark(sys.executable, ROOT, tmp_path, 120)
    assert run.returncode == 0 and run.ok and not run.note
    assert [r.check for r in run.results] == ["estimate.allocated", "estimate.reserved", "transfer.d2h",
                                              "transfer.h2d"]
    assert {r.status for r in run.results} == {"skipped"}
