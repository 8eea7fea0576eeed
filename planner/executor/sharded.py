"""Stages sharded with FSDP2 (``torch.distributed.fsdp.fully_shard``): their parameters gathered for the runs that
FSDP's own hooks do not see.

Part of the pure-torch runtime (imports only ``torch`` and the standard library). FSDP2 all-gathers a module's
parameters in its forward pre-hook and in a pre-backward hook on its outputs, and frees them after each. The
executor runs a stage's modules through their own ``forward`` methods, so two runs happen outside those hooks:
a recomputation during backward (of a stage whose backward has not started) and, in a stage of several modules,
the modules after the first. Around those, the stage's sharded FSDP modules are gathered (``unshard``) and
freed again (``reshard``): a recording keeps references to the gathered parameters, whose storage FSDP frees and
gathers again, in place, before the stage's backward, as it does for any forward it hooks. Modules already
gathered (by FSDP's hooks, for the stage whose call or backward is running) are left to FSDP.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import nn

__all__ = ["gathered", "sharded_modules"]


def sharded_modules(modules: Sequence[nn.Module]) -> list[nn.Module]:
    """The FSDP2 modules among ``modules`` and their submodules (``[]`` without FSDP2).

    FSDP2 needs a process group, so without one (a single process) no module is walked: a stage runs this at
    every forward.
    """
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return []
    return [sub for module in modules for sub in module.modules() if _groups(sub)]


def _groups(module: nn.Module) -> list[Any]:
    get_state = getattr(module, "_get_fsdp_state", None)
    if get_state is None or not callable(getattr(module, "unshard", None)):
        return []
    return list(getattr(get_state(), "_fsdp_param_groups", None) or [])


@contextlib.contextmanager
def gathered(modules: Sequence[nn.Module]) -> Iterator[None]:
    """Gathers the parameters of the FSDP2 modules in ``modules`` that are sharded now, for the block's duration.

    Args:
        modules: FSDP2 modules (:func:`sharded_modules`); an empty list does nothing.
    """
    todo = [m for m in modules if not all(getattr(g, "is_unsharded", True) for g in _groups(m))]
    for module in todo:
        getattr(module, "unshard")()  # noqa: B009  (FSDPModule's methods, unknown to nn.Module's type)
    try:
        yield
    finally:
        for module in todo:
            getattr(module, "reshard")()  # noqa: B009
