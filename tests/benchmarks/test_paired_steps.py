"""The profiler benchmark's step pairing: the baseline's steps interleaved one for one with a tool's, on a thread
of their own, and the ratios taken against them."""

from __future__ import annotations

import sys
import threading
import time
from functools import partial

import pytest
import torch

from benchmarks import bench_profiler as bp
from benchmarks.step_thread import StepThread
from examples import zoo

TINY = bp.ModelSpec("tiny", partial(zoo.mlp, blocks=1, width=8, in_features=8), 4, "1 block, width 8")


class Recording(bp.Tool):
    """Notes the thread and order of its calls in a shared log."""

    def __init__(self, name: str, log: list[tuple[str, int | None]]) -> None:
        self.name, self.log = name, log

    def start(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, workdir) -> None:
        self.log.append((f"{self.name} start", threading.get_ident()))

    def after_step(self) -> None:
        self.log.append((self.name, threading.get_ident()))

    def after_warmup(self) -> None:
        self.log.append((f"{self.name} warm", threading.get_ident()))


def test_the_step_thread_runs_each_job_on_its_own_thread_and_hands_back_results_and_errors() -> None:
    with StepThread() as other:
        assert other.call(threading.get_ident) == other.ident != threading.get_ident()
        with pytest.raises(ZeroDivisionError):
            other.call(lambda: 1 / 0)
        assert other.call(lambda: 7) == 7  # (still serving after a failed job)
    with pytest.raises(RuntimeError, match="closed"):
        other.call(lambda: 1)


def test_paired_steps_alternate_one_for_one_the_baseline_on_the_other_thread(tmp_path) -> None:
    log: list[tuple[str, int | None]] = []
    lane = bp.make_lane(TINY, Recording("tool", log))
    base = bp.make_lane(TINY, Recording("base", log))
    bp.run_block(lane, 3, 4, tmp_path, partial(bp.paired_steps, base=base))
    here = threading.get_ident()
    assert lane.error is None
    timed = [name for name, _ in log[log.index(("tool warm", here)) + 1 + bp.PAIRED_BASE_WARMUP:]]
    assert timed == ["tool", "base", "base", "tool", "tool", "base", "base", "tool"]  # who goes first alternates
    assert {thread for name, thread in log if name.startswith("tool")} == {here}
    assert here not in {thread for name, thread in log if name == "base"}
    assert len({thread for name, thread in log if name == "base"}) == 1
    assert len(lane.wall_ms) == len(lane.paired_wall_ms) == len(lane.paired_cpu_ms) == 1
    assert len(lane.wall_ms[0]) == len(lane.paired_wall_ms[0]) == len(lane.call_ms) == len(base.call_ms) == 4


def test_a_paired_lanes_ratios_are_taken_against_its_own_baseline_steps() -> None:
    n = bp.DEFAULT_THREADS
    base = bp.Lane(TINY, n, bp.Tool(), None, None, None)  # type: ignore[arg-type]  # nothing is trained
    tool = bp.Lane(TINY, n, bp.Memprof(), None, None, None)  # type: ignore[arg-type]
    base.wall_ms = base.cpu_ms = [[50.0] * 4]  # a block of the baseline's own, on a slower spell
    tool.wall_ms, tool.cpu_ms = [[11.0] * 4, [22.0] * 4], [[12.0] * 4, [24.0] * 4]
    tool.paired_wall_ms, tool.paired_cpu_ms = [[10.0] * 4, [20.0] * 4], [[10.0] * 4, [20.0] * 4]
    assert bp._round_ratios(tool, base, bp.WALL_MEAN) == pytest.approx([1.1, 1.1])
    assert bp._ratio(tool, base, bp.WALL_MEAN) == pytest.approx(1.1)
    assert bp._round_ratios(tool, base, bp.CPU) == pytest.approx([1.2, 1.2])
    assert bp._ratio(tool, base, bp.WALL) == pytest.approx(1.1)  # (pooled medians: 16.5 over 15)
    unpaired = bp.Lane(TINY, n, bp.Memprof(), None, None, None)  # type: ignore[arg-type]
    unpaired.wall_ms = [[55.0] * 4]
    assert bp._ratio(unpaired, base, bp.WALL_MEAN) == pytest.approx(1.1)  # --pairing blocks: the baseline's block


def test_a_paired_run_gives_the_baseline_every_block_it_stepped_in() -> None:
    tools = (bp.Tool, bp.SecondBaseline, bp.MemprofInline)
    lanes = bp.run_all([TINY], repeats=2, warmup=2, steps=3, tools=tools, threads=(1,))
    base, second, inline = lanes["tiny", 1]
    assert second.error is None and inline.error is None
    assert len(second.paired_wall_ms) == len(inline.paired_wall_ms) == 2
    assert len(base.wall_ms) == 4 and all(len(block) == 3 for block in base.wall_ms)
    with pytest.raises(ValueError, match="pairing"):
        bp.run_all([TINY], repeats=1, warmup=0, steps=1, tools=tools, pairing="pairs")


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0]


