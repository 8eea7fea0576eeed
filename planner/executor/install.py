"""Installing a schedule on a model: a wrapper ``forward`` on each stage's first module, where it lives.

Part of the pure-torch runtime (imports only ``torch``, the standard library and its sibling modules, which
``planner.export.files`` embeds together in the files it writes). The model's ``forward`` keeps running as written
(its loop, its keyword arguments) and calls the wrappers in chain order; each wrapper finds the running
activation among its arguments, keeps the others for recomputations, and runs its stage through
:class:`planner.executor.runtime._StageFunction`.
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from planner.executor.block_io import find_activation, key_value_cache, replace_outputs, same_storage
from planner.executor.offload import MIN_OFFLOAD_BYTES, Copier, HostPool
from planner.executor.program import Program, plain_ends, trimmed_ops
from planner.executor.runtime import _Run, _StageFunction
from planner.executor.stage import StageCall, StageRunner
from planner.executor.weights import WeightStreamer, state_follows_parameters


class ScheduleExecutor:
    """A schedule installed on a model: one wrapper ``forward`` per stage, sharing this state.

    Args:
        stages: for each stage 1..L, its modules in order (the first one is called by the model).
        ops: the schedule's ``(kind, stage)`` operations (``"F_all[k]"``: F_all with recomputation option k).
        min_offload_bytes: saved storages below this size stay on the device when their stage is offloaded.
        policies: for each ``(stage, option)`` the schedule uses, the ops the option keeps,
            ``(aten overload name, occurrence)`` pairs.
        partial: the ``(stage, option)`` pairs whose option is partial: their backward replays only what the
            dropped saved tensors need (:mod:`planner.executor.partial`), not the whole stage.
        streamed: the stages whose weights live in host memory and are streamed to the device around their
            computations (:mod:`planner.executor.weights`); parameters shared by several stages stay put.
        root: the model the stages live in; a Hugging Face config of it with ``use_cache=True`` is turned off
            while the schedule is installed (see :func:`training_without_cache`).
        compiled: run each stage's modules as compiled regions (``torch.compile`` of each module's own forward,
            see :func:`compiled_forwards`): forward without saving, recomputation and backward at compiled
            speed, whether or not the model around them is compiled. ``True`` compiles with inductor; a
            ``torch.compile`` backend (a name or a callable) with that backend. The stages at either end that
            the schedule runs as plain autograd does get their modules' own forwards compiled instead, inlined
            into a compiled model's graph (no graph break; :func:`~planner.executor.program.plain_ends`).

    Raises:
        ValueError: the operations cannot be run in the model's forward (see :class:`Program`), or ``compiled``
            with an operation that runs eagerly only (a selective or partial option, an offload, streamed
            weights).
    """

    def __init__(self, stages: Sequence[Sequence[nn.Module]], ops: Sequence[tuple[str, int]],
                 min_offload_bytes: int = MIN_OFFLOAD_BYTES,
                 policies: Mapping[tuple[int, int], Sequence[Sequence[Any]]] | None = None,
                 streamed: Sequence[int] = (), root: nn.Module | None = None,
                 partial: Iterable[Sequence[int]] = (), compiled: Any = False) -> None:
        program = Program(ops, len(stages))
        self.compiled = compiled is not False and compiled is not None
        self.backend = "inductor" if compiled is True or not self.compiled else compiled
        if self.compiled:
            refuse_eager_only(program, policies or {}, bool(streamed))
        # Compiled, the stages the schedule runs as plain autograd does stay inside the model's compiled graph
        # (no graph break around them); the executor runs the ones between, numbered from 1.
        head, tail = plain_ends(program) if self.compiled else (0, 0)
        self.plain = [m for group in (*stages[:head], *stages[len(stages) - tail:]) for m in group]
        stages = stages[head:len(stages) - tail]
        self.program = Program(trimmed_ops(ops, program.length, head, tail), len(stages)) if head or tail \
            else program
        # weakly: the model holds its executor, and a cycle back would keep both (and the device memory of
        # their parameters) alive until the garbage collector next runs
        self.root = weakref.ref(root) if root is not None else None
        self.caches: list[tuple[Any, bool]] = []  # the configs whose use_cache the schedule turned off
        # (stage, option) -> the ops F_all(stage)[option] keeps, by name and occurrence (see selective.py)
        self.policies = {(int(s), int(o)): tuple((str(n), int(c)) for n, c in kept)
                         for (s, o), kept in (policies or {}).items()}
        self.partial = {(int(s), int(o)) for s, o in partial}
        self.pool = HostPool()  # host buffers of offloaded activations, reused across steps
        self.copiers: dict[torch.device, Copier] = {}
        self.min_offload_bytes = int(min_offload_bytes)
        self.modules = [list(group) for group in stages]
        self.stages: list[StageRunner] = []
        self.current: _Run | None = None
        self.last_output: weakref.ref[torch.Tensor] | None = None  # what the folded modules pass through
        self.dummy = torch.empty(0, requires_grad=True)  # makes outputs require grad when inputs do not
        self.weights = _streamer(self.modules, streamed, self.program, self.pool, self.copiers)
        self.optimizers: list[tuple[torch.optim.Optimizer, Any]] = []  # (optimizer, its step pre-hook's handle)
        self.own_forwards: dict[int, Any] = {}  # id(module) -> the forward set on the instance before install

    def follow(self, optimizer: torch.optim.Optimizer) -> None:
        """Keeps ``optimizer``'s state where the streamed parameters are, before each of its steps (a no-op
        without streamed weights); :meth:`remove` brings the state back to the device with the parameters."""
        if self.weights is None or any(known is optimizer for known, _ in self.optimizers):
            return
        handle = optimizer.register_step_pre_hook(_state_follows)
        self.optimizers.append((optimizer, handle))

    def install(self) -> None:
        """Puts the wrappers in place (each module's own ``forward`` is kept and restored by :meth:`remove`)."""
        if any(isinstance(m.__dict__.get("forward"), _WRAPPERS) for g in (*self.modules, self.plain) for m in g):
            raise ValueError("a module of this chain already follows a schedule; call remove_schedule first")
        for module in self.plain:
            if "forward" in module.__dict__:
                self.own_forwards[id(module)] = module.__dict__["forward"]
            module.forward = _PlainForward(module.forward, module, self.backend)
        for index, group in enumerate(self.modules):
            forwards = [m.forward for m in group]
            # a forward set on the instance (accelerate's wrapper, a patch) is put back on removal, not deleted
            self.own_forwards.update((id(m), m.__dict__["forward"]) for m in group if "forward" in m.__dict__)
            self.stages.append(StageRunner(group, compiled_forwards(forwards, self.backend) if self.compiled
                                           else forwards))
            group[0].forward = _StageForward(self, index + 1, forwards[0], group[0])
            for module, forward in zip(group[1:], forwards[1:]):
                module.forward = _FoldedForward(self, forward, module)
        root = self.root() if self.root is not None else None
        if root is not None:
            self.caches = training_without_cache(root)

    def remove(self) -> None:
        """Gives every module its own ``forward`` back (and streamed parameters their device)."""
        if self.weights is not None:
            self.weights.finish()
            self.weights.restore()
        for optimizer, handle in self.optimizers:
            handle.remove()
            state_follows_parameters(optimizer)
        self.optimizers = []
        for group in (*self.modules, self.plain):
            for module in group:
                if isinstance(module.__dict__.get("forward"), _WRAPPERS):
                    del module.forward
                    if id(module) in self.own_forwards:
                        module.forward = self.own_forwards[id(module)]
        self.own_forwards = {}
        self.stages.clear()
        for config, value in self.caches:
            config.use_cache = value
        self.caches = []

    def active(self, x: object) -> bool:
        """Whether a call on ``x`` is a training forward the schedule runs (else the modules just run)."""
        if not isinstance(x, torch.Tensor) or not torch.is_grad_enabled():
            return False
        if not self.modules[0][0].training:
            return False
        return x.requires_grad or any(p.requires_grad for g in self.modules for m in g for p in m.parameters())


def compiled_forwards(forwards: Sequence[Any], backend: Any = "inductor") -> list[Any]:
    """Each module's own ``forward``, compiled on its own with ``backend`` (``torch.compile``'s default: inductor;
    the model's own where the chain was costed with another, as the profiler compiles its blocks).

    The stage wrappers run between compiled graphs (:func:`_eager`); inside them each module runs its compiled
    region, which dynamo compiles once per grad mode (a forward without saving runs the inference graph, a
    recording forward the training graph, whose backward is compiled too) and shares between blocks of one class.
    """
    return [torch.compile(forward, backend=backend) for forward in forwards]


def refuse_eager_only(program: Program, policies: Mapping[tuple[int, int], Any], streamed: bool) -> None:
    """Refuses, in one line, a schedule whose operations run eagerly only, with compiled stages.

    A selective or partial option finds the ops it keeps by counting the aten ops a stage runs, which a compiled
    region does not run one by one; an offload moves tensors autograd saved, which the compiled backward holds
    on its own; streamed weights move parameters the compiled graph guards on.

    Raises:
        ValueError: which operation, and how to plan without it.
    """
    found = ("a recomputation option (selective or partial)" if policies else
             "an offload" if program.offloaded else
             "streamed weights" if streamed else None)
    if found is not None:
        raise ValueError(f"this schedule has {found}, which runs eagerly only, and its stages are to run compiled; "
                         "plan it with --algorithm rotor (or another solver without options, offloads or "
                         "streamed weights), or apply it with compile=False")


def training_without_cache(model: nn.Module) -> list[tuple[Any, bool]]:
    """Turns off the key/value cache of a Hugging Face model's configs that have ``use_cache=True``.

    With the cache on (the default of ``GPT2Config()``, ``LlamaConfig()``), a training forward hands every
    block a cache that each run of the block extends, so a recomputed block would attend to its own keys
    twice, and the cache holds memory a training step never reads. Hugging Face's own
    ``gradient_checkpointing_enable()`` turns it off in training, with a warning; so does this. Calls that
    pass ``use_cache=True`` explicitly (``generate()`` does) still get a cache (and are refused by a
    recomputed stage).

    Returns:
        ``(config, previous value)`` for each config changed, for :meth:`ScheduleExecutor.remove`.
    """
    seen: dict[int, Any] = {}
    for module in model.modules():
        config = getattr(module, "config", None)
        for candidate in (config, getattr(config, "text_config", None), getattr(config, "decoder", None)):
            if getattr(candidate, "use_cache", None) is True:
                seen.setdefault(id(candidate), candidate)
    for config in seen.values():
        config.use_cache = False
    if seen:
        warnings.warn(
            f"{type(model).__name__}'s config has use_cache=True, which hands every block a key/value cache in "
            "training (memory a training step never reads, and a recomputed block would extend it twice); the "
            "schedule sets model.config.use_cache = False while it is installed, as Hugging Face's "
            "gradient_checkpointing_enable() does, and remove_schedule puts it back", UserWarning, stacklevel=4)
    return [(config, True) for config in seen.values()]


def _state_follows(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
    """An optimizer step pre-hook (which must return ``None``): the state goes where its parameters are."""
    state_follows_parameters(optimizer)


def _streamer(groups: Sequence[Sequence[nn.Module]], streamed: Sequence[int], program: Program, pool: HostPool,
              copiers: dict[torch.device, Copier]) -> WeightStreamer | None:
    """The weight streamer of ``streamed`` stages, each with the parameters no other stage uses."""
    if not streamed:
        return None
    owners: dict[int, set[int]] = {}
    for index, group in enumerate(groups):
        for module in group:
            for param in module.parameters():
                owners.setdefault(id(param), set()).add(index + 1)
    params: dict[int, list[nn.Parameter]] = {}
    for stage in sorted(set(int(s) for s in streamed)):
        if not 1 <= stage <= len(groups):
            raise ValueError(f"stage {stage} cannot stream its weights: the chain has stages 1..{len(groups)}")
        seen: dict[int, nn.Parameter] = {}
        for module in groups[stage - 1]:
            for param in module.parameters():
                if owners[id(param)] == {stage}:
                    seen.setdefault(id(param), param)
        params[stage] = list(seen.values())
    return WeightStreamer(params, program.computations, pool, copiers)


def _eager(method: Any) -> Any:
    """Keeps ``torch.compile`` out of a wrapper: the stage runs eagerly between compiled graphs.

    Dynamo would trace the runtime's Python state (the schedule's position, the tensors it keeps) once, at
    compile time, and replay the graph without it, so a compiled model would silently skip the schedule's
    bookkeeping and get wrong gradients. Run eagerly, the stage follows the schedule exactly; the code
    around the chain (embeddings, head, loss) is still compiled.
    """
    disable = getattr(getattr(torch, "compiler", None), "disable", None)
    return method if disable is None else disable(method)


class _Original:
    """A module's own ``forward``, kept by a wrapper that lives in the module's ``__dict__``.

    A bound method would hold the module, and the module holds the wrapper: a reference cycle, which keeps a
    dropped model's parameters (device memory) alive until the garbage collector happens to run. A bound method
    of a module is kept as its function and a weak reference to the module instead.
    """

    __slots__ = ("function", "owner", "method")

    def __init__(self, method: Any, module: nn.Module) -> None:
        owner, function = getattr(method, "__self__", None), getattr(method, "__func__", None)
        self.function: Any = None
        self.owner: weakref.ref[nn.Module] | None = None
        self.method: Any = method  # something else the module's forward was replaced with: kept as it is
        if owner is module and function is not None:
            self.function, self.owner, self.method = function, weakref.ref(module), None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.method is not None:
            return self.method(*args, **kwargs)
        assert self.owner is not None
        return self.function(self.owner(), *args, **kwargs)


class _StageForward:
    """The wrapper ``forward`` of a stage's first module (it holds the executor weakly: the model holds it)."""

    memprof_stage = True  # the profiler's regional costing leaves such a module alone (memprof.capture.regional)

    def __init__(self, executor: ScheduleExecutor, stage: int, original: Any, module: nn.Module) -> None:
        self._executor, self.stage, self.original = weakref.ref(executor), stage, _Original(original, module)

    @_eager
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        executor = self._executor()
        if executor is None:  # the model that held the schedule is gone: the module runs as its own
            return self.original(*args, **kwargs)
        run = executor.current
        previous = None
        if self.stage > 1 and run is not None and run.next_stage == self.stage:
            previous = run._output(self.stage - 1)
        x, where = find_activation(args, kwargs, previous)
        if not executor.active(x):
            executor.last_output = None
            return self.original(*args, **kwargs)
        if self.stage == 1:
            run = executor.current = _Run(executor, x)
        elif run is None or run.next_stage != self.stage:
            expected = "stage 1" if run is None else f"stage {run.next_stage}"
            raise RuntimeError(
                f"the model called stage {self.stage} of its schedule where {expected} was due; the schedule needs "
                "the chain's blocks called once each, in order, in every training forward"
            )
        if (self.stage in executor.program.replayed or any(s == self.stage for s, _ in executor.policies)) \
                and (cache := key_value_cache(args, kwargs)) is not None:
            raise RuntimeError(
                f"stage {self.stage} is passed a key/value cache ({cache}), which every run of the block extends, "
                "so its recomputation would attend to its own keys twice; train without a cache "
                "(use_cache=False in the call or model.config.use_cache = False)"
            )
        call = run.calls[self.stage] = StageCall(args, kwargs, where)
        # carried tensors are inputs of the stage's function, so autograd hands their gradients to their makers
        carried, call.carried_inputs = call.carried_inputs, []
        run.carried.carry(self.stage, carried)
        y, *secondary = _StageFunction.apply(run, self.stage, x, executor.dummy, *carried)
        del carried
        raw, run.raw = run.raw, None
        executor.last_output = weakref.ref(y)
        if self.stage == executor.program.length:
            executor.current = None
        return y if raw is None else replace_outputs(raw, y, secondary)


class _FoldedForward:
    """The wrapper ``forward`` of a module folded into a stage: the stage's wrapper already ran it."""

    memprof_stage = True

    def __init__(self, executor: ScheduleExecutor, original: Any, module: nn.Module) -> None:
        self._executor, self.original = weakref.ref(executor), _Original(original, module)

    @_eager
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        executor = self._executor()
        last = executor.last_output() if executor is not None and executor.last_output is not None else None
        # FSDP2's pre-forward hook hands the module an alias of it (through its post-backward function)
        if last is not None and args and (args[0] is last or _alias(args[0], last)):
            return last
        return self.original(*args, **kwargs)


class _PlainForward:
    """The ``forward`` of a module of a stage the schedule runs as plain autograd does, under compiled stages: its
    own, compiled (:func:`planner.executor.program.plain_ends`). Called inside a compiled model, dynamo inlines it
    into the model's graph; called eagerly, it runs its compiled region, as the chain was costed. Its module is
    held weakly (the module holds it)."""

    memprof_stage = True

    def __init__(self, forward: Any, module: nn.Module, backend: Any) -> None:
        self.original = _Original(forward, module)  # (its function and a weak owner, for a bound method)
        own = self.original.method if self.original.owner is None else self.original.function
        self.compiled: Any = torch.compile(own, backend=backend)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        owner = self.original.owner
        if owner is None:
            return self.compiled(*args, **kwargs)
        return self.compiled(owner(), *args, **kwargs)


_WRAPPERS = (_StageForward, _FoldedForward, _PlainForward)


def _alias(value: Any, tensor: torch.Tensor) -> bool:
    """``value`` is a tensor over the same memory as ``tensor``, with the same shape and layout."""
    return (isinstance(value, torch.Tensor) and same_storage(value, tensor)
            and value.storage_offset() == tensor.storage_offset() and value.shape == tensor.shape
            and value.stride() == tensor.stride())
