"""What a chain knows of the model it was found in, so that a schedule recognises that model (``Chain.signature``).

A schedule's operations only make sense on the model its chain was costed on: the same blocks, in the same
containers, with the same parameters. Applied to a model of the same family but deeper, wider or of another
dtype, the executor would find modules of the same names and run (wrongly, when blocks are left out of the
chain; or with a memory prediction that means nothing). :class:`ModelSignature` holds what the trace knew of
the model, and :mod:`planner.executor.model_check` compares a live ``nn.Module`` against its JSON form
(:meth:`ModelSignature.to_dict`), which the standalone export embeds as is.

What it holds, where the trace knew it (:mod:`planner.discovery.signature` builds it):

- the stage modules' names and kinds (class names), and the shapes and dtypes of their parameters (``meta.json``'s
  ``parameter_shapes``; a trace recorded before it gives each module's parameter bytes, ``weight_bytes``);
- for each container holding stage modules, its children's names (a deeper or shallower model is caught);
- the profiled root's class and parameter count (or parameter bytes), checked when the schedule is applied to
  that root;
- the stage-1 input's bytes, which the executor compares with each training forward's (a warning, not a refusal).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from planner.errors import ChainError


@dataclass(frozen=True)
class ParameterSpec:
    """A parameter of a stage module: its name relative to the module, shape and dtype (``"float32"``)."""

    name: str
    shape: tuple[int, ...]
    dtype: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(self.shape))
        if not isinstance(self.name, str) or not self.name:
            raise ChainError(f"signature: a parameter's name must be a non-empty string, found {self.name!r}")
        if not all(_is_count(d) for d in self.shape):
            raise ChainError(f"signature: parameter {self.name!r} has shape {list(self.shape)}; expected whole "
                             "numbers >= 0")
        if not isinstance(self.dtype, str) or not self.dtype:
            raise ChainError(f"signature: parameter {self.name!r} has dtype {self.dtype!r}; expected a name "
                             "such as 'float32'")


@dataclass(frozen=True)
class ModuleSpec:
    """A stage module: qualified name (as the chain names it), class name, and its parameters.

    ``parameters`` is ``None`` when the trace had no parameter shapes (then ``weight_bytes``, the unique
    storages of its parameters, stands in for them; ``None`` too when unknown).
    """

    name: str
    kind: str
    parameters: tuple[ParameterSpec, ...] | None = None
    weight_bytes: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not isinstance(self.kind, str):
            raise ChainError(f"signature: a module's name and kind must be strings, found {self.name!r}, "
                             f"{self.kind!r}")
        if self.parameters is not None:
            object.__setattr__(self, "parameters", tuple(self.parameters))
            names = [p.name for p in self.parameters]
            if len(set(names)) != len(names) or not all(isinstance(p, ParameterSpec) for p in self.parameters):
                raise ChainError(f"signature: module {self.name!r} must list ParameterSpec objects with distinct "
                                 f"names, found {names}")
        _check_optional_count(self.weight_bytes, f"module {self.name!r}'s weight_bytes")


@dataclass(frozen=True)
class ContainerSpec:
    """A module holding stage modules, with its children's names (relative: ``"0"``, ``"ln_f"``)."""

    name: str
    children: tuple[str, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "children", tuple(self.children))
        if not isinstance(self.name, str) or not all(isinstance(c, str) and c for c in self.children):
            raise ChainError(f"signature: container {self.name!r} must name its children with non-empty "
                             f"strings, found {list(self.children)}")
        if len(set(self.children)) != len(self.children):
            raise ChainError(f"signature: container {self.name!r} names a child twice: {list(self.children)}")


