"""What an allocation's stack frames say: the phase of the step, the module calls it happened in, its category.

A snapshot's frames are ``{"filename", "line", "name"}`` dicts, innermost first; Python frames have a
``.py`` file name, C++ frames (``stacks="all"``) anything else. The rules (``docs/trace-format.md``,
"PyTorch snapshots") are applied to allocations only, in this order:

1. frames memprof wrote itself (``memprof/...`` file names, see :mod:`memprof.interop.exporter`) name the
   category, phase, module and iteration exactly;
2. autograd's backward (the C++ engine's frames or a node's ``...Backward0::apply``, ``torch/autograd``
   ``backward``, activation checkpointing's recomputation) -> ``backward``;
3. a frame in ``torch/optim/`` -> ``optimizer``;
4. a call of an ``nn.Module`` (torch's ``_call_impl`` frame) -> ``forward``, in the chain of module calls the
   frames show;
5. creating or moving parameters (``Module._apply``/``to``/``cuda``, ``nn/parameter.py``, the ``__init__``
   of a module in ``torch/nn/modules``) -> ``other`` phase, category ``weights``;
6. any other frames -> ``other``; no frames at all -> nothing known (see :mod:`memprof.interop.steps`).

Torch-free.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from memprof.categories import Category
from memprof.phases import Phase

#: File names of the frames memprof writes into exported snapshots (and reads back exactly).
CATEGORY_FILE = "memprof/category"
PHASE_FILE = "memprof/phase"
MODULE_FILE = "memprof/module"
ITERATION_FILE = "memprof/iteration"
_MEMPROF_PREFIX = "memprof/"

_MODULE_PY = "torch/nn/modules/module.py"
_WEIGHT_FUNCTIONS = frozenset({"_apply", "to", "cuda", "to_empty", "convert"})
_BACKWARD_PY = {
    "torch/autograd/__init__.py": frozenset({"backward", "grad"}),
    "torch/_tensor.py": frozenset({"backward"}),
    "torch/autograd/graph.py": frozenset({"_engine_run_backward"}),
    "torch/utils/checkpoint.py": frozenset({"unpack_hook", "recompute_fn", "backward"}),
}
#: C++ frames only autograd's backward engine runs (forward ops pass through ``torch::autograd::VariableType``
#: and build nodes, but never enter the engine or a node's ``apply``).
_BACKWARD_CPP = ("autograd::Engine::", "PythonEngine::")


@dataclass(frozen=True)
class ModuleCall:
    """One ``nn.Module`` call in an allocation's stack.

    Attributes:
        component: its part of the module's name: the callee's file and the line that called it,
            ``linear@model:23`` (the ``forward`` in ``linear.py``, called at line 23 of ``model.py``).
        kind: the callee, ``linear.py:forward`` (a snapshot does not name classes).
    """

    component: str
    kind: str


@dataclass(frozen=True)
class Label:
    """What one allocation's frames say.

    Attributes:
        phase: the phase of the step, or ``None`` when the frames say nothing (no frames).
        calls: the module calls it happened in, outermost first (empty outside a module's forward).
        category: the category the frames decide alone (``weights``; every category for memprof's frames).
        iteration: the iteration memprof's frames name (``None`` for PyTorch's own snapshots).
        exact: the frames are memprof's: ``calls`` are the parts of a qualified module name.
    """

    phase: Phase | None
    calls: tuple[ModuleCall, ...] = ()
    category: Category | None = None
    iteration: int | None = None
    exact: bool = False


NO_FRAMES = Label(None)


def _text(frame: Mapping[str, Any], key: str) -> str:
    value = frame.get(key, "")
    return value.replace("\\", "/") if isinstance(value, str) else str(value)


def _line(frame: Mapping[str, Any]) -> int:
    value = frame.get("line", 0)
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _stem(filename: str) -> str:
    base = filename.rsplit("/", 1)[-1]
    return (base[:-3] if base.endswith(".py") else base).replace(".", "_") or "?"


class Labeler:
    """:func:`label` with a memory: a trace repeats the same few hundred stacks (PyTorch even shares their lists)."""

    def __init__(self) -> None:
        self._by_id: dict[int, tuple[Sequence[Mapping[str, Any]], Label]] = {}
        self._by_content: dict[tuple, Label] = {}

    def __call__(self, frames: Sequence[Mapping[str, Any]]) -> Label:
        """The label of ``frames``."""
        known = self._by_id.get(id(frames))
        if known is not None and known[0] is frames:
            return known[1]
        key = tuple((f.get("filename"), f.get("line"), f.get("name")) for f in frames)
        found = self._by_content.get(key)
        if found is None:
            found = self._by_content[key] = label(frames)
        self._by_id[id(frames)] = (frames, found)  # keeps the list alive, so its id is not reused
        return found


def label(frames: Sequence[Mapping[str, Any]]) -> Label:
    """Applies the rules of the module docstring to an allocation's frames."""
    if not frames:
        return NO_FRAMES
    if any(_text(f, "filename").startswith(_MEMPROF_PREFIX) for f in frames):
        return _memprof_label(frames)
    python = [f for f in frames if _text(f, "filename").endswith(".py")]
    if _in_backward(frames, python):
        return Label(Phase.BACKWARD)
    if any("torch/optim/" in _text(f, "filename") for f in python):
        return Label(Phase.OPTIMIZER)
    calls = module_calls(python)
    if calls:
        return Label(Phase.FORWARD, calls)
    if _makes_weights(python):
        return Label(Phase.OTHER, category=Category.WEIGHTS)
    return Label(Phase.OTHER)


def static_category(frames: Sequence[Mapping[str, Any]]) -> Category:
    """The category of a block whose allocation the trace did not see (alive when its history began)."""
    found = label(frames)
    if found.category is not None:
        return found.category
    return {Phase.BACKWARD: Category.WEIGHT_GRADS, Phase.OPTIMIZER: Category.OPTIMIZER_STATE,
            Phase.FORWARD: Category.FEATURE_MAPS}.get(found.phase or Phase.OTHER, Category.OTHER)


def zero_grad_frames(frames: Sequence[Mapping[str, Any]]) -> bool:
    """Whether the frames are inside ``zero_grad`` (an optimizer's or a module's): it frees weight gradients."""
    return any(_text(f, "name") == "zero_grad" and (_text(f, "filename").endswith(_MODULE_PY)
                                                    or "torch/optim/" in _text(f, "filename")) for f in frames)


def _in_backward(frames: Sequence[Mapping[str, Any]], python: Sequence[Mapping[str, Any]]) -> bool:
    for frame in python:
        filename = _text(frame, "filename")
        for suffix, names in _BACKWARD_PY.items():
            if filename.endswith(suffix) and _text(frame, "name") in names:
                return True
    for frame in frames:
        name = _text(frame, "name")
        if any(marker in name for marker in _BACKWARD_CPP) or ("Backward" in name and "::apply" in name):
            return True
    return False


def _makes_weights(python: Sequence[Mapping[str, Any]]) -> bool:
    for frame in python:
        filename, name = _text(frame, "filename"), _text(frame, "name")
        if filename.endswith(_MODULE_PY) and name in _WEIGHT_FUNCTIONS:
            return True
        if filename.endswith("torch/nn/parameter.py") or ("torch/nn/modules/" in filename and name == "__init__"):
            return True
    return False


def module_calls(python: Sequence[Mapping[str, Any]]) -> tuple[ModuleCall, ...]:
    """The ``nn.Module`` calls in Python frames (innermost first), outermost first.

    Each call shows as torch's ``_call_impl`` frame in ``module.py``; the frame it calls (the first one
    inside it outside ``module.py``) is the module's ``forward``, the first one outside it is the caller.
    """
    calls: list[ModuleCall] = []
    for i, frame in enumerate(python):
        if not (_text(frame, "filename").endswith(_MODULE_PY) and _text(frame, "name") == "_call_impl"):
            continue
        callee = next((python[j] for j in range(i - 1, -1, -1) if not _is_module_py(python[j])), None)
        caller = next((python[j] for j in range(i + 1, len(python)) if not _is_module_py(python[j])), None)
        callee_name = _text(callee, "name") if callee is not None else "forward"
        callee_file = _text(callee, "filename") if callee is not None else _MODULE_PY
        part = _stem(callee_file) + ("" if callee_name == "forward" else f"-{callee_name.replace('.', '_')}")
        where = f"{_stem(_text(caller, 'filename'))}:{_line(caller)}" if caller is not None else "?"
        calls.append(ModuleCall(f"{part}@{where}", f"{callee_file.rsplit('/', 1)[-1]}:{callee_name}"))
    return tuple(reversed(calls))


def _is_module_py(frame: Mapping[str, Any]) -> bool:
    return _text(frame, "filename").endswith(_MODULE_PY)


def _memprof_label(frames: Sequence[Mapping[str, Any]]) -> Label:
    found: dict[str, Mapping[str, Any]] = {_text(f, "filename"): f for f in frames}
    category = phase = None
    if CATEGORY_FILE in found:
        category = next((c for c in Category if c.value == _text(found[CATEGORY_FILE], "name")), None)
    if PHASE_FILE in found:
        phase = next((p for p in Phase if p.value == _text(found[PHASE_FILE], "name")), None)
    calls: tuple[ModuleCall, ...] = ()
    if MODULE_FILE in found and _text(found[MODULE_FILE], "name"):
        parts = _text(found[MODULE_FILE], "name").split(".")
        calls = tuple(ModuleCall(part, "module") for part in parts)
    iteration = _line(found[ITERATION_FILE]) if ITERATION_FILE in found else None
    return Label(phase or Phase.OTHER, calls, category, iteration, exact=True)


def memprof_frames(category: str, phase: str, module: str, iteration: int, event: str) -> list[dict[str, Any]]:
    """The frames an exported allocation carries: memory_viz shows them, :func:`label` reads them back."""
    return [
        {"filename": CATEGORY_FILE, "line": 0, "name": category},
        {"filename": MODULE_FILE, "line": 0, "name": module},
        {"filename": PHASE_FILE, "line": 0, "name": phase},
        {"filename": ITERATION_FILE, "line": iteration, "name": event},
    ]