def _settles(pid: int, stopped: bool, timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while (_state(pid) == "T") != stopped:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_memprofs_worker_is_held_while_the_baseline_steps_and_let_go_after(tmp_path) -> None:
    lane = bp.make_lane(TINY, bp.MemprofWorkerOnly())
    lane.tool.start(lane.model, lane.optimizer, tmp_path)
    try:
        for _ in range(3):
            bp._step(lane)  # the first record starts the worker
        pid = lane.tool._sink.pid
        assert pid is not None and _state(pid) != "T"
        with lane.tool.held():
            assert _settles(pid, stopped=True)  # (a signal takes effect once the process is next scheduled)
        assert _settles(pid, stopped=False)
        bp._step(lane)  # and it still answers
    finally:
        lane.tool.stop()
    with bp.Tool().held():  # nothing to hold
        pass


def test_every_other_round_the_tool_and_the_baseline_trade_model_instances() -> None:
    lane, base = bp.make_lane(TINY, bp.SecondBaseline()), bp.make_lane(TINY, bp.Tool())
    mine, theirs = (lane.model, lane.optimizer, lane.batch), (base.model, base.optimizer, base.batch)
    with bp.swapped_instances(lane, base, swap=True):
        assert (lane.model, lane.optimizer, lane.batch) == theirs and (base.model, base.optimizer, base.batch) == mine
    assert (lane.model, lane.optimizer, lane.batch) == mine and (base.model, base.optimizer, base.batch) == theirs
    with bp.swapped_instances(lane, base, swap=False):
        assert lane.model is mine[0]
    seen: list[torch.nn.Module] = []

    class Seeing(bp.Tool):
        name = "seeing"

        def start(self, model, optimizer, workdir) -> None:
            seen.append(model)

    lanes = bp.run_all([TINY], repeats=2, warmup=0, steps=1, tools=(bp.Tool, Seeing), threads=(1,))
    base_lane, tool_lane = lanes["tiny", 1]
    assert seen[0] is tool_lane.model and seen[1] is base_lane.model  # the second round: traded


def test_the_report_names_the_tools_that_warm_up_for_fewer_steps() -> None:
    lanes = {("tiny", 1): [bp.Lane(TINY, 1, tool, None, None, None)  # type: ignore[arg-type]
                           for tool in (bp.Tool(), bp.Memprof(), bp.TorchProfiler())]}
    assert bp._warmups(lanes, 80) == "80 warm-up steps, torch.profiler: 10"
    assert bp._warmups(lanes, 5) == "5 warm-up steps"


def test_each_block_steps_on_threads_of_its_own_the_main_thread_only_orchestrates() -> None:
    log: list[tuple[str, int | None]] = []

    class Logged(Recording):
        def __init__(self) -> None:
            super().__init__(self.name, log)

    class Tool(Logged):
        name = "tool"

    class Base(Logged):
        name = "base"

    lanes = bp.run_all([TINY], repeats=3, warmup=0, steps=2, tools=(Base, Tool), threads=(1,))
    assert all(lane.error is None for lane in lanes["tiny", 1])
    main = threading.get_ident()
    starts = [thread for name, thread in log if name == "tool start"]
    assert len(starts) == 3 and main not in starts
    assert main not in {thread for name, thread in log if name == "base"}
    # each block's baseline steps on one thread, not the tool's (thread idents may be reused once one has ended)
    at = [k for k, (name, _) in enumerate(log) if name == "tool start"]
    for block in (log[i:j] for i, j in zip(at, [*at[1:], len(log)])):
        tool_threads = {thread for name, thread in block if name.startswith("tool")}
        base_threads = {thread for name, thread in block if name == "base"}
        assert len(tool_threads) == len(base_threads) == 1 and tool_threads != base_threads


class KeptTorchProfiler(bp.TorchProfiler):
    """torch.profiler (``with_stack``, as the benchmark runs it), the names of its events kept."""

    name = "torch.profiler"

    def stop(self) -> None:
        profiler = self._profiler
        super().stop()
        assert profiler is not None
        self.names = [event.name for event in profiler.events()]


def _traced(names: list[str], function: str) -> int:
    return sum(1 for name in names if "test_paired_steps.py" in name and name.endswith(function))


def test_torch_profilers_python_tracer_does_not_see_the_baselines_steps(tmp_path) -> None:
    log: list[tuple[str, int | None]] = []
    lane, base = bp.make_lane(TINY, KeptTorchProfiler()), bp.make_lane(TINY, Recording("base", log))
    with StepThread("tool") as mine:
        mine.call(partial(bp.run_block, lane, 2, 4, tmp_path, partial(bp.paired_steps, base=base)))
    assert lane.error is None and len(log) == 4 + bp.PAIRED_BASE_WARMUP  # (the baseline stepped)
    assert _traced(lane.tool.names, "after_step") == 0  # the baseline's Recording.after_step, never traced
    # the check can fail: a thread alive when the tracer starts has its calls traced
    with StepThread("older") as older:
        tool = KeptTorchProfiler()
        tool.start(lane.model, lane.optimizer, tmp_path)
        older.call(Recording("base", log).after_step)
        tool.stop()
    assert _traced(tool.names, "after_step") == 1


def test_a_step_thread_takes_the_callers_intra_op_setting() -> None:
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        with bp.step_thread("one") as helper:
            assert helper.call(torch.get_num_threads) == 1 and helper.ident != threading.get_ident()
    finally:
        torch.set_num_threads(threads)
