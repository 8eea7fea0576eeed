"""``memprof estimate``: one estimate, the largest batch that fits, and every kind of bad input as one line."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

from cli.factory import load_factory
from cli.main import main
from examples import zoo
from memprof import estimate, load_trace
from memprof.capture.kv_cache import KeyValueCacheWarning
from memprof.units import format_bytes, parse_bytes
from tests.cli.estimate_factories import tiny_gpt
from tests.cli.helpers import ROOT, exit_code, one_line_error, printed_warnings
from tests.memprof.estimation.cases import measured_peak

FACTORY = "tests.cli.estimate_factories:tiny_gpt"


def test_one_estimate_prints_the_peak_and_writes_a_trace(tmp_path: Path, capsys) -> None:
    assert main(["estimate", FACTORY, "--batch-size", "8", "--out", str(tmp_path), "--run-id", "gpt8",
                 "--optimizer", "adam"]) == 0
    text = capsys.readouterr().out
    trace = load_trace(tmp_path / "gpt8")
    assert trace.meta["estimate"] is True
    peak = int(trace.iterations.set_index("iteration").loc[1, "peak_allocated_bytes"])
    assert f"step peak   {format_bytes(peak)} allocated" in text
    assert "at batch 8, optimizer adam, on cpu" in text and str(tmp_path / "gpt8") in text
    assert "reserved" not in text


def test_a_file_path_and_cuda(tmp_path: Path, capsys) -> None:
    spec = f"{ROOT / 'tests' / 'cli' / 'estimate_factories.py'}:tiny_gpt"
    assert main(["estimate", spec, "--batch-size", "4", "--device", "cuda", "--out", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert "on cuda" in text and "reserved" in text


@pytest.mark.slow
def test_max_batch_finds_the_largest_batch_that_fits(tmp_path: Path, capsys) -> None:
    memory = "3MiB"
    assert main(["estimate", FACTORY, "--max-batch", "--memory", memory, "--out", str(tmp_path),
                 "--run-id", "search", "--optimizer", "sgd"]) == 0
    text = capsys.readouterr().out
    verdict = re.search(r"^batch (\d+) fits as is; (\d+) with rotor at \+(\d+)% step time$", text, re.MULTILINE)
    assert verdict, text
    as_is, planned = int(verdict.group(1)), int(verdict.group(2))
    assert planned > as_is
    # the answers' traces are kept, the search's other estimates are not
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted({f"search-batch{as_is}", f"search-batch{planned}"})
    # as is: the answer fits and one more does not
    factory = load_factory(FACTORY)
    sgd = lambda p: __import__("torch").optim.SGD(p, lr=1e-2, momentum=0.9)  # noqa: E731  (--optimizer sgd)

    def peak(n: int) -> int:
        return estimate(*factory(n), sgd, out_dir=tmp_path / "check").peak_bytes

    assert peak(as_is) <= parse_bytes(memory) < peak(as_is + 1)
    assert load_trace(tmp_path / f"search-batch{as_is}").iterations.peak_allocated_bytes.max() == peak(as_is)


def test_max_batch_names_a_returned_cache_once(tmp_path: Path, capsys) -> None:
    """Every estimate of the search builds the cache; the command says so once, with the first one's size."""
    argv = ["estimate", "tests.cli.estimate_factories:returns_a_cache", "--max-batch", "--memory", "10KiB",
            "--optimizer", "sgd"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert main([*argv, "--out", str(tmp_path / "a")]) == 0
    assert "(8 estimates, optimizer sgd)" in capsys.readouterr().out
    said = [str(w.message) for w in caught if issubclass(w.category, KeyValueCacheWarning)]
    assert len(said) == 1, said
    assert "key/value cache (tuple, 128 B)" in said[0]  # batch 1: two 1 x 16 float32 storages
    with printed_warnings():
        assert main([*argv, "--out", str(tmp_path / "b")]) == 0
    assert capsys.readouterr().err.count("memprof estimate: warning: ") == 1


HF_FACTORY = """
import torch
from transformers import GPT2Config, GPT2LMHeadModel


def gpt2(batch_size):
    config = GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=128, n_positions=32, bos_token_id=127,
                        eos_token_id=127)  # use_cache=True: the default
    with torch.device("meta"):
        model = GPT2LMHeadModel(config)
    ids = torch.empty(batch_size, 16, dtype=torch.long, device="meta")
    return model, ids, lambda m, x: m(input_ids=x, labels=x).loss
"""


@pytest.mark.slow
def test_max_batch_of_gpt2_prints_one_warning_and_no_deprecation(tmp_path: Path) -> None:
    """The issue's command in a fresh process (torch says its FakeTensor warning once per process): of the
    estimate's own lines, only the cache's, once; neither torch's FakeTensor data-pointer deprecation nor
    transformers' past_key_values one."""
    (tmp_path / "hf_factory.py").write_text(HF_FACTORY)
    shown = subprocess.run(
        [sys.executable, "-m", "cli", "estimate", f"{tmp_path / 'hf_factory.py'}:gpt2", "--max-batch", "--memory",
         "4MiB", "--optimizer", "sgd", "--out", str(tmp_path / "traces")],
        capture_output=True, text=True, cwd=ROOT, timeout=600, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert shown.returncode == 0, shown.stderr
    assert "estimates, optimizer sgd)" in shown.stdout
    # layers x (keys, values) x batch 1 x sequence x embedding x float32
    assert shown.stderr.count("key/value cache (DynamicCache, 8.0 KiB)") == 1, shown.stderr
    assert shown.stderr.count("key/value cache") == 1
    assert "FakeTensor" not in shown.stderr and "past_key_values" not in shown.stderr, shown.stderr


def test_nothing_fits(tmp_path: Path, capsys) -> None:
    assert main(["estimate", FACTORY, "--max-batch", "--memory", "64KiB", "--out", str(tmp_path)]) == 1
    assert "does not fit in 64.0 KiB" in capsys.readouterr().out
    assert not tmp_path.exists() or not any(tmp_path.iterdir())


@pytest.mark.parametrize(("argv", "fragments"), [
    (["nocolon"], ["expected MODULE:FACTORY", "'nocolon'"]),
    (["no_such_module_xyz:build"], ["cannot import 'no_such_module_xyz'"]),
    (["missing/file.py:build"], ["no Python file at missing/file.py"]),
    (["tests.cli.estimate_factories:absent"], ["has no function 'absent'"]),
    (["tests.cli.estimate_factories:not_callable"], ["has no function 'not_callable' (found int)"]),
    (["tests.cli.estimate_factories:raises"], ["raises(2) raised ValueError: no model for batch 2"]),
    (["tests.cli.estimate_factories:returns_a_model"], ["must return (model, batch, loss_fn), found Linear"]),
    (["tests.cli.estimate_factories:wrong_shapes"], ["wrong_shapes(2) raised RuntimeError"]),
    (["tests.cli.estimate_factories:data_dependent"], ["aten.nonzero.default", "fake tensors"]),
])
def test_bad_factories_are_one_line_and_exit_2(tmp_path: Path, capfd, argv, fragments) -> None:
    assert main(["estimate", *argv, "--batch-size", "2", "--out", str(tmp_path)]) == 2
    one_line_error(capfd, "memprof estimate: error:", *fragments)  # file descriptors: torch's logs too


@pytest.mark.parametrize(("argv", "fragments"), [
    ([], ["--batch-size is required"]),
    (["--batch-size", "0"], ["--batch-size must be a whole number >= 1, found '0'"]),
    (["--batch-size", "2", "--memory", "1GiB"], ["add --max-batch"]),
    (["--max-batch"], ["--max-batch needs --memory"]),
    (["--max-batch", "--memory", "lots"], ["lots"]),
    (["--max-batch", "--memory", "1GiB", "--algorithm", "magic"], ["magic"]),
    (["--batch-size", "2", "--optimizer", "lion"], ["invalid choice: 'lion'"]),
])
def test_bad_options_are_one_line_and_exit_2(tmp_path: Path, capsys, argv, fragments) -> None:
    assert exit_code(["estimate", FACTORY, "--out", str(tmp_path), *argv]) == 2
    one_line_error(capsys, *fragments)


def test_the_factory_contract_is_what_estimate_takes(tmp_path: Path) -> None:
    """The factory's meta model and meta batch estimate the peak of the same step run for real: within 3% (the
    estimator's accuracy tests' bound) of what the CPU allocator measured, not merely "some bytes"."""
    model, batch, loss_fn = tiny_gpt(2)
    predicted = estimate(model, batch, loss_fn, out_dir=tmp_path).peak_bytes
    torch.manual_seed(0)
    real = zoo.TinyGPT(vocab=128, dim=32, heads=2, layers=4, seq=16)  # tiny_gpt's model, on the CPU
    tokens = torch.randint(0, 128, (2, 16))
    measured = measured_peak(real, (tokens, torch.randint(0, 128, (2 * 16,))), loss_fn, None)
    assert abs(predicted - measured) <= 0.03 * measured, (predicted, measured)
