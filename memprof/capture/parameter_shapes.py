"""The shapes and dtypes of the profiled model's parameters, for ``meta.json`` (key ``parameter_shapes``).

The planner puts them into a chain's signature (``planner.discovery.signature``), so that a schedule planned
from this run refuses a model whose blocks have other shapes (a wider or narrower model of the same family).
"""

from __future__ import annotations

from typing import Any

from torch import nn

#: The ``meta.json`` key: qualified parameter name (relative to the profiled root, each parameter once, as
#: ``named_parameters()`` lists them) -> ``[dims..., dtype]``, e.g. ``"h.0.attn.c_attn.weight": [64, 192, "float32"]``.
PARAMETER_SHAPES_KEY = "parameter_shapes"


def parameter_shapes(model: nn.Module) -> dict[str, list[Any]] | None:
    """Each parameter's ``[dims..., dtype]`` by qualified name; ``None`` while a lazy module's parameter has no
    shape yet (the planner then compares the layers' parameter bytes instead).

    A sharded parameter (FSDP2's ``DTensor``) has its whole shape, as on a single device.
    """
    out: dict[str, list[Any]] = {}
    for name, param in model.named_parameters():
        if isinstance(param, nn.parameter.UninitializedParameter):
            return None
        out[name] = [*(int(d) for d in param.shape), str(param.dtype).removeprefix("torch.")]
    return out


def parameter_shapes_meta(model: nn.Module) -> dict[str, Any]:
    """``{"parameter_shapes": ...}`` for ``meta.json``, or ``{}`` when the shapes are not known yet."""
    shapes = parameter_shapes(model)
    return {} if shapes is None else {PARAMETER_SHAPES_KEY: shapes}
