"""A new user's first run with each way of training: the docs' lines as written, and what the user then sees.

Each test writes a training script whose profiling lines are the code block the README or docs/training.md
shows for that setup, copied from the doc at test time (so the docs cannot drift from what works), with only
the model, data and optimizer defined before it. It runs the script as a user would (a fresh process, in an
empty folder), then ``memprof report`` on the run, and asserts on the text both print: one table per
iteration, the categories' bytes where they can be computed by hand, the peak's phase, and nothing on stderr
from memprof or torch's profiler (no traceback, no warning a user cannot act on).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from memprof.units import format_bytes
from tests.memprof.test_distributed import _free_port

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow

#: What must never reach a user's terminal from memprof's own work (issue 51, item 7).
NOISE = ("Traceback", "Memory block of unknown size", "Accessing the data pointer of FakeTensor",
         "`past_key_values`/`cache_params` are deprecated", "UserWarning: memprof", "RuntimeWarning")


def doc_block(doc: str, heading: str, index: int = 0) -> str:
    """The ``index``-th ```python block under ``heading`` (up to the next heading of the same level) in ``doc``."""
    text = (REPO / doc).read_text(encoding="utf-8")
    level = heading.split(" ", 1)[0]
    assert f"\n{heading}\n" in text, f"{doc} has no heading {heading!r}"
    section = text.split(f"\n{heading}\n", 1)[1]
    section = re.split(rf"\n{level} ", section, maxsplit=1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert len(blocks) > index, f"{doc}, {heading!r}: {len(blocks)} python blocks"
    return blocks[index]


def run_script(folder: Path, preamble: str, block: str, launcher: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    """Runs ``preamble`` + ``block`` as ``train.py`` in ``folder``; fails with its output if it fails."""
    script = folder / "train.py"
    script.write_text(textwrap.dedent(preamble) + "\n" + block, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    env.pop("PYTHONWARNINGS", None)  # what a user's shell has: Python's default warning filters
    done = subprocess.run([sys.executable, *launcher, str(script)], cwd=folder, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, f"the script failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    return done


def memprof_command(folder: Path, *args: str) -> subprocess.CompletedProcess:
    """``memprof ARGS`` as a user types it (the installed console command, or ``python -m cli`` from a checkout)."""
    installed = Path(sys.executable).parent / "memprof"
    command = [str(installed)] if installed.exists() else [sys.executable, "-m", "cli"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([*command, *args], cwd=folder, env=env, capture_output=True, text=True, timeout=300)


def the_run(folder: Path) -> Path:
    runs = [p for p in (folder / "traces").iterdir() if p.is_dir()]
    assert len(runs) == 1, runs
    return runs[0]


def assert_quiet(stderr: str) -> None:
    found = [line for line in stderr.splitlines() if any(noise in line for noise in NOISE)]
    assert not found, "\n".join(found)


def category_line(name: str, size_bytes: int) -> re.Pattern[str]:
    """The console's ``category at peak`` row for ``name`` holding exactly ``size_bytes`` (as formatted)."""
    return re.compile(rf"^  {name}\s+{re.escape(format_bytes(size_bytes))}\s+\d+\.\d%$", flags=re.M)


_MLP = """
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
    optimizer = torch.optim.AdamW(model.parameters())
    criterion = nn.CrossEntropyLoss()
    epochs = 2
    data = torch.utils.data.TensorDataset(torch.randn(256, 64), torch.randint(0, 10, (256,)))
    loader = torch.utils.data.DataLoader(data, batch_size=64)
"""
#: The MLP's parameters, by hand: three Linear layers' weights and biases in float32.
MLP_WEIGHT_BYTES = 4 * (64 * 256 + 256 + 256 * 256 + 256 + 256 * 10 + 10)
MLP_TENSORS = 6


def test_a_plain_loop_as_the_readme_shows(tmp_path: Path) -> None:
    block = doc_block("README.md", "## Profile your training loop")
    assert "profiler.record_stats()" in block and "MemoryProfiler(model, optimizer)" in block
    done = run_script(tmp_path, _MLP, block)
    assert done.stderr == ""
    tables = re.findall(r"^memprof \| iteration (\d+) \(epoch (\d+)\) on cpu \| step [\d.]+ ms$", done.stdout, re.M)
    assert [(int(i), int(e)) for i, e in tables] == [(i, i // 4) for i in range(8)]  # print_period=1, two epochs
    assert len(category_line("weights", MLP_WEIGHT_BYTES).findall(done.stdout)) == 8
    # AdamW: two moments per parameter and a 4-byte step count per tensor
    assert len(category_line("optimizer_state", 2 * MLP_WEIGHT_BYTES + 4 * MLP_TENSORS).findall(done.stdout)) == 8
    run = the_run(tmp_path)
    report = memprof_command(tmp_path, "report", str(run))
    assert report.returncode == 0 and report.stderr == "", report.stderr
    first = report.stdout.splitlines()[0]
    assert first == f"run {run.name} | model Sequential | 8 iterations, 8 with detail", first
    assert "interrupted" not in report.stdout
    assert re.search(r"^  peak allocated [\d.]+ [KM]iB during (forward|backward|optimizer)", report.stdout, re.M)
    assert category_line("weights", MLP_WEIGHT_BYTES).search(report.stdout)


_GPT2 = """
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=512, n_positions=64, n_embd=64, n_layer=2, n_head=2,
                                       bos_token_id=511, eos_token_id=511))
    ids = torch.randint(0, 512, (16, 32))
    data = [{"input_ids": row, "labels": row} for row in ids]
    args = TrainingArguments(output_dir="out", per_device_train_batch_size=4, max_steps=4, report_to=[],
                             use_cpu=True, logging_strategy="no", save_strategy="no")
"""


def _gpt2_weight_bytes() -> tuple[int, int]:
    """The tiny GPT-2's parameter bytes (the tied head once) and tensors, from the same config."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    with torch.device("meta"):
        model = GPT2LMHeadModel(GPT2Config(vocab_size=512, n_positions=64, n_embd=64, n_layer=2, n_head=2,
                                           bos_token_id=511, eos_token_id=511))
    params = list(model.parameters())
    return sum(p.numel() * p.element_size() for p in params), len(params)


def test_the_hugging_face_trainer_as_the_docs_show(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    block = doc_block("docs/training.md", "## Hugging Face `Trainer` (with accelerate)")
    assert "MemprofCallback(out_dir=\"traces\")" in block
    done = run_script(tmp_path, _GPT2, block)
    assert_quiet(done.stderr)
    weights, tensors = _gpt2_weight_bytes()
    tables = re.findall(r"^memprof \| iteration (\d+) \(epoch 0\) on cpu", done.stdout, re.M)
    assert [int(i) for i in tables] == [0, 1, 2, 3]  # one per optimizer step
    assert len(category_line("weights", weights).findall(done.stdout)) == 4
    # AdamW's state is made by the first step, after iteration 0's peak
    assert len(category_line("optimizer_state", 2 * weights + 4 * tensors).findall(done.stdout)) == 3
    assert re.search(r"^  transformer\.h\.0\s+GPT2Block\s", done.stdout, re.M)  # the layer table names the blocks
    report = memprof_command(tmp_path, "report", str(the_run(tmp_path)))
    assert report.returncode == 0 and report.stderr == "", report.stderr
    assert "| model GPT2LMHeadModel | 4 iterations" in report.stdout.splitlines()[0]
    assert re.search(r"^  peak allocated [\d.]+ MiB during backward", report.stdout, re.M)


_LIGHTNING = """
    import lightning
    import torch
    from torch import nn

    class LitModel(lightning.LightningModule):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.model = nn.Sequential(nn.Linear(64, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                                       nn.Linear(1024, 10))

        def training_step(self, batch, batch_idx):
            x, y = batch
            return nn.functional.cross_entropy(self.model(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    lit_module = LitModel()
    data = torch.utils.data.TensorDataset(torch.randn(1024, 64), torch.randint(0, 10, (1024,)))
    train_loader = torch.utils.data.DataLoader(data, batch_size=256)
"""
#: The wide MLP's parameters: its weight gradients outweigh the activations of a batch of 256, so with Lightning's
#: order (zero_grad after training_step) the peak is at the forward's end, the previous step's gradients alive.
WIDE_WEIGHT_BYTES = 4 * (64 * 1024 + 1024 + 1024 * 1024 + 1024 + 1024 * 10 + 10)


def test_lightning_as_the_docs_show(tmp_path: Path) -> None:
    pytest.importorskip("lightning")
    block = doc_block("docs/training.md", "## Lightning")
    assert "MemprofCallback(out_dir=\"traces\")" in block
    done = run_script(tmp_path, _LIGHTNING, "import lightning\n" + block)
    assert_quiet(done.stderr)
    tables = re.findall(r"^memprof \| iteration (\d+) \(epoch (\d+)\) on cpu", done.stdout, re.M)
    # max_epochs=3 of 4 steps; the first step is the probe's (which module to profile), not recorded
    assert [(int(i), int(e)) for i, e in tables] == [(i, (i + 1) // 4) for i in range(11)]
    assert len(category_line("weights", WIDE_WEIGHT_BYTES).findall(done.stdout)) == 11
    peaks = re.findall(r"^  peak allocated [\d.]+ MiB during (\w+)", done.stdout, re.M)
    assert peaks == ["forward"] * 11, peaks  # issue 51: it read "during other" (Lightning's order)
    alive = f"previous step's weight gradients alive at the peak: {format_bytes(WIDE_WEIGHT_BYTES)} (zero_grad runs"
    assert done.stdout.count(alive) == 11, done.stdout[-2000:]
    report = memprof_command(tmp_path, "report", str(the_run(tmp_path)))
    assert report.returncode == 0 and report.stderr == "", report.stderr
    assert "| model Sequential | 11 iterations" in report.stdout.splitlines()[0]  # the probe chose self.model
    assert re.search(r"^  peak allocated [\d.]+ MiB during forward", report.stdout, re.M)
    assert alive in report.stdout  # the report of the finished run says what the console said


_DDP = """
    import torch
    import torch.distributed as dist
    from torch import nn

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(
        nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10)))
    optimizer = torch.optim.AdamW(model.parameters())
    criterion = nn.CrossEntropyLoss()
    epochs = 1
    torch.manual_seed(rank)
    data = torch.utils.data.TensorDataset(torch.randn(128 * (rank + 1), 64), torch.randint(0, 10, (128 * (rank + 1),)))
    loader = torch.utils.data.DataLoader(data, batch_size=32 * (rank + 1))
"""


def test_torchrun_with_ddp_as_the_readme_shows(tmp_path: Path) -> None:
    block = doc_block("README.md", "## Profile your training loop")
    launcher = ("-m", "torch.distributed.run", "--nnodes=1", "--nproc_per_node=2", "--master_addr=127.0.0.1",
                f"--master_port={_free_port()}")
    done = run_script(tmp_path, _DDP, block + "\ndist.destroy_process_group()\n", launcher)
    assert_quiet(done.stderr)
    run = the_run(tmp_path)
    assert sorted(p.name for p in run.iterdir()) == ["rank=0", "rank=1"]
    report = memprof_command(tmp_path, "report", str(run))
    assert report.returncode == 0 and report.stderr == "", report.stderr
    ranks = re.findall(r"^\s*(\d)\s+([\d.]+ [KM]iB)\s+(\d+)\s", report.stdout, re.M)
    assert [rank for rank, _, _ in ranks] == ["0", "1"], report.stdout
    assert re.search(r"imbalance", report.stdout), report.stdout  # rank 1's batch is twice rank 0's
    assert category_line("weights", MLP_WEIGHT_BYTES).search(report.stdout)