@dataclass(frozen=True, kw_only=True)
class ModelSignature:
    """What a schedule checks of the model it is applied to (see the module's docstring).

    Attributes:
        root_kind: the profiled root's class name (``None``: unknown).
        parameter_count: the root's parameters' elements, each parameter counted once (``None``: unknown).
        weight_bytes: the unique storages of the root's parameters, where the count is unknown.
        input_bytes: the stage-1 input's bytes (``Chain.input_bytes``), for the executor's run-time warning.
        modules: the stage modules, in chain order.
        containers: the modules holding stage modules (``""``: the root).
    """

    root_kind: str | None = None
    parameter_count: int | None = None
    weight_bytes: int | None = None
    input_bytes: int | None = None
    modules: tuple[ModuleSpec, ...] = ()
    containers: tuple[ContainerSpec, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "modules", tuple(self.modules))
        object.__setattr__(self, "containers", tuple(self.containers))
        if self.root_kind is not None and not isinstance(self.root_kind, str):
            raise ChainError(f"signature: root_kind must be a class name or None, found {self.root_kind!r}")
        for key in ("parameter_count", "weight_bytes", "input_bytes"):
            _check_optional_count(getattr(self, key), key)
        if not all(isinstance(m, ModuleSpec) for m in self.modules) or not all(
                isinstance(c, ContainerSpec) for c in self.containers):
            raise ChainError("signature: modules and containers must be ModuleSpec and ContainerSpec objects; use "
                             "ModelSignature.from_dict for dicts")
        for what, names in (("module", [m.name for m in self.modules]),
                            ("container", [c.name for c in self.containers])):
            if len(set(names)) != len(names):
                raise ChainError(f"signature: a {what} is listed twice: {names}")

    def relative_to(self, prefix: str) -> ModelSignature:
        """The signature as seen from the module ``prefix`` (its stage modules' names without ``prefix.``; the
        root's class and parameters dropped: that module is not the profiled root)."""
        if not prefix:
            return self
        cut = len(prefix) + 1
        modules = tuple(replace(m, name=m.name[cut:]) if m.name.startswith(prefix + ".") else m for m in self.modules)
        containers = tuple(replace(c, name="") for c in self.containers if c.name == prefix)
        return ModelSignature(input_bytes=self.input_bytes, modules=modules, containers=containers)

    def to_dict(self) -> dict[str, Any]:
        """The JSON form, which :meth:`from_dict` reads and :mod:`planner.executor.model_check` checks models by."""
        return {
            "root": {"kind": self.root_kind, "parameter_count": self.parameter_count,
                     "weight_bytes": self.weight_bytes},
            "input_bytes": self.input_bytes,
            "modules": [_module_dict(m) for m in self.modules],
            "containers": [{"name": c.name, "children": list(c.children)} for c in self.containers],
        }

    @classmethod
    def from_dict(cls, raw: Any) -> ModelSignature:
        """Reads a signature from its JSON form.

        Raises:
            ChainError: not an object, or a part missing or malformed (says which).
        """
        if not isinstance(raw, Mapping):
            raise ChainError(f"signature must be an object with 'modules' and 'containers', found {type(raw).__name__}")
        root = raw.get("root")
        root = {} if root is None else root
        if not isinstance(root, Mapping):
            raise ChainError(f"signature: 'root' must be an object, found {type(root).__name__}")
        return cls(
            root_kind=root.get("kind"),
            parameter_count=root.get("parameter_count"),
            weight_bytes=root.get("weight_bytes"),
            input_bytes=raw.get("input_bytes"),
            modules=tuple(_module_from_dict(item) for item in _list(raw, "modules")),
            containers=tuple(_container_from_dict(item) for item in _list(raw, "containers")),
        )


def parameter_entry(shape: Sequence[int], dtype: str) -> list[Any]:
    """A parameter's JSON form, as ``meta.json``'s ``parameter_shapes`` writes it: ``[dims..., dtype]``."""
    return [*shape, dtype]


def _module_dict(module: ModuleSpec) -> dict[str, Any]:
    out: dict[str, Any] = {"name": module.name, "kind": module.kind}
    if module.parameters is not None:
        out["parameters"] = {p.name: parameter_entry(p.shape, p.dtype) for p in module.parameters}
    if module.weight_bytes is not None:
        out["weight_bytes"] = module.weight_bytes
    return out


def _module_from_dict(raw: Any) -> ModuleSpec:
    if not isinstance(raw, Mapping) or not {"name", "kind"} <= set(raw):
        raise ChainError(f"signature: a module is an object with 'name' and 'kind', found {raw!r}")
    parameters = raw.get("parameters")
    if parameters is not None:
        if not isinstance(parameters, Mapping):
            raise ChainError(f"signature: module {raw['name']!r}'s parameters must be an object (name -> "
                             f"[dims..., dtype]), found {type(parameters).__name__}")
        parameters = tuple(_parameter_from_entry(str(raw["name"]), name, entry) for name, entry in parameters.items())
    return ModuleSpec(raw["name"], raw["kind"], parameters, raw.get("weight_bytes"))


def _parameter_from_entry(module: str, name: Any, entry: Any) -> ParameterSpec:
    if not isinstance(entry, Sequence) or isinstance(entry, str) or not entry or not isinstance(entry[-1], str):
        raise ChainError(f"signature: parameter {name!r} of module {module!r} must be [dims..., dtype], found "
                         f"{entry!r}")
    return ParameterSpec(name, tuple(entry[:-1]), entry[-1])


def _container_from_dict(raw: Any) -> ContainerSpec:
    if not isinstance(raw, Mapping) or "name" not in raw:
        raise ChainError(f"signature: a container is an object with 'name' and 'children', found {raw!r}")
    children = raw.get("children")
    if not isinstance(children, Sequence) or isinstance(children, str):
        raise ChainError(f"signature: container {raw['name']!r}'s children must be a list of names, found {children!r}")
    return ContainerSpec(raw["name"], tuple(children))


def _list(raw: Mapping[str, Any], key: str) -> Sequence[Any]:
    value = raw.get(key, ())
    if not isinstance(value, Sequence) or isinstance(value, str):
        raise ChainError(f"signature: {key!r} must be a list, found {type(value).__name__}")
    return value


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _check_optional_count(value: Any, what: str) -> None:
    if value is not None and not _is_count(value):
        raise ChainError(f"signature: {what} must be a whole number >= 0 or null, found {value!r}")
