"""The model signature a chain carries: its JSON round trip (alone, in a chain, in a schedule) and its validation."""

from __future__ import annotations

import json
import re

import pytest

from planner.errors import ChainError
from planner.model.chain import Chain
from planner.model.schedule import Schedule
from planner.model.signature import ContainerSpec, ModelSignature, ModuleSpec, ParameterSpec
from tests.planner import models as M


def gpt2_like() -> ModelSignature:
    """Two blocks of a made-up model, written by hand."""
    block = (ParameterSpec("ln.weight", (64,), "float32"), ParameterSpec("attn.weight", (64, 192), "float32"))
    return ModelSignature(
        root_kind="TinyLM", parameter_count=2 * (64 + 64 * 192), input_bytes=2 * 32 * 64 * 4,
        modules=(ModuleSpec("body.h.0", "Block", block), ModuleSpec("body.h.1", "Block", block)),
        containers=(ContainerSpec("body.h", ("0", "1")),),
    )


def test_the_json_form_is_as_documented() -> None:
    raw = gpt2_like().to_dict()
    assert raw == {
        "root": {"kind": "TinyLM", "parameter_count": 24704, "weight_bytes": None},
        "input_bytes": 16384,
        "modules": [{"name": f"body.h.{i}", "kind": "Block",
                     "parameters": {"ln.weight": [64, "float32"], "attn.weight": [64, 192, "float32"]}}
                    for i in range(2)],
        "containers": [{"name": "body.h", "children": ["0", "1"]}],
    }


def test_round_trip_through_json_alone_in_a_chain_and_in_a_schedule() -> None:
    signature = gpt2_like()
    assert ModelSignature.from_dict(json.loads(json.dumps(signature.to_dict()))) == signature
    chain = Chain("c", 10, M.chain(2, [["body.h.0"], ["body.h.1"]]).stages, signature=signature)
    assert Chain.from_json(chain.to_json()).signature == signature
    schedule = M.schedule(M.revolve(2), chain)
    assert Schedule.from_json(schedule.to_json()).chain.signature == signature


def test_a_fallback_module_keeps_its_weight_bytes_and_no_parameters() -> None:
    fallback = ModelSignature(root_kind="M", weight_bytes=168, modules=(ModuleSpec("0", "Linear", None, 168),))
    raw = fallback.to_dict()
    assert raw["modules"] == [{"name": "0", "kind": "Linear", "weight_bytes": 168}]
    assert raw["root"] == {"kind": "M", "parameter_count": None, "weight_bytes": 168}
    assert ModelSignature.from_dict(raw) == fallback


def test_older_json_without_a_signature_still_loads() -> None:
    chain = Chain("c", 10, M.chain(2, [["a"], ["b"]]).stages, signature=gpt2_like())
    raw = json.loads(chain.to_json())
    del raw["signature"]
    assert Chain.from_json(raw).signature is None
    assert "signature" not in json.loads(Chain.from_json(raw).to_json())


def test_the_signature_does_not_change_what_a_chain_is_equal_to() -> None:
    plain = M.chain(2, [["a"], ["b"]])
    assert Chain(plain.name, plain.input_bytes, plain.stages, signature=gpt2_like()) == plain


@pytest.mark.parametrize(("mutate", "expected"), [
    (lambda raw: raw.update(modules="x"), "'modules' must be a list"),
    (lambda raw: raw.update(input_bytes=-1), "input_bytes must be a whole number >= 0 or null, found -1"),
    (lambda raw: raw["root"].update(parameter_count=1.5), "parameter_count must be a whole number"),
    (lambda raw: raw["modules"][0]["parameters"].update({"ln.weight": [64]}), "must be [dims..., dtype]"),
    (lambda raw: raw["modules"][0]["parameters"].update({"ln.weight": [-1, "float32"]}), "expected whole numbers"),
    (lambda raw: raw["modules"][0].pop("kind"), "a module is an object with 'name' and 'kind'"),
    (lambda raw: raw["modules"].append(raw["modules"][0]), "a module is listed twice"),
    (lambda raw: raw["containers"][0].update(children=["0", "0"]), "names a child twice"),
    (lambda raw: raw["containers"][0].update(children="01"), "children must be a list of names"),
    (lambda raw: raw.update(root=[]), "'root' must be an object"),
])
def test_malformed_signatures_are_refused_saying_what_is_wrong(mutate, expected: str) -> None:
    raw = json.loads(json.dumps(gpt2_like().to_dict()))
    mutate(raw)
    with pytest.raises(ChainError, match=re.escape(expected)):
        ModelSignature.from_dict(raw)


def test_a_chain_refuses_a_signature_of_another_type() -> None:
    with pytest.raises(ChainError, match="signature must be a ModelSignature or None, found dict"):
        Chain("c", 10, M.chain(1).stages, signature={"modules": []})  # type: ignore[arg-type]


def test_relative_to_a_container_drops_the_root_and_the_prefix() -> None:
    relative = gpt2_like().relative_to("body.h")
    assert [m.name for m in relative.modules] == ["0", "1"]
    assert relative.containers == (ContainerSpec("", ("0", "1")),)
    assert (relative.root_kind, relative.parameter_count, relative.input_bytes) == (None, None, 16384)
    assert gpt2_like().relative_to("") == gpt2_like()
