"""``estimate()``: meta models, batches given as shapes, the model given back as it was, errors that name what
went wrong, and a trace the reader and the planner read like a measured one."""

from __future__ import annotations

import contextlib
import json

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from examples import zoo
from memprof import estimate, load_trace
from memprof.categories import Category
from memprof.errors import EstimateError
from tests.allocator_truth import allocator_rise_bytes
from tests.memprof.estimation.cases import CASES, OPTIMIZERS, TiedViews

ADAMW = OPTIMIZERS["adamw"]


def _cross_entropy(model: nn.Module, batch) -> torch.Tensor:
    return F.cross_entropy(model(batch[0]), batch[1])


def _allocated_peak(call) -> int:
    """The highest bytes the CPU allocator had allocated during ``call()`` above what it had before."""
    return allocator_rise_bytes(call)


def test_a_meta_model_is_estimated_without_allocating_its_weights(tmp_path):
    width, layers = 2048, 8  # 33.6M parameters: 134 MB of weights, 537 MB with AdamW's state and gradients
    with torch.device("meta"):
        model = nn.Sequential(*[nn.Sequential(nn.Linear(width, width), nn.ReLU()) for _ in range(layers)],
                              nn.Linear(width, 10))
    batch = (torch.empty(32, width, device="meta"), torch.empty(32, dtype=torch.long, device="meta"))
    found: list = []
    real_peak = _allocated_peak(lambda: found.append(estimate(model, batch, _cross_entropy, ADAMW, out_dir=tmp_path)))
    predicted = found[0]
    weight_bytes = sum(p.numel() * 4 for p in model.parameters())
    assert predicted.categories_at_peak_bytes[Category.WEIGHTS] == weight_bytes
    assert predicted.categories_at_peak_bytes[Category.OPTIMIZER_STATE] >= 2 * weight_bytes
    assert predicted.peak_bytes > 4 * weight_bytes
    assert real_peak < 4 << 20, f"the estimate allocated {real_peak} real bytes"
    assert all(p.device.type == "meta" for p in model.parameters())  # the model is given back as it was


def test_a_real_model_is_given_back_unchanged(tmp_path):
    torch.manual_seed(0)
    model = TiedViews()
    before = {name: (p, p.detach().clone()) for name, p in model.named_parameters()}
    buffers = [b.clone() for b in model.buffers()]
    tokens = torch.randint(0, 300, (4, 24))
    estimate(model, (tokens, torch.randint(0, 300, (4 * 23,))), _cross_entropy, ADAMW, out_dir=tmp_path)
    for name, p in model.named_parameters():
        assert p is before[name][0] and torch.equal(p, before[name][1]) and p.grad is None
    assert all(torch.equal(a, b) for a, b in zip(model.buffers(), buffers))
    assert model.out.weight is model.embed.weight and model.c.weight is model.b.weight


def test_batch_as_real_tensors_meta_tensors_or_sizes_gives_the_same_estimate(tmp_path):
    torch.manual_seed(0)
    model, _ = zoo.mlp(blocks=2, width=64, in_features=32)
    targets = torch.randint(0, 10, (16,))
    forms = {
        "real": (torch.randn(16, 32), targets),
        "meta": (torch.empty(16, 32, device="meta"), torch.empty(16, dtype=torch.long, device="meta")),
        "size": (torch.Size([16, 32]), targets),
    }
    peaks = {name: estimate(model, batch, _cross_entropy, ADAMW, out_dir=tmp_path / name).peak_bytes
             for name, batch in forms.items()}
    assert len(set(peaks.values())) == 1, peaks


def test_the_batch_is_counted_as_inputs_even_by_keyword(tmp_path):
    case = CASES["gpt2"]
    model, batch, loss_fn = case.build()  # the model is called with input_ids= and labels=
    predicted = estimate(model, batch, loss_fn, ADAMW, out_dir=tmp_path)
    assert predicted.categories_at_peak_bytes[Category.INPUTS] == sum(t.numel() * t.element_size() for t in batch)


