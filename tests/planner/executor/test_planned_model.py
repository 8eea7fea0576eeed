"""A schedule knows the model it was planned for: another one is refused in one line, through
``planner.apply_schedule`` (``ScheduleMismatchError``) and through the exported file (a plain ``ValueError``, the
same text); ``strict=False`` applies it with one warning; the same model with other weights trains bitwise as plain
autograd does.

Issue 51: a rotor schedule planned for a 4-layer GPT-2 was accepted by a 6-layer one, which then trained wrongly
(loss 6.223338 instead of 6.242151), since ``transformer.h.0..3`` exist in both.
"""

from __future__ import annotations

import copy
import importlib.util
import itertools
import json
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest
import torch
from torch import nn

from memprof import MemoryProfiler, load_trace
from planner import apply_schedule, chain_from_trace, min_feasible_budget, solve
from planner.errors import ScheduleMismatchError
from planner.executor import CheckpointedSequential, remove_schedule
from planner.export.files import export_python
from planner.model.schedule import Schedule
from tests.planner import models as M

ADVICE = ("re-plan for this model, or apply_schedule(model, strict=False) to run it anyway (its memory prediction "
          "will not hold)")
_LOADED = itertools.count()
T = TypeVar("T")


def plan(model: nn.Module, make_batch: Callable[[], tuple], loss: Callable, out_dir: Path) -> Schedule:
    """Profiles 3 SGD steps of ``model`` and plans rotor at its minimum budget."""
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    with MemoryProfiler(model, optimizer, out_dir=out_dir, print_period=0, background=False) as profiler:
        for _ in range(3):
            optimizer.zero_grad(set_to_none=True)
            loss(model, make_batch()).backward()
            optimizer.step()
            profiler.record_stats()
    chain = chain_from_trace(load_trace(profiler.run_dir))
    return solve(chain, min_feasible_budget(chain, "rotor"), "rotor")


def recorded(call: Callable[[], T]) -> tuple[T, list[warnings.WarningMessage]]:
    """``call()``'s result and every warning it raised (repeats included)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = call()
    return result, caught


def exported(schedule: Schedule, tmp_path: Path):
    """The exported file, loaded as a module (its own name, forgotten again by the ``forget_loaded`` fixture)."""
    path = tmp_path / f"apply_{next(_LOADED)}.py"
    path.write_text(export_python(schedule), encoding="utf-8")
    spec = importlib.util.spec_from_file_location(f"planned_model_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(autouse=True)
def forget_loaded():
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:
        if name.startswith("planned_model_"):
            del sys.modules[name]


def apply_with(how: str, model: nn.Module, schedule: Schedule, tmp_path: Path, **kwargs) -> nn.Module:
    if how == "api":
        return apply_schedule(model, schedule, **kwargs)
    return exported(schedule, tmp_path).apply_schedule(model, **kwargs)


def refusal(how: str, model: nn.Module, schedule: Schedule, tmp_path: Path) -> str:
    """The one line ``model`` is refused with (``ScheduleMismatchError`` or, from the file, a plain ``ValueError``)."""
    with pytest.raises(ValueError) as caught:
        apply_with(how, model, schedule, tmp_path)
    assert type(caught.value) is (ScheduleMismatchError if how == "api" else ValueError)
    message = str(caught.value)
    assert "\n" not in message and message.endswith(ADVICE)
    assert not any("forward" in m.__dict__ for m in model.modules())  # nothing installed
    return message


def gradients(model: nn.Module, loss: Callable, batch: tuple) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """One forward and backward on one intra-op thread (compared bit for bit)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model.zero_grad(set_to_none=True)
        torch.manual_seed(7)
        value = loss(model, batch)
        value.backward()
        return value.detach(), [p.grad for p in model.parameters()]
    finally:
        torch.set_num_threads(threads)


def assert_trains_as_plain_autograd(model: nn.Module, scheduled: nn.Module, loss: Callable, batch: tuple) -> None:
    expected, got = gradients(model, loss, batch), gradients(scheduled, loss, batch)
    assert torch.equal(expected[0], got[0])
    assert all(a is not None and torch.equal(a, b) for a, b in zip(expected[1], got[1]))


# --- a model of blocks called in a loop (fast) ---------------------------------------------------------------------

def loop_loss(model: nn.Module, batch: tuple) -> torch.Tensor:
    return model(batch[0]).square().mean()


@pytest.fixture(scope="module")
def loop_schedule(tmp_path_factory) -> Schedule:
    torch.manual_seed(0)
    return plan(M.LoopModel(dim=6, blocks=4), lambda: (torch.randn(5, 6),), loop_loss, tmp_path_factory.mktemp("loop"))


