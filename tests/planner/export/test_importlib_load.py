"""The exported file loaded with importlib.util alone (spec_from_file_location and exec_module, no sys.modules
entry), then trained under torch.compile.

Dynamo imports by name the module of each function it traces that reads a global (the embeddings' forward the file
installs is one): without a sys.modules entry it failed with "No module named 's'". The file now registers its own
module when it is missing (a second file loaded under the same name gets a name of its own).
"""

from __future__ import annotations

import copy
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from planner.export.files import export_python
from tests.planner import models as M


@pytest.fixture
def loaded(tmp_path: Path):
    """Loads exported files as a user would, without registering them; forgets them afterwards."""
    before = set(sys.modules)

    def load(source: str, name: str = "s") -> ModuleType:
        path = tmp_path / f"{name}_{len(set(sys.modules) - before)}.py"
        path.write_text(source, encoding="utf-8")
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    yield load
    for name in set(sys.modules) - before:
        if name == "s" or name.startswith("s_"):
            del sys.modules[name]


def _model() -> nn.Sequential:
    """An embedding, 3 blocks (the stages, ``1`` .. ``3``) and a head; no dropout (compiled dropout draws other
    masks than eager)."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Embedding(11, 8), *(nn.Sequential(nn.Linear(8, 8), nn.Tanh()) for _ in range(3)),
                         nn.Linear(8, 11))


def _schedule_source() -> str:
    return export_python(M.schedule(M.revolve(3), M.chain(3, [[str(i)] for i in range(1, 4)])))


def _compiled_step(model, ids: torch.Tensor, target: torch.Tensor) -> list[torch.Tensor]:
    model.zero_grad(set_to_none=True)
    compiled = torch.compile(model, backend="aot_eager")
    F.cross_entropy(compiled(ids).flatten(0, 1), target).backward()
    return [p.grad for p in model.parameters()]


def test_a_file_loaded_without_sys_modules_registers_itself(loaded) -> None:
    first = loaded(_schedule_source())
    assert "s" in sys.modules and sys.modules["s"] is first
    second = loaded(_schedule_source())  # the same name again: its own entry, its own name
    assert second.__name__ != "s" and sys.modules[second.__name__] is second
    assert sys.modules["s"] is first


@pytest.mark.slow
def test_a_model_scheduled_by_such_a_file_trains_under_torch_compile(loaded) -> None:
    torch._dynamo.reset()
    model = _model()
    ids = torch.randint(0, 11, (2, 5), generator=torch.Generator().manual_seed(3))
    target = torch.randint(0, 11, (10,), generator=torch.Generator().manual_seed(4))
    scheduled = loaded(_schedule_source()).apply_schedule(copy.deepcopy(model))
    assert "forward" in scheduled[0].__dict__  # the embedding's forward is the file's, which dynamo traces
    expected = _compiled_step(model, ids, target)
    got = _compiled_step(scheduled, ids, target)  # raised "No module named 's'" before
    assert all(torch.equal(a, b) for a, b in zip(expected, got))