class _Masked(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.lin(x)
        return h[h > 0].sum()  # boolean indexing: a shape set by the data


class _ReadsItem(_Masked):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.lin(x)
        return h[: int(h.abs().max().item())].sum()


class _Swallows(_Masked):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.lin(x)
        with contextlib.suppress(Exception):  # code that hides the failure must not turn it into a wrong number
            torch.nonzero(h)
        return h.sum()


@pytest.mark.parametrize(("model", "op"), [(_Masked(), "aten.nonzero.default"),
                                           (_ReadsItem(), "aten._local_scalar_dense.default"),
                                           (_Swallows(), "aten.nonzero.default")])
def test_a_data_dependent_op_raises_naming_it_and_leaves_no_trace(tmp_path, model, op):
    with pytest.raises(EstimateError) as caught:
        estimate(model, torch.randn(4, 8), lambda m, b: m(b), out_dir=tmp_path)
    assert caught.value.op == op
    message = str(caught.value)
    assert op in message and "test_api.py" in message and "fake tensors" in message
    assert not any(tmp_path.iterdir())  # no trace of a step that could not be estimated


@pytest.mark.parametrize(("kwargs", "expected"), [
    ({"model": "not a model"}, "expected a torch.nn.Module"),
    ({"loss_fn": 3}, "loss_fn must be callable"),
    ({"optimizer": "optimizer instance"}, "optimizer must be a factory"),
    ({"device": "tpu"}, "device must be 'cpu' or 'cuda'"),
    ({"loss_fn": lambda m, b: m(b[0])}, "must return a scalar loss tensor"),
])
def test_bad_arguments_say_what_was_expected(tmp_path, kwargs, expected):
    model = nn.Linear(4, 3)
    arguments = {"model": model, "batch": (torch.randn(2, 4), torch.tensor([0, 1])), "loss_fn": _cross_entropy,
                 "optimizer": None, "out_dir": tmp_path, **kwargs}
    if arguments["optimizer"] == "optimizer instance":
        arguments["optimizer"] = torch.optim.SGD(model.parameters())
    with pytest.raises(EstimateError, match=expected):
        estimate(**arguments)


def test_the_trace_is_a_normal_trace_marked_as_an_estimate(tmp_path):
    model, batch, loss_fn = CASES["transformer"].build()
    predicted = estimate(model, batch, loss_fn, ADAMW, out_dir=tmp_path, run_id="tiny-gpt")
    assert predicted.run_dir == tmp_path / "tiny-gpt"
    meta = json.loads((predicted.run_dir / "meta.json").read_text())
    assert meta["estimate"] is True and meta["modelled_device"] == "cpu" and meta["status"] == "closed"
    assert meta["fake_mode"].endswith("FakeTensorMode") and meta["allocator_source"] == "fake-tensors"
    trace = load_trace(predicted.run_dir)
    assert list(trace.iterations.iteration) == [0, 1] and trace.detail_iterations == [0, 1]
    layers = trace.layers[trace.layers.iteration == 1].set_index("module")
    assert layers.loc["h.0", "forward_ms"] > 0 and layers.loc["h.0", "backward_ms"] > layers.loc["h.0", "forward_ms"]
    assert layers.loc["h.0", "output_bytes"] == 16 * 32 * 64 * 4  # (batch, seq, dim) float32


def test_the_planner_plans_a_schedule_from_an_estimate(tmp_path):
    from planner import min_feasible_budget, simulate, solve, store_all_budget
    from planner.discovery.from_trace import chain_from_trace

    model, batch, loss_fn = CASES["gpt2"].build()
    predicted = estimate(model, batch, loss_fn, ADAMW, out_dir=tmp_path)
    chain = chain_from_trace(load_trace(predicted.run_dir))
    assert [s.modules[0] for s in chain.stages[:-1]][-4:] == [f"transformer.h.{i}" for i in range(4)]
    assert store_all_budget(chain) == predicted.peak_bytes  # the chain's store-all is the estimated step
    budget = min_feasible_budget(chain, "rotor")
    assert budget < predicted.peak_bytes
    schedule = solve(chain, budget, "rotor")
    assert simulate(chain, schedule).peak_bytes <= chain.step.chain_budget_bytes(budget)


def test_forward_and_backward_only_without_an_optimizer(tmp_path):
    model, batch, loss_fn = CASES["mlp"].build()
    predicted = estimate(model, batch, loss_fn, None, out_dir=tmp_path)
    assert predicted.categories_at_peak_bytes[Category.OPTIMIZER_STATE] == 0
    assert predicted.peak_phase == "backward"


def test_cuda_is_modelled_with_the_caching_allocator(tmp_path):
    model, batch, loss_fn = CASES["transformer"].build()
    cpu = estimate(model, batch, loss_fn, ADAMW, out_dir=tmp_path / "cpu")
    cuda = estimate(model, batch, loss_fn, ADAMW, device="cuda", out_dir=tmp_path / "cuda")
    assert cpu.reserved_peak_bytes is None and cuda.device == "cuda"
    assert cuda.peak_bytes % 512 == 0  # every block of the caching allocator is
    assert cpu.peak_bytes <= cuda.peak_bytes <= cpu.peak_bytes * 1.05
    assert cuda.reserved_peak_bytes is not None and cuda.reserved_peak_bytes >= cuda.peak_bytes
    assert cuda.reserved_peak_bytes % (2 << 20) == 0  # segments are 2 MiB, 20 MiB or multiples of 2 MiB
    meta = json.loads((cuda.run_dir / "meta.json").read_text())
    assert meta["modelled_device"] == "cuda" and meta["ops_device"] in ("cpu", "cuda")


@torch.library.custom_op("memprof_tests::double_without_fake", mutates_args=())
def _double_without_fake(x: torch.Tensor) -> torch.Tensor:
    return x * 2


class _CustomOp(_Masked):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _double_without_fake(self.lin(x)).sum()


def test_an_operator_without_a_fake_implementation_raises_naming_it(tmp_path):
    with pytest.raises(EstimateError, match="has no fake-tensor .meta. implementation") as caught:
        estimate(_CustomOp(), torch.randn(4, 8), lambda m, b: m(b), out_dir=tmp_path)
    assert caught.value.op == "memprof_tests.double_without_fake.default"


def test_the_users_own_errors_pass_through_without_a_logged_traceback(tmp_path, capfd):
    model = nn.Linear(4, 3)
    with pytest.raises(RuntimeError, match="must have same reduction dim") as caught:
        estimate(model, (torch.randn(2, 5), torch.tensor([0, 1])), _cross_entropy, out_dir=tmp_path)
    assert not isinstance(caught.value, EstimateError)  # a mistake in the model, as the real step would raise
    assert "Traceback" not in capfd.readouterr().err
