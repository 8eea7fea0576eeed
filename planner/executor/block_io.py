"""What a block's call and result look like to the runtime: where its running activation is among the
arguments, which of its outputs are the activation and which are secondary, and what may come between
two stages.

Part of the pure-torch runtime (imports only ``torch`` and the standard library; ``planner.export.files`` embeds it
in the files it writes).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import torch


def key_value_cache(args: tuple, kwargs: dict[str, Any]) -> str | None:
    """The class name of a Hugging Face key/value cache among a call's arguments (``DynamicCache``), if any.

    Found by its base class's name and module, so the runtime needs no ``transformers`` import.
    """
    for value in (*args, *kwargs.values()):
        if any(k.__name__ == "Cache" and k.__module__.startswith("transformers") for k in type(value).__mro__):
            return type(value).__name__
    return None


def find_activation(args: tuple, kwargs: dict[str, Any], previous: torch.Tensor | None) -> tuple[torch.Tensor, int | str]:
    """The running activation among a call's arguments and where it is.

    It is the argument that shares storage with ``previous`` (the last stage's output) when given, else the
    first tensor argument (positional first).

    Raises:
        TypeError: no tensor argument.
    """
    places: list[tuple[int | str, Any]] = [*enumerate(args), *kwargs.items()]
    tensors = [(where, value) for where, value in places if isinstance(value, torch.Tensor)]
    if previous is not None:
        for where, value in tensors:
            if same_storage(value, previous):
                return value, where
    if not tensors:
        raise TypeError("a scheduled block must receive its input activation as a tensor argument")
    where, value = tensors[0]
    return value, where


def first_tensor(value: Any) -> torch.Tensor | None:
    """The tensor a block's result carries as its output: itself, or the first of a tuple or ModelOutput."""
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (tuple, list)):
        for item in value:
            if isinstance(item, torch.Tensor):
                return item
    return None


def reshaped_input(stage: int, x: torch.Tensor, previous: torch.Tensor) -> torch.Size | None:
    """The shape stage ``stage`` receives the previous stage's output in (``None``: as it is).

    A stage's recomputations start from the previous stage's output, so anything the model computed in
    between would be skipped: only the output itself or a reshape of it (a flatten) is accepted.

    Raises:
        RuntimeError: ``x`` is another tensor, or a view that is not a reshape (a transpose, a slice).
    """
    if not same_storage(x, previous) or x.storage_offset() != previous.storage_offset():
        raise RuntimeError(
            f"stage {stage} received a tensor other than stage {stage - 1}'s output: the model computes something "
            "between the two blocks, which a recomputation would skip; plan a chain whose blocks pass their "
            "outputs on directly (name another container, or the checkpoints)"
        )
    if x.shape == previous.shape and x.stride() == previous.stride():
        return None
    if x.numel() != previous.numel() or not _is_reshape(x, previous):
        raise RuntimeError(
            f"stage {stage} received a tensor of shape {tuple(x.shape)} (strides {x.stride()}) from stage "
            f"{stage - 1}'s output of shape {tuple(previous.shape)}; the executor supports reshapes between stages "
            "only (not a transpose or a slice)"
        )
    return x.shape


def _is_reshape(x: torch.Tensor, previous: torch.Tensor) -> bool:
    """Whether ``x`` is ``previous`` viewed in another shape, element order kept."""
    try:
        return previous.view(x.shape).stride() == x.stride()
    except RuntimeError:  # not viewable in that shape: x is a transposed or strided view
        return False


def secondary_outputs(value: Any) -> list[torch.Tensor]:
    """A block result's floating-point tensors besides its output (top-level items of a tuple, list or dict).

    T5's blocks return the position bias the first one computes and the others read: the runtime returns
    these through the stage's autograd function, so their gradients reach ``B(l)``.
    """
    if isinstance(value, torch.Tensor):
        return []
    items = list(value.values()) if isinstance(value, dict) else list(value) if isinstance(value, (tuple, list)) else []
    first = first_tensor(value)
    return [t for t in items if isinstance(t, torch.Tensor) and t is not first and t.is_floating_point()]


def replace_outputs(value: Any, new: torch.Tensor, secondary: Sequence[torch.Tensor]) -> Any:
    """``value`` with its output (:func:`first_tensor`) replaced by ``new`` and its :func:`secondary_outputs`,
    in order, by ``secondary``; its other tensors are returned detached."""
    if isinstance(value, torch.Tensor):
        return new
    first = first_tensor(value)
    swap = {id(old): fresh for old, fresh in zip(secondary_outputs(value), secondary)}

    def fresh(item: Any) -> Any:
        if not isinstance(item, torch.Tensor):
            return item
        return new if item is first else swap.get(id(item), item.detach())

    if isinstance(value, dict):
        out = value.__class__(**value) if hasattr(value, "to_tuple") else value.__class__(value)
        for key, item in value.items():
            out[key] = fresh(item)
        return out
    items = [fresh(item) for item in value]
    return tuple(items) if isinstance(value, tuple) else items


def tensors_in(value: Any) -> Iterator[torch.Tensor]:
    """The tensors in an argument: itself, or inside tuples, lists and dicts (one level deep and nested)."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (tuple, list)):
        for item in value:
            yield from tensors_in(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from tensors_in(item)


def same_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors share one storage (views of one another)."""
    return a.device == b.device and a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