@pytest.mark.parametrize("how", ["api", "file"])
def test_a_loop_model_with_another_depth_or_width_is_refused(loop_schedule, how: str, tmp_path) -> None:
    assert refusal(how, M.LoopModel(dim=6, blocks=5), loop_schedule, tmp_path) == (
        "this schedule was planned for a LoopModel whose blocks has 4 blocks (0..3); this model's has 5 blocks (0..4) "
        f"(and 1 other difference): {ADVICE}")
    # embed's 2 parameters, the blocks' 8, the head's weight (its bias is (2,) still) and the parameter count
    assert refusal(how, M.LoopModel(dim=8, blocks=4), loop_schedule, tmp_path).startswith(
        "embed.weight is (8, 8) here, (6, 6) in the planned model (and 11 other differences): ")


@pytest.mark.parametrize("how", ["api", "file"])
def test_the_same_model_with_other_weights_trains_as_plain_autograd(loop_schedule, how: str, tmp_path) -> None:
    fresh = M.LoopModel(dim=6, blocks=4, seed=3)
    plain = copy.deepcopy(fresh)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning: the model is the planned one, the input its size
        scheduled = apply_with(how, fresh, loop_schedule, tmp_path)
        assert_trains_as_plain_autograd(plain, scheduled, loop_loss, (torch.randn(5, 6),))


@pytest.mark.parametrize("how", ["api", "file"])
def test_strict_false_applies_a_wider_model_with_one_warning(loop_schedule, how: str, tmp_path) -> None:
    wider = M.LoopModel(dim=8, blocks=4)
    plain = copy.deepcopy(wider)
    scheduled, caught = recorded(lambda: apply_with(how, wider, loop_schedule, tmp_path, strict=False))
    assert [str(w.message) for w in caught] == [
        "embed.weight is (8, 8) here, (6, 6) in the planned model (and 11 other differences); the schedule is applied "
        "anyway (strict=False): its memory prediction does not hold for this model"]
    assert caught[0].filename == __file__  # the line that applied it
    _, caught = recorded(lambda: assert_trains_as_plain_autograd(plain, scheduled, loop_loss, (torch.randn(5, 8),)))
    assert len(caught) == 1 and "stage-1 input (embed) is 160 bytes; the schedule was planned for 120" in str(
        caught[0].message)


@pytest.mark.parametrize("how", ["api", "file"])
def test_another_batch_size_warns_once_and_trains_as_plain_autograd(loop_schedule, how: str, tmp_path) -> None:
    model = M.LoopModel(dim=6, blocks=4)
    plain = copy.deepcopy(model)
    scheduled = apply_with(how, model, loop_schedule, tmp_path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for batch in (5, 3, 7, 5):  # the last partial batch of an epoch is normal: a warning, not a refusal
            assert_trains_as_plain_autograd(plain, scheduled, loop_loss, (torch.randn(batch, 6),))
    assert [str(w.message) for w in caught] == [
        "this forward's stage-1 input (embed) is 72 bytes; the schedule was planned for 120 (another batch or sequence "
        "length): it runs, with the same gradients, but its memory prediction does not hold for this input"]
    remove_schedule(scheduled)
    assert not scheduled.embed._forward_pre_hooks


def test_a_schedule_from_older_json_is_applied_unchecked_with_one_warning(loop_schedule) -> None:
    raw = json.loads(loop_schedule.to_json())
    del raw["chain"]["signature"]
    older = Schedule.from_json(raw)
    _, caught = recorded(lambda: apply_schedule(M.LoopModel(dim=6, blocks=4), older))
    assert len(caught) == 1 and "carries no model signature" in str(caught[0].message)
    assert "cannot be checked against this model; re-plan to have it checked" in str(caught[0].message)


class Features(nn.Module):
    """A ``features`` container (the chain, named with ``container="features"``) and a head."""

    def __init__(self, depth: int = 3, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.features = nn.Sequential(*(layer for _ in range(depth) for layer in (nn.Linear(6, 6), nn.Tanh())))
        self.head = nn.Linear(6, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


def test_checkpointed_sequential_checks_the_container_it_is_given(tmp_path) -> None:
    model = Features()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    with MemoryProfiler(model, optimizer, out_dir=tmp_path, print_period=0, background=False) as profiler:
        for _ in range(2):
            loop_loss(model, (torch.randn(5, 6),)).backward()
            profiler.record_stats()
    chain = chain_from_trace(load_trace(profiler.run_dir), container="features")
    schedule = solve(chain, min_feasible_budget(chain, "rotor"), "rotor")
    fresh = Features(seed=2)
    plain = copy.deepcopy(fresh.features)
    wrapped = CheckpointedSequential(fresh.features, schedule)  # the schedule's names less "features."
    assert_trains_as_plain_autograd(plain, wrapped, lambda m, b: m(b[0]).square().mean(), (torch.randn(5, 6),))
    with pytest.raises(ScheduleMismatchError, match=r"^this schedule was planned for a model whose top level has 6 "
                                                    r"blocks \(0..5\); this model's has 8 blocks \(0..7\)"):
        CheckpointedSequential(Features(depth=4).features, schedule)


# --- Hugging Face GPT-2 (slow) -------------------------------------------------------------------------------------

_VOCAB, _SEQ, _BATCH = 512, 32, 2


def gpt2(layers: int = 4, width: int = 64, seed: int = 0) -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=_VOCAB, n_positions=64, n_embd=width, n_layer=layers, n_head=2, resid_pdrop=0.0,
                        embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False, attn_implementation="eager",
                        bos_token_id=_VOCAB - 1, eos_token_id=_VOCAB - 1)
    model = GPT2LMHeadModel(config)
    model.loss_type = "ForCausalLM"
    return model


def llama() -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=_VOCAB, hidden_size=64, intermediate_size=176, num_hidden_layers=4,
                                        num_attention_heads=2, num_key_value_heads=2, use_cache=False))


