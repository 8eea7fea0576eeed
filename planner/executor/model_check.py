"""Whether a live model is the one a schedule was planned for: its differences from the chain's signature.

Part of the pure-torch runtime (imports only ``torch`` and the standard library; ``planner.export.files`` embeds it
in the files it writes, which carry the signature as a literal). The signature is the JSON form of
:class:`planner.model.signature.ModelSignature`. A schedule applied to another model than its own would run
blocks it was not planned for (a deeper model's extra blocks are left out of the chain: wrong gradients), or
run with a memory prediction that means nothing (a wider model): :func:`check_model` refuses it in one line,
and :func:`watch_input` warns once when a training forward's stage-1 input is not the size planned for.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

import torch
from torch import nn

#: The attribute under which a wrapper holds the model it wraps: DDP and DataParallel (``module``), FSDP1
#: (``_fsdp_wrapped_module``), torch.compile (``_orig_mod``). A chain found on the wrapper names its modules with
#: the prefix, and the user may apply its schedule to the model inside (before wrapping it, as is usual), or the
#: other way round.
WRAPPER_PREFIXES = ("module.", "_fsdp_wrapped_module.", "_orig_mod.")
#: Wrappers by class name, and where each keeps the model it wraps.
_WRAPPED_AT = {"DistributedDataParallel": "module", "DataParallel": "module", "OptimizedModule": "_orig_mod",
               "FullyShardedDataParallel": "_fsdp_wrapped_module"}
#: Name segments that wrappers insert between a module and its parameters (torch.compile, FSDP1, checkpoint_wrapper).
_INSERTED_SEGMENTS = ("_orig_mod.", "_fsdp_wrapped_module.", "_checkpoint_wrapped_module.")
MISMATCH_ADVICE = ("re-plan for this model, or apply_schedule(model, strict=False) to run it anyway (its memory "
                   "prediction will not hold)")
_INPUT_WATCH_ATTRIBUTE = "_memprof_input_watch"


class ModelDifference(NamedTuple):
    """One way the live model differs from the planned one; ``fatal``: the schedule cannot run on it exactly, even
    with ``strict=False`` (a stage module is missing, or a container holds other blocks: a block the schedule does
    not know, run between its stages or folded into one, would get wrong gradients)."""

    text: str
    fatal: bool = False


def check_model(model: nn.Module, signature: Mapping[str, Any], container: str = "", strict: bool = True,
                stacklevel: int = 3) -> None:
    """Refuses (or, with ``strict=False``, warns about) a model that is not the one the schedule was planned for.

    Args:
        model: the model the schedule is about to be applied to.
        signature: the chain's signature (``ModelSignature.to_dict()``).
        container: a prefix of the stages' module names in ``model`` (the root's class and size are then not
            checked: ``model`` is not the profiled root).
        strict: refuse any difference; ``False``: apply anyway, with one warning, unless the difference is one the
            schedule cannot run exactly with (:class:`ModelDifference`'s ``fatal``).
        stacklevel: the warning's, for the caller's caller (the user's ``apply_schedule`` line by default).

    Raises:
        ValueError: one line, the first difference, how many more, and what to do.
    """
    differences = model_differences(model, signature, container)
    if not differences:
        return
    fatal = [d for d in differences if d.fatal]
    first = (differences if strict else fatal or differences)[0].text
    more = len(differences) - 1
    also = f" (and {more} other difference{'s' if more > 1 else ''})" if more else ""
    if strict:
        raise ValueError(f"{first}{also}: {MISMATCH_ADVICE}")
    if fatal:
        raise ValueError(f"{first}{also}: re-plan for this model (even with strict=False, a schedule runs only on "
                         "the blocks and containers it was planned for: others would train wrongly)")
    warnings.warn(f"{first}{also}; the schedule is applied anyway (strict=False): its memory prediction does not "
                  "hold for this model", UserWarning, stacklevel=stacklevel)


def model_differences(model: nn.Module, signature: Mapping[str, Any], container: str = "") -> list[ModelDifference]:
    """How ``model`` differs from the one the signature describes, most telling first (the root's class, the
    containers' children, the stage modules and their parameters, the root's size); ``[]``: none found."""
    root = unwrap_model(model)
    planned = signature.get("root") or {}
    kind = planned.get("kind")
    out: list[ModelDifference] = []
    if not container and kind and kind not in _WRAPPED_AT and not _is_kind(root, kind):
        out.append(ModelDifference(f"this schedule was planned for a {kind}; this model is a {type(root).__name__}"))
    missing: set[str] = set()
    for entry in signature.get("containers") or ():
        out.extend(_container_differences(root, entry, container, kind or "model", missing))
    for entry in signature.get("modules") or ():
        if entry["name"].rpartition(".")[0] not in missing:
            out.extend(_module_differences(root, entry, container))
    if not container:
        out.extend(_root_size_differences(root, planned))
    return out


def unwrap_model(model: nn.Module) -> nn.Module:
    """The model inside DDP, DataParallel, FSDP1 and torch.compile wrappers (``model`` itself if none)."""
    while type(model).__name__ in _WRAPPED_AT and isinstance(getattr(model, _WRAPPED_AT[type(model).__name__], None),
                                                              nn.Module):
        model = getattr(model, _WRAPPED_AT[type(model).__name__])
    return model


def module_candidates(name: str, container: str | None) -> list[str]:
    """The names ``name`` may have in the model it is applied to: as is, under ``container``, without or with a
    wrapper's prefix (``""``: the model itself, or ``container`` when given)."""
    names = ([name, f"{container}.{name}"] if name else [container, name]) if container else [name]
    stripped = [n[len(p):] for n in names for p in WRAPPER_PREFIXES if n.startswith(p) or n == p[:-1]]
    wrapped = [p + n for n in names for p in WRAPPER_PREFIXES if n]
    return names + stripped + wrapped


def find_module(model: nn.Module, name: str, container: str | None = None) -> tuple[str, nn.Module] | None:
    """The first of :func:`module_candidates` that names a module of ``model``, with that module; ``None``."""
    for candidate in module_candidates(name, container):
        try:
            return candidate, (model.get_submodule(candidate) if candidate else model)
        except AttributeError:
            continue
    return None


def _container_differences(root: nn.Module, entry: Mapping[str, Any], container: str, kind: str,
                           missing: set[str]) -> list[ModelDifference]:
    name, planned = entry["name"], list(entry["children"])
    where = name or "top level"
    found = find_module(root, name, container)
    if found is None:
        missing.add(name)
        return [ModelDifference(f"this model has no module {name}, which holds the schedule's stages in the planned "
                                f"{kind}", fatal=True)]
    children = dict(found[1].named_children())
    # a child that neither ran nor holds parameters is not in the trace: only children with parameters count
    counted = {child for child, module in children.items()
               if child in planned or any(True for _ in module.parameters())}
    if counted == set(planned):
        return []
    return [ModelDifference(f"this schedule was planned for a {kind} whose {where} has {_describe(planned)}; this "
                            f"model's has {_describe(list(children), planned)}", fatal=True)]


def _describe(children: list[str], planned: list[str] | None = None) -> str:
    """``4 blocks (0..3)`` for numbered children; else their names (what differs from ``planned``)."""
    count = len(children)
    if children and children == [str(i) for i in range(count)]:
        return "1 block (0)" if count == 1 else f"{count} blocks (0..{count - 1})"
    if planned is None:
        return "children " + _names(children)
    lacks, extra = [c for c in planned if c not in children], [c for c in children if c not in planned]
    parts = ([f"no {_names(lacks)}"] if lacks else []) + ([f"{_names(extra)} besides"] if extra else [])
    return " and ".join(parts) or "children " + _names(children)


def _names(names: list[str], limit: int = 8) -> str:
    shown = ", ".join(names[:limit])
    return f"{shown}, ... ({len(names)} in all)" if len(names) > limit else shown


def _module_differences(root: nn.Module, entry: Mapping[str, Any], container: str) -> list[ModelDifference]:
    name, kind = entry["name"], entry.get("kind") or ""
    found = find_module(root, name, container)
    if found is None:
        return [ModelDifference(f"this model has no module {name}, which the schedule runs as a stage"
                                + (f" (a {kind} in the planned model)" if kind else ""), fatal=True)]
    path, module = found[0], unwrap_model(found[1])
    if kind and not _is_kind(module, kind):
        return [ModelDifference(f"{name} is a {type(module).__name__} here, a {kind} in the planned model")]
    if entry.get("parameters") is not None:
        return _parameter_differences(root, name, path, module, entry["parameters"])
    planned_bytes = entry.get("weight_bytes")
    live_bytes = _unique_bytes(module.parameters())
    if planned_bytes is not None and live_bytes != planned_bytes:
        return [ModelDifference(f"{name} holds {live_bytes:,} bytes of parameters here, {planned_bytes:,} in the "
                                "planned model")]
    return []


def _parameter_differences(root: nn.Module, name: str, path: str, module: nn.Module,
                           planned: Mapping[str, list[Any]]) -> list[ModelDifference]:
    """Shapes and dtypes of a stage module's parameters against the planned ones (names relative to it)."""
    expected = {_plain(rel): entry for rel, entry in planned.items()}
    live: dict[str, torch.Tensor] = {}
    out = []
    for rel, own in module.named_parameters(remove_duplicate=False):
        live.setdefault(_plain(rel), own)
    # the trace lists a tied parameter once, where named_parameters() first finds it: elsewhere it is no extra
    canonical = {id(p): _plain(n) for n, p in root.named_parameters()} if set(live) - set(expected) else {}
    for rel, param in live.items():
        entry = expected.get(rel)
        if entry is None:
            if canonical.get(id(param)) == _plain(f"{path}.{rel}" if path else rel):
                out.append(ModelDifference(f"{name}.{rel} is a parameter here, not in the planned model"))
            continue
        shape, dtype = tuple(entry[:-1]), entry[-1]
        here = str(param.dtype).removeprefix("torch.")
        if tuple(param.shape) != shape:
            out.append(ModelDifference(f"{name}.{rel} is {tuple(param.shape)} here, {shape} in the planned model"))
        elif here != dtype:
            out.append(ModelDifference(f"{name}.{rel} is {here} here, {dtype} in the planned model"))
    out.extend(ModelDifference(f"{name}.{rel} is missing here; the planned model has it, {tuple(entry[:-1])} "
                               f"{entry[-1]}") for rel, entry in expected.items() if rel not in live)
    return out


def _root_size_differences(root: nn.Module, planned: Mapping[str, Any]) -> list[ModelDifference]:
    kind = planned.get("kind") or "model"
    count, planned_bytes = planned.get("parameter_count"), planned.get("weight_bytes")
    if count is not None:
        live = sum(_numel(p) for p in root.parameters())
        if live != count:
            return [ModelDifference(f"this schedule was planned for a {kind} of {count:,} parameters; this model has "
                                    f"{live:,}")]
    elif planned_bytes is not None and (live := _unique_bytes(root.parameters())) != planned_bytes:
        return [ModelDifference(f"this schedule was planned for a {kind} holding {planned_bytes:,} bytes of "
                                f"parameters; this model holds {live:,}")]
    return []


def _is_kind(module: nn.Module, kind: str) -> bool:
    """``module``'s class or a base of it is called ``kind`` (FSDP2 subclasses a sharded module's class)."""
    return any(cls.__name__ == kind for cls in type(module).__mro__)


def _plain(name: str) -> str:
    for segment in _INSERTED_SEGMENTS:
        name = name.replace(segment, "")
    return name


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's part of a sharded tensor (a ``DTensor``), else the tensor."""
    to_local = getattr(tensor, "to_local", None)
    return to_local() if callable(to_local) and hasattr(tensor, "device_mesh") else tensor


def _numel(param: torch.Tensor) -> int:
    return math.prod(param.shape)


def _unique_bytes(params: Iterable[torch.Tensor]) -> int:
    """The bytes of the distinct storages of ``params``, as the trace's ``weight_bytes`` counts them."""
    seen: dict[int, int] = {}
    for param in params:
        storage = _local(param).untyped_storage()
        seen.setdefault(storage.data_ptr(), storage.nbytes())
    return sum(seen.values())


def _input_sizes(args: Any) -> set[int]:
    """What a trace may have recorded as a call's input bytes: its distinct storages' bytes (as allocated; rounded
    to CUDA's 512-byte blocks) or its tensors' own bytes."""
    storages: dict[int, int] = {}
    own = 0
    stack = [args]
    while stack:
        item = stack.pop()
        if isinstance(item, (tuple, list)):
            stack.extend(item)
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, torch.Tensor):
            local = _local(item)
            try:
                storage = local.untyped_storage()
            except (RuntimeError, NotImplementedError):  # sparse or nested tensors have no single storage
                continue
            if storage.data_ptr() not in storages:
                storages[storage.data_ptr()] = storage.nbytes()
                own += local.numel() * local.element_size()
    rounded = sum(-(-n // 512) * 512 for n in storages.values())
    return {sum(storages.values()), rounded, own}


def _outside_graphs(hook: Any) -> Any:
    """A hook run eagerly under ``torch.compile`` (its Python state, once-only warning, stays out of graphs)."""
    disable = getattr(getattr(torch, "compiler", None), "disable", None)
    return hook if disable is None else disable(hook)


class _InputWatch:
    """A forward pre-hook on stage 1's first module: warns once when a training forward's input is not the size
    the schedule was planned for (another batch or sequence length: the schedule still runs, with the same
    gradients, but its memory prediction does not hold). A last partial batch is normal, hence no refusal."""

    def __init__(self, planned_bytes: int, name: str) -> None:
        self.planned_bytes, self.name, self.warned = planned_bytes, name, False

    @_outside_graphs
    def __call__(self, module: nn.Module, args: Any) -> None:
        if self.warned or not module.training or not torch.is_grad_enabled():
            return
        sizes = _input_sizes(args)
        if self.planned_bytes in sizes:
            return
        self.warned = True
        warnings.warn(f"this forward's stage-1 input ({self.name}) is {min(sizes):,} bytes; the schedule was planned "
                      f"for {self.planned_bytes:,} (another batch or sequence length): it runs, with the same "
                      "gradients, but its memory prediction does not hold for this input", UserWarning, stacklevel=2)


def watch_input(model: nn.Module, module: nn.Module, planned_bytes: int | None, name: str = "stage 1") -> None:
    """Warns once, at the first training forward whose stage-1 input (the input of ``module``, stage 1's first
    module) differs from ``planned_bytes``; undone by :func:`unwatch_input` (``None``: nothing to watch)."""
    unwatch_input(model)
    if planned_bytes is None:
        return
    handle = module.register_forward_pre_hook(_InputWatch(int(planned_bytes), name))
    object.__setattr__(model, _INPUT_WATCH_ATTRIBUTE, handle)


def unwatch_input(model: nn.Module) -> None:
    """Removes :func:`watch_input`'s hook (a no-op when there is none)."""
    handle = model.__dict__.pop(_INPUT_WATCH_ATTRIBUTE, None)
    if handle is not None:
        handle.remove()
