"""The check of a live model against a chain's signature, on small modules whose signatures are written by hand."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from planner.executor.model_check import (
    MISMATCH_ADVICE,
    check_model,
    model_differences,
    unwatch_input,
    unwrap_model,
    watch_input,
)


def mlp(width: int = 4, depth: int = 2, dtype: torch.dtype = torch.float32) -> nn.Sequential:
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, width, dtype=dtype), nn.Tanh()]
    return nn.Sequential(*layers)


def linear(width: int) -> dict:
    return {"weight": [width, width, "float32"], "bias": [width, "float32"]}


#: The planned model: mlp(4, 2), stages 0..3 (Linear, Tanh, Linear, Tanh), each a child of the root.
SIGNATURE = {
    "root": {"kind": "Sequential", "parameter_count": 2 * (16 + 4), "weight_bytes": None},
    "input_bytes": 3 * 4 * 4,
    "modules": [{"name": "0", "kind": "Linear", "parameters": linear(4)},
                {"name": "1", "kind": "Tanh", "parameters": {}},
                {"name": "2", "kind": "Linear", "parameters": linear(4)},
                {"name": "3", "kind": "Tanh", "parameters": {}}],
    "containers": [{"name": "", "children": ["0", "1", "2", "3"]}],
}


def texts(model: nn.Module, signature: dict = SIGNATURE, container: str = "") -> list[str]:
    return [d.text for d in model_differences(model, signature, container)]


def test_the_planned_model_and_a_copy_with_other_weights_have_no_differences() -> None:
    assert texts(mlp()) == []
    torch.manual_seed(3)
    assert texts(mlp()) == []
    check_model(mlp(), SIGNATURE)


def test_a_deeper_model_is_named_by_its_blocks() -> None:
    assert texts(mlp(depth=3)) == [
        "this schedule was planned for a Sequential whose top level has 4 blocks (0..3); this model's has 6 blocks "
        "(0..5)",
        "this schedule was planned for a Sequential of 40 parameters; this model has 60",
    ]
    with pytest.raises(ValueError) as caught:
        check_model(mlp(depth=3), SIGNATURE)
    message = str(caught.value)
    assert "\n" not in message
    assert message == ("this schedule was planned for a Sequential whose top level has 4 blocks (0..3); this model's "
                       f"has 6 blocks (0..5) (and 1 other difference): {MISMATCH_ADVICE}")


def test_other_blocks_are_refused_even_with_strict_false() -> None:
    found = model_differences(mlp(depth=1), SIGNATURE)
    assert [(d.text, d.fatal) for d in found] == [
        ("this schedule was planned for a Sequential whose top level has 4 blocks (0..3); this model's has 2 blocks "
         "(0..1)", True),
        ("this model has no module 2, which the schedule runs as a stage (a Linear in the planned model)", True),
        ("this model has no module 3, which the schedule runs as a stage (a Tanh in the planned model)", True),
        ("this schedule was planned for a Sequential of 40 parameters; this model has 20", False),
    ]
    for depth in (1, 3):  # a deeper model's extra blocks would run between the stages or inside one: wrongly
        with pytest.raises(ValueError, match=r"^this schedule was planned for a Sequential whose top level has 4 "
                                             r"blocks .* \(even with strict=False, a schedule runs only on the blocks"):
            check_model(mlp(depth=depth), SIGNATURE, strict=False)


def test_a_wider_model_names_the_first_parameter_of_another_shape() -> None:
    assert texts(mlp(width=8))[:2] == ["0.weight is (8, 8) here, (4, 4) in the planned model",
                                       "0.bias is (8,) here, (4,) in the planned model"]
    assert texts(mlp(width=8))[-1] == "this schedule was planned for a Sequential of 40 parameters; this model has 144"


def test_another_dtype_is_a_difference() -> None:
    assert texts(mlp(dtype=torch.float64)) == [f"{n} is float64 here, float32 in the planned model"
                                               for n in ("0.weight", "0.bias", "2.weight", "2.bias")]


def test_another_class_is_named_first() -> None:
    other = nn.Sequential(nn.Conv1d(4, 4, 1), nn.Tanh(), nn.Linear(4, 4), nn.Tanh())
    assert texts(other)[0] == "0 is a Conv1d here, a Linear in the planned model"

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = mlp()

    assert texts(Net())[0] == "this schedule was planned for a Sequential; this model is a Net"


def test_strict_false_applies_with_one_warning_saying_the_prediction_does_not_hold() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_model(mlp(width=8), SIGNATURE, strict=False)
    assert [str(w.message) for w in caught] == [
        "0.weight is (8, 8) here, (4, 4) in the planned model (and 4 other differences); the schedule is applied "
        "anyway (strict=False): its memory prediction does not hold for this model"]


def test_wrappers_and_sharded_subclasses_are_the_model_they_wrap() -> None:
    model = mlp()
    compiled = torch.compile(model)  # not run: nothing is compiled
    assert unwrap_model(compiled) is model
    assert texts(compiled) == []

    class FSDPLinear(nn.Linear):  # what FSDP2's fully_shard makes of a Linear's class
        pass

    sharded = nn.Sequential(FSDPLinear(4, 4), nn.Tanh(), nn.Linear(4, 4), nn.Tanh())
    assert texts(sharded) == []


def test_a_tied_parameter_listed_elsewhere_and_a_parameterless_extra_child_are_no_difference() -> None:
    model = mlp()
    model.add_module("4", nn.Identity())  # never ran, no parameters: not in a trace's layers
    assert texts(model) == []
    tied = mlp()
    tied[2].weight = tied[0].weight  # planned so: named_parameters() lists it once, as 0.weight
    signature = {**SIGNATURE, "root": {**SIGNATURE["root"], "parameter_count": 16 + 8},
                 "modules": [{**m, "parameters": {"bias": [4, "float32"]}} if m["name"] == "2" else m
                             for m in SIGNATURE["modules"]]}
    assert texts(tied, signature) == []
    assert texts(mlp(), signature) == ["2.weight is a parameter here, not in the planned model",
                                       "this schedule was planned for a Sequential of 24 parameters; this model has 40"]


def test_without_parameter_shapes_the_weight_bytes_are_compared() -> None:
    signature = {"root": {"kind": "Sequential", "parameter_count": None, "weight_bytes": 160},
                 "modules": [{"name": "0", "kind": "Linear", "weight_bytes": 80}], "containers": []}
    assert texts(mlp(), signature) == []
    assert texts(mlp(width=8), signature) == [
        "0 holds 288 bytes of parameters here, 80 in the planned model",  # (8 * 8 + 8) * 4
        "this schedule was planned for a Sequential holding 160 bytes of parameters; this model holds 576"]


def test_under_a_container_the_root_is_not_checked() -> None:
    class Net(nn.Module):
        def __init__(self, depth: int) -> None:
            super().__init__()
            self.body = mlp(depth=depth)

    relative = {**SIGNATURE, "root": {}}
    assert texts(Net(2), relative, container="body") == []
    assert texts(Net(3), relative, container="body") == [
        "this schedule was planned for a model whose top level has 4 blocks (0..3); this model's has 6 blocks (0..5)"]


def test_named_children_that_differ_are_named() -> None:
    signature = {"root": {"kind": "Sequential"}, "modules": [{"name": "a", "kind": "Linear"}],
                 "containers": [{"name": "", "children": ["a", "b"]}]}
    model = nn.Sequential()
    model.add_module("a", nn.Linear(2, 2))
    model.add_module("c", nn.Linear(2, 2))
    assert texts(model, signature) == [
        "this schedule was planned for a Sequential whose top level has children a, b; this model's has no b and c "
        "besides"]


def test_the_input_watch_warns_once_for_another_input_size_in_training_only() -> None:
    model = mlp()
    watch_input(model, model[0], 3 * 4 * 4, "0")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model(torch.randn(3, 4))  # as planned
        with torch.no_grad():
            model(torch.randn(5, 4))  # not training
        model.eval()
        model(torch.randn(5, 4))
        model.train()
        model(torch.randn(5, 4))
        model(torch.randn(7, 4))  # said once
    assert [str(w.message) for w in caught] == [
        "this forward's stage-1 input (0) is 80 bytes; the schedule was planned for 48 (another batch or sequence "
        "length): it runs, with the same gradients, but its memory prediction does not hold for this input"]
    unwatch_input(model)
    assert not model[0]._forward_pre_hooks
