"""A chain's :class:`~planner.model.signature.ModelSignature`, from the run it was found in.

The stage modules' kinds, the children of the containers holding them and the root's class come from the
``layers`` table (every module that ran or holds parameters) of the iteration the chain's structure comes from;
the parameters' shapes and dtypes from ``meta.json``'s ``parameter_shapes``
(:mod:`memprof.capture.parameter_shapes`). A run recorded before that key falls back to the layers'
``weight_bytes`` (each stage module's, and the root's).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from memprof.trace import Trace
from planner.discovery.costed import structure_iteration
from planner.errors import ChainError
from planner.model.chain import Chain
from planner.model.signature import ContainerSpec, ModelSignature, ModuleSpec, ParameterSpec

#: ``meta.json``'s key (written by :mod:`memprof.capture.parameter_shapes`; the planner does not import capture).
PARAMETER_SHAPES_KEY = "parameter_shapes"


def with_signature(trace: Trace, chain: Chain) -> Chain:
    """``chain`` with the signature of the model it was found in (the chain as it is when it names no modules)."""
    names = list(dict.fromkeys(m for stage in chain.stages[:-1] for m in stage.modules))
    if not names:
        return chain
    layers = trace.read("layers", columns=["iteration", "module", "parent", "kind", "weight_bytes"],
                        iterations=structure_iteration(trace))
    rows = {str(m): (str(p), str(k), int(w)) for m, p, k, w in zip(layers.module, layers.parent, layers.kind,
                                                                   layers.weight_bytes)}
    shapes = _shapes(trace.meta.get(PARAMETER_SHAPES_KEY))
    parents = list(dict.fromkeys(name.rpartition(".")[0] for name in names))
    root = rows.get("", ("", str(trace.meta.get("model") or ""), 0))
    signature = ModelSignature(
        root_kind=str(trace.meta.get("model") or root[1]) or None,
        parameter_count=None if shapes is None else sum(math.prod(shape) for shape, _ in shapes.values()),
        weight_bytes=root[2] if shapes is None and "" in rows else None,
        input_bytes=chain.input_bytes,
        modules=tuple(_module(name, rows, shapes) for name in names),
        containers=tuple(ContainerSpec(parent, _children(parent, rows)) for parent in parents),
    )
    return replace(chain, signature=signature)


def _module(name: str, rows: Mapping[str, tuple[str, str, int]], shapes: Mapping[str, tuple] | None) -> ModuleSpec:
    kind, weight_bytes = rows[name][1:] if name in rows else ("", 0)
    if shapes is None:
        return ModuleSpec(name, kind, None, weight_bytes if name in rows else None)
    prefix = f"{name}." if name else ""
    parameters = tuple(ParameterSpec(full[len(prefix):], shape, dtype) for full, (shape, dtype) in shapes.items()
                       if full.startswith(prefix))
    return ModuleSpec(name, kind, parameters)


def _children(parent: str, rows: Mapping[str, tuple[str, str, int]]) -> tuple[str, ...]:
    """The children of ``parent`` that ran or hold parameters (the rows are in the model's module order)."""
    return tuple(name.rpartition(".")[2] for name, (up, _, _) in rows.items() if name and up == parent)


def _shapes(raw: Any) -> dict[str, tuple[tuple[int, ...], str]] | None:
    """``meta.json``'s ``parameter_shapes`` as name -> (shape, dtype); ``None`` where the run has none.

    Raises:
        ChainError: the key is there but malformed (not name -> [dims..., dtype]).
    """
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise ChainError(f"meta.json's {PARAMETER_SHAPES_KEY} must map parameter names to [dims..., dtype], found "
                         f"{type(raw).__name__}")
    out = {}
    for name, entry in raw.items():
        if (not isinstance(entry, Sequence) or isinstance(entry, str) or not entry or not isinstance(entry[-1], str)
                or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in entry[:-1])):
            raise ChainError(f"meta.json's {PARAMETER_SHAPES_KEY}[{name!r}] must be [dims..., dtype], found {entry!r}")
        out[str(name)] = (tuple(entry[:-1]), entry[-1])
    return out