def lm_loss(model: nn.Module, batch: tuple) -> torch.Tensor:
    return model(input_ids=batch[0], labels=batch[0]).loss


def lm_batch() -> tuple:
    return (torch.randint(0, _VOCAB, (_BATCH, _SEQ)),)


@pytest.fixture(scope="module")
def gpt2_schedule(tmp_path_factory) -> Schedule:
    return plan(gpt2(), lm_batch, lm_loss, tmp_path_factory.mktemp("gpt2"))


#: Each other model and the start of the line it is refused with.
OTHERS: dict[str, tuple[Callable[[], nn.Module], str]] = {
    "deeper": (lambda: gpt2(layers=6), "this schedule was planned for a GPT2LMHeadModel whose transformer.h has 4 "
                                       "blocks (0..3); this model's has 6 blocks (0..5) (and 1 other difference)"),
    "shallower": (lambda: gpt2(layers=2), "this schedule was planned for a GPT2LMHeadModel whose transformer.h has 4 "
                                          "blocks (0..3); this model's has 2 blocks (0..1)"),
    "wider": (lambda: gpt2(width=128), "transformer.h.0.ln_1.weight is (128,) here, (64,) in the planned model"),
    "narrower": (lambda: gpt2(width=32), "transformer.h.0.ln_1.weight is (32,) here, (64,) in the planned model"),
    "llama": (llama, "this schedule was planned for a GPT2LMHeadModel; this model is a LlamaForCausalLM"),
    "mlp": (lambda: M.mlp(), "this schedule was planned for a GPT2LMHeadModel; this model is a Sequential"),
}


@pytest.mark.slow
@pytest.mark.parametrize("how", ["api", "file"])
@pytest.mark.parametrize("other", sorted(OTHERS))
def test_a_gpt2_schedule_refuses_another_model_in_one_line(gpt2_schedule, other: str, how: str, tmp_path) -> None:
    build, expected = OTHERS[other]
    assert refusal(how, build(), gpt2_schedule, tmp_path).startswith(expected)


@pytest.mark.slow
def test_the_file_and_the_api_refuse_with_the_same_line(gpt2_schedule, tmp_path) -> None:
    lines = {how: refusal(how, gpt2(layers=6), gpt2_schedule, tmp_path) for how in ("api", "file")}
    assert lines["api"] == lines["file"]


@pytest.mark.slow
@pytest.mark.parametrize("how", ["api", "file"])
def test_a_fresh_gpt2_with_other_weights_trains_bitwise_as_plain_autograd(gpt2_schedule, how: str, tmp_path) -> None:
    fresh = gpt2(seed=1)
    plain = copy.deepcopy(fresh)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        scheduled = apply_with(how, fresh, gpt2_schedule, tmp_path)
        assert_trains_as_plain_autograd(plain, scheduled, lm_loss, lm_batch())


@pytest.mark.slow
@pytest.mark.parametrize("how", ["api", "file"])
def test_strict_false_runs_a_wider_gpt2_with_a_warning(gpt2_schedule, how: str, tmp_path) -> None:
    wider = gpt2(width=128)
    plain = copy.deepcopy(wider)
    scheduled, caught = recorded(lambda: apply_with(how, wider, gpt2_schedule, tmp_path, strict=False))
    assert [str(w.message) for w in caught] == [
        "transformer.h.0.ln_1.weight is (128,) here, (64,) in the planned model (and 50 other differences); the "
        "schedule is applied anyway (strict=False): its memory prediction does not hold for this model"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the stage-1 input is twice as wide: said once, tested above
        assert_trains_as_plain_autograd(plain, scheduled, lm_loss, lm_batch())


@pytest.mark.slow
@pytest.mark.parametrize("how", ["api", "file"])
def test_strict_false_still_refuses_a_deeper_gpt2_which_would_train_wrongly(gpt2_schedule, how: str, tmp_path) -> None:
    """Planned so, the last stage ran transformer.h.3 and ln_f together: on a 6-layer GPT-2, h.4 and h.5 got ln_f's
    output (the loss was 6.250854 instead of 6.254702, gradients off by up to 0.20, before it was refused)."""
    with pytest.raises(ValueError, match=r"^this schedule was planned for a GPT2LMHeadModel whose transformer.h has 4 "
                                         r"blocks \(0..3\); this model's has 6 blocks \(0..5\) "
                                         r".*even with strict=False"):
        apply_with(how, gpt2(layers=6), gpt2_schedule, tmp_path, strict=False)
