"""Steady iterations (memprof.capture.steady): with the submodules' hooks off while training repeats itself, a
trace holds what it holds with every hook on, row for row, on models written here and by Hugging Face."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn

from examples import zoo
from memprof import MemoryProfiler, load_trace
from memprof.errors import ProfilerError
from tests.memprof.helpers import without_collector

STEPS = 9
# what may differ: times, and whose marks attributed an iteration
TIMES = {"step_ms", "template_iteration", "time_ns", "time_ms", "start_ns", "end_ns", "forward_ms", "backward_ms"}


Maker = Callable[[], tuple[nn.Module, Callable[[int], object]]]  # the model, and iteration -> its batch


def _zoo(build: Callable[[], zoo.ModelAndData], batch: int) -> Maker:
    def make() -> tuple[nn.Module, Callable[[int], object]]:
        model, make_batch = build()
        return model, lambda i: make_batch(batch)
    return make


def _hf(kind: str, seq: Callable[[int], int] = lambda i: 16, micro_batches: int = 1, autocast: bool = False) -> Maker:
    """Hugging Face's model; its step accumulates over ``micro_batches`` forwards, under bfloat16 autocast if asked."""
    def make() -> tuple[nn.Module, Callable[[int], object]]:
        transformers = pytest.importorskip("transformers")
        if kind == "gpt2":
            config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=500)
            model = transformers.GPT2LMHeadModel(config)
        else:
            config = transformers.BertConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=2,
                                             intermediate_size=128, vocab_size=500)
            model = transformers.BertForMaskedLM(config)
        model.config.use_cache = False
        generator = torch.Generator().manual_seed(1)

        def batch(i: int) -> list[dict[str, torch.Tensor]]:
            return [{"input_ids": ids, "labels": ids}
                    for ids in (torch.randint(0, 500, (2, seq(i)), generator=generator) for _ in range(micro_batches))]
        return model, batch
    make.autocast = autocast  # type: ignore[attr-defined]
    return make


def _train(make: Maker, out_dir: Path, steady: bool, hooks_seen: list[int] | None = None, steps: int = STEPS,
           **options) -> Path:  # noqa: ANN003
    torch.manual_seed(0)
    model, batch = make()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    submodule = next(m for m in model.modules() if m is not model and any(True for _ in m.parameters()))
    with warnings.catch_warnings(), without_collector():
        warnings.simplefilter("ignore")
        with MemoryProfiler(model, optimizer, out_dir=out_dir, print_period=0, steady=steady, detail_first=2,
                            detail_every=0, **options) as profiler:
            for i in range(steps):
                data = batch(i)
                profiler.mark_inputs(data)
                if isinstance(data, list):  # Hugging Face's micro-batches
                    for micro in data:
                        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=getattr(make, "autocast", False)):
                            loss = model(**micro).loss / len(data)
                        loss.backward()
                    optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
                else:
                    zoo.train_step(model, optimizer, data)
                if hooks_seen is not None:  # the submodule's forward hooks and its parameters' gradient hooks
                    param = next(submodule.parameters())
                    hooks_seen.append(len(submodule._forward_hooks) + len(param._post_accumulate_grad_hooks or {}))
                profiler.record_stats(detail=i % 2 == 1)  # detail asked for after the fact, hooked or not
    return profiler.run_dir


