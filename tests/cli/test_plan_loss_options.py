"""``memprof plan --no-loss-options``: the loss as written, on a Llama whose logits dominate its step.

Oracles: the planner's API on the same run (``chain_from_trace`` with and without ``loss_chunks=()``), and the
written schedule itself (its loss stage's options, the option its ``F_all(L+1)`` records).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from cli.main import main
from memprof import load_trace
from planner import chain_from_trace, min_feasible_budget, solve
from planner.discovery.loss_options import without_loss_options
from planner.executor.apply import loss_chunks
from planner.model.schedule import Schedule
from planner.solvers.loss_choice import has_loss_options
from tests.cli.helpers import TOY, one_line_error
from tests.planner.large_vocab import profile_large_vocab_llama


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return profile_large_vocab_llama(tmp_path_factory.mktemp("large_vocab"))


def _plan(run_dir: Path, out: Path, budget: int, *extra: str) -> int:
    return main(["plan", str(run_dir), "--budget", str(budget), "--algorithm", "selective", *extra, "--out", str(out)])


def test_the_switch_plans_the_loss_as_written_at_a_higher_minimum(run_dir: Path, tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    trace = load_trace(run_dir)
    chunked, plain = chain_from_trace(trace), chain_from_trace(trace, loss_chunks=())
    lowest, lowest_plain = min_feasible_budget(chunked, "selective"), min_feasible_budget(plain, "selective")
    assert lowest < lowest_plain  # the logits dominate: chunking them lowers the whole step's minimum

    out = tmp_path / "chunked.json"
    assert _plan(run_dir, out, lowest) == 0  # without the switch: unchanged, the API's schedule
    schedule = Schedule.from_json(out)
    assert loss_chunks(schedule)[0] > 0 and has_loss_options(schedule.chain)
    assert schedule.ops == solve(chunked, lowest, "selective").ops

    assert _plan(run_dir, tmp_path / "refused.json", lowest, "--no-loss-options") == 2
    one_line_error(capsys, "memprof plan: error:")
    assert not (tmp_path / "refused.json").exists()

    out = tmp_path / "plain.json"
    assert _plan(run_dir, out, lowest_plain, "--no-loss-options") == 0
    schedule = Schedule.from_json(out)
    assert loss_chunks(schedule) == (0, False) and not has_loss_options(schedule.chain)
    assert schedule.chain.fingerprint() == plain.fingerprint()


def test_the_switch_drops_a_chain_files_chunked_options(run_dir: Path, tmp_path: Path) -> None:
    source = tmp_path / "chain.json"
    chunked = chain_from_trace(load_trace(run_dir))
    source.write_text(chunked.to_json())
    budget = min_feasible_budget(chunked, "selective")
    out = tmp_path / "schedule.json"
    assert _plan(source, out, budget, "--no-loss-options") == 2  # its minimum without them is higher
    assert _plan(source, out, min_feasible_budget(without_loss_options(chunked), "selective"), "--no-loss-options") == 0
    assert not has_loss_options(Schedule.from_json(out).chain)


def test_the_switch_leaves_a_chain_without_loss_options_alone(tmp_path: Path) -> None:
    out, plain = tmp_path / "a.json", tmp_path / "b.json"
    assert main(["plan", str(TOY), "--budget", "90MiB", "--out", str(out)]) == 0
    assert main(["plan", str(TOY), "--budget", "90MiB", "--no-loss-options", "--out", str(plain)]) == 0
    assert Schedule.from_json(out).ops == Schedule.from_json(plain).ops