def _comparable(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.drop(columns=[c for c in frame.columns if c in TIMES]).reset_index(drop=True)


MODELS = {
    "mlp": _zoo(partial(zoo.mlp, blocks=6, width=64, in_features=32), 16),
    "cnn": _zoo(partial(zoo.cnn, channels=8, blocks=2, image=16), 4),
    "transformer": _zoo(partial(zoo.transformer, dim=32, heads=4, layers=2, seq=16), 4),
    "lstm": _zoo(zoo.lstm, 4),
    "llama": _zoo(zoo.llama, 2),
    "hf-gpt2": _hf("gpt2"),
    "hf-bert": _hf("bert"),
    "hf-gpt2-autocast-accumulating": _hf("gpt2", micro_batches=2, autocast=True),
}


@pytest.mark.parametrize("name", list(MODELS))
def test_steady_iterations_give_the_rows_every_hook_gives(name, tmp_path):
    hooked = load_trace(_train(MODELS[name], tmp_path / "hooked", steady=False))
    seen: list[int] = []
    steady = load_trace(_train(MODELS[name], tmp_path / "steady", steady=True, hooks_seen=seen))
    # iterations 0-1 are scheduled for detail (hooked), 2 repeats 1: its marks are the template from then on
    assert hooked.iterations.template_iteration.tolist() == [-1] * STEPS
    assert steady.iterations.template_iteration.tolist() == [-1, -1, -1] + [2] * (STEPS - 3)
    assert seen[3:] == [0] * (STEPS - 3) and min(seen[:3]) >= 2  # the submodules' and gradients' hooks were off
    pd.testing.assert_frame_equal(_comparable(hooked.iterations), _comparable(steady.iterations))
    if name == "hf-gpt2-autocast-accumulating":  # two micro-batches a step; autocast's weight copies at the peak
        assert (steady.iterations.micro_batches == 2).all() and (steady.iterations.weight_copies[1:] > 0).all()
    # the detail asked for after a steady iteration: its layers and events, as hooks give them
    assert set(steady.layers.iteration) == {0, 1, 3, 5, 7}
    pd.testing.assert_frame_equal(_comparable(hooked.layers), _comparable(steady.layers))
    pd.testing.assert_frame_equal(_comparable(hooked.events), _comparable(steady.events))


def test_an_iteration_that_changes_shape_is_said_and_the_hooks_return(tmp_path):
    """A longer batch in iteration 5: it ran without the submodules' hooks, so only the model's own marks
    attribute it (and say so); the hooks come back until two iterations agree again."""
    make = _hf("gpt2", seq=lambda i: 24 if i == 5 else 16)
    steady = load_trace(_train(make, tmp_path / "steady", steady=True, steps=13))
    hooked = load_trace(_train(make, tmp_path / "hooked", steady=False, steps=13))
    # 6 frees 5's longer batch (it differs from 7); after a miss four hooked iterations must agree (7-10)
    assert steady.iterations.template_iteration.tolist() == [-1, -1, -1, 2, 2, -2, -1, -1, -1, -1, -1, 10, 10]
    same = steady.iterations.iteration != 5
    pd.testing.assert_frame_equal(_comparable(hooked.iterations[same]), _comparable(steady.iterations[same]))
    # the changed one keeps its exact totals; its layers are the model's alone
    for column in ("peak_allocated_bytes", "allocated_bytes", "num_allocations"):
        assert steady.iterations[column][5] == hooked.iterations[column][5]
    layers = steady.layers[steady.layers.iteration == 5].set_index("module")
    assert layers.calls[""] == 1 and (layers.calls.drop("") == 0).all()


def test_steady_off_where_every_module_call_must_be_seen(tmp_path):
    make = MODELS["mlp"]
    guarded = load_trace(_train(make, tmp_path / "guarded", steady=True, budget_bytes=1 << 40))
    assert guarded.iterations.template_iteration.tolist() == [-1] * STEPS
    with pytest.raises(ProfilerError, match="steady must be True or False"):
        MemoryProfiler(nn.Linear(2, 2), out_dir=tmp_path, steady="yes")  # type: ignore[arg-type]


def test_each_miss_doubles_the_iterations_that_must_agree():
    """Shapes that repeat for a few steps at a time lose their hooks less and less often."""
    from memprof.analysis.detail import DetailPolicy
    from memprof.analysis.records import AllocationEvents, IterationRecord, Mark
    from memprof.capture.steady import FIRST_AGREEING, MOST_AGREEING, SteadyHooks

    class Hooks:
        full = True

        def set_full_hooks(self, on: bool) -> None:
            self.full = on

    def record(iteration: int, size: int, template=None) -> IterationRecord:  # noqa: ANN001
        events = AllocationEvents(*(np.asarray(c, dtype=np.int64) for c in (
            [10, 20], [0x100, 0x100], [size, -size], [size, 0], [0, 0])))
        marks = [(5, Mark.FWD_ENTER, 0, []), (15, Mark.FWD_EXIT, 0, [(0x100, size)]), (25, Mark.BWD_END, -1, [])]
        return IterationRecord(iteration=iteration, epoch=0, start_ns=0, end_ns=30, events=events, marks=marks,
                               template=template)

    hooks = Hooks()
    steady = SteadyHooks(hooks, DetailPolicy(first=0, every=0), enabled=True)  # type: ignore[arg-type]
    runs = []
    for iteration, size in enumerate([8] * 3 + [16] * 6 + [24] * 10 + [32] * 20):  # a new shape now and then
        steady.after(record(iteration, size, steady.current()))
        runs.append(hooks.full)
    steady_after = [i for i, full in enumerate(runs) if not full]  # iterations after which the next ran steady
    # 0-1 agree: 2-3 steady, 3 changed (a miss); 4-7 agree: 8-9 steady, 9 changed; 10-17 agree: 18-19 steady,
    # 19 changed; 20-35 agree: 36-38 steady
    assert steady_after == [1, 2, 7, 8, 17, 18, 35, 36, 37, 38]
    assert steady.needed == 16 == FIRST_AGREEING * 8 and MOST_AGREEING >= 16
