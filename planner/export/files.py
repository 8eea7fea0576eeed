"""Export a schedule: as JSON, or as a standalone Python file that applies it to a model with only ``torch``.

The Python file embeds the pure-torch runtime (:mod:`planner.executor.block_io`, :mod:`planner.executor.sharded`,
:mod:`planner.executor.stage`,
:mod:`planner.executor.offload`, :mod:`planner.executor.transfers`, :mod:`planner.executor.selective`,
:mod:`planner.executor.partial_tape`, :mod:`planner.executor.partial`,
:mod:`planner.executor.program`, :mod:`planner.executor.grads`, :mod:`planner.executor.carried_grads`,
:mod:`planner.executor.runtime`, :mod:`planner.executor.weights`, :mod:`planner.executor.install`,
:mod:`planner.executor.grad_into`, :mod:`planner.executor.embedding_grad`, :mod:`planner.executor.chunked_loss`,
:mod:`planner.executor.chunked_head`, :mod:`planner.executor.model_check`, which import
nothing but ``torch`` and the standard library) verbatim, and the schedule's data: the modules of each stage
(qualified names in the model) and the operations, ``OFFLOAD`` and ``PREFETCH`` included, the stages whose
weights are streamed, the chunks the loss option computes the language-model head and its loss in
(``LOSS_CHUNKS``, 0: as written), and the model it was planned for (``SIGNATURE``: its ``apply_schedule``
refuses another model with a ``ValueError``, or with ``strict=False`` warns that the prediction does not hold).
A user adds two lines to a training script::

    from apply_schedule import apply_schedule
    apply_schedule(model)

The model is changed in place (its blocks' ``forward`` is wrapped where they live), so it works on models
whose ``forward`` calls its blocks in a loop with keyword arguments, as Hugging Face models do.
"""

from __future__ import annotations

import ast
import inspect
import pprint
import textwrap
from typing import Any

from memprof.units import format_bytes
from planner.executor import block_io as executor_block_io
from planner.executor import carried_grads as executor_carried_grads
from planner.executor import chunked_head as executor_chunked_head
from planner.executor import chunked_loss as executor_chunked_loss
from planner.executor import embedding_grad as executor_embedding_grad
from planner.executor import grad_into as executor_grad_into
from planner.executor import grads as executor_grads
from planner.executor import install as executor_install
from planner.executor import model_check as executor_model_check
from planner.executor import offload as executor_offload
from planner.executor import partial as executor_partial
from planner.executor import partial_tape as executor_partial_tape
from planner.executor import program as executor_program
from planner.executor import runtime as executor_runtime
from planner.executor import selective as executor_selective
from planner.executor import sharded as executor_sharded
from planner.executor import stage as executor_stage
from planner.executor import transfers as executor_transfers
from planner.executor import validate_ops
from planner.executor import weights as executor_weights
from planner.executor.apply import loss_chunks, partial_options, policies, runtime_ops
from planner.model.schedule import Schedule


def export_python(schedule: Schedule) -> str:
    """A standalone Python file (imports only ``torch`` and the standard library) applying ``schedule``.

    Raises:
        InvalidScheduleError: the schedule is not valid or cannot run inside a model's forward.
    """
    validate_ops(schedule.ops, schedule.chain.length, schedule)
    names = [list(stage.modules) for stage in schedule.chain.stages[:-1]]
    groups = names if all(names) else None
    ops = [list(op) for op in runtime_ops(schedule)]
    kept = {f"{stage}:{option}": [list(pair) for pair in pairs] for (stage, option), pairs in policies(schedule).items()}
    partial = [list(pair) for pair in partial_options(schedule)]
    return "\n".join([_header(schedule), _runtime_body(),
                      _data(schedule, groups, ops, kept, loss_chunks(schedule), partial), _APPLY])


def export_json(schedule: Schedule) -> str:
    """The schedule as JSON (``Schedule.to_json``) with the simulator's prediction.

    The schedule is always simulated, so a file that breaks a dependency is refused
    (:class:`InvalidScheduleError`) even when it carries a stale prediction.
    """
    from planner.simulation.simulator import simulate

    prediction = simulate(schedule.chain, schedule)
    return schedule.with_prediction(prediction.peak_bytes, prediction.makespan_ms,
                                    prediction.host_peak_bytes).to_json()


def _header(schedule: Schedule) -> str:
    def size(value: int | None) -> str:
        return "unknown" if value is None else f"{format_bytes(value)} ({value} bytes)"

    makespan = "unknown" if schedule.predicted_makespan_ms is None else f"{schedule.predicted_makespan_ms:.3f} ms"
    lines = [
        '"""Applies a memprof rematerialization schedule to a model. Needs nothing but torch.',
        "",
        "Usage, in a training script (the model is changed in place; parameters are unchanged):",
        "",
        "    from apply_schedule import apply_schedule",
        "    apply_schedule(model)",
        "",
        f"Schedule: algorithm {schedule.algorithm!r}, {schedule.chain.length} stages, {len(schedule.ops)} operations.",
        f"Budget: {size(schedule.budget_bytes)}; predicted step peak: {size(schedule.predicted_step_peak_bytes)};",
        f"predicted peak of the chain's activations: {size(schedule.predicted_peak_bytes)};",
        f"predicted makespan: {makespan}."
        + (f" Offloads to host memory (predicted host peak: {size(schedule.predicted_host_peak_bytes)})."
           if schedule.has_transfers else "")
        + (f" Streams the weights of stages {list(schedule.streamed_weights)}." if schedule.streamed_weights else ""),
        "Generated by memprof (planner.export.files).",
        '"""',
    ]
    return "\n".join(lines)


def _runtime_body() -> str:
    """The runtime modules' code, in dependency order, without docstrings and imports of each other."""
    parts = ["from __future__ import annotations"]
    for module in (executor_block_io, executor_sharded, executor_stage, executor_offload, executor_transfers, executor_selective,
                   executor_partial_tape, executor_partial, executor_program, executor_grads, executor_carried_grads, executor_runtime, executor_weights,
                   executor_install, executor_grad_into, executor_embedding_grad, executor_chunked_loss,
                   executor_chunked_head, executor_model_check):
        source = inspect.getsource(module)
        lines = source.splitlines()
        drop: set[int] = set()
        for node in ast.parse(source).body:
            is_docstring = isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
            is_future = isinstance(node, ast.ImportFrom) and node.module == "__future__"
            is_sibling = isinstance(node, ast.ImportFrom) and (node.module or "").startswith("planner")
            if is_docstring or is_future or is_sibling:
                drop.update(range(node.lineno - 1, node.end_lineno or node.lineno))
        kept = "\n".join(line for i, line in enumerate(lines) if i not in drop).strip("\n")
        title = f"# ---- {module.__name__.rpartition('.')[2]} "
        parts.append(title + "-" * (100 - len(title)) + "\n" + kept)
    return "\n\n\n".join(parts) + "\n"


def _literal(name: str, value: Any) -> str:
    text = pprint.pformat(value, width=110 - len(name) - 3, compact=True, sort_dicts=False)
    return f"{name} = " + textwrap.indent(text, " " * (len(name) + 3)).lstrip()


def _data(schedule: Schedule, groups: list[list[str]] | None, ops: list, kept: dict[str, list],
          chunks: tuple[int, bool] = (0, False), partial: list[list[int]] | None = None) -> str:
    info = {
        "algorithm": schedule.algorithm,
        "budget_bytes": schedule.budget_bytes,
        "predicted_step_peak_bytes": schedule.predicted_step_peak_bytes,
        "predicted_peak_bytes": schedule.predicted_peak_bytes,
        "predicted_makespan_ms": schedule.predicted_makespan_ms,
        "stages": schedule.chain.length,
    }
    parts = [
        "",
        "# ---- the schedule " + "-" * 81,
        _literal("SCHEDULE", info),
        "# The modules each stage 1..L runs (qualified names in the model; None: stage l is the l-th child).",
        _literal("STAGES", groups),
        "# Operations (kind, stage) run by the executor above.",
        _literal("OPS", ops),
        "# For each 'stage:option' of an F_all[option]: the ops it keeps, [aten overload, occurrence].",
        _literal("POLICIES", kept),
        "# The [stage, option] pairs whose option replays only what its dropped saved tensors need (partial).",
        _literal("PARTIAL", partial or []),
        "# The stages whose weights live in host memory and are streamed to the device (planner.simulation.weight_streams).",
        _literal("STREAMED", list(schedule.streamed_weights)),
        "# [chunks, eager]: the chunks the language-model head and its loss run in (planner.executor.chunked_head;",
        "# 0: as written), and whether their gradients are computed in the forward.",
        _literal("LOSS_CHUNKS", list(chunks)),
        "# Whether its chain was costed as compiled regions (memprof.capture.regional): then each stage's modules",
        "# run compiled (planner.executor.install.compiled_forwards) unless apply_schedule(compile=False).",
        _literal("COMPILED", bool(schedule.chain.source.get("compiled"))),
        "# The model the schedule was planned for (planner.model.signature; None: not known, nothing is checked).",
        _literal("SIGNATURE", schedule.chain.signature.to_dict() if groups and schedule.chain.signature else None),
    ]
    return "\n".join(parts) + "\n"


_APPLY = '''
def apply_schedule(model, container="", min_offload_bytes=MIN_OFFLOAD_BYTES, optimizer=None, strict=True,
                   compile=None):
    """Makes ``model`` train with the schedule, in place; returns ``model``.

    ``container`` is only used when STAGES is None: the nn.Sequential whose children are the stages.
    ``min_offload_bytes``: saved storages smaller than this stay on the device (OFFLOAD operations only).
    ``optimizer``: with streamed weights, the optimizer whose state follows them to host memory.
    ``strict``: refuse (ValueError) a model that is not the one the schedule was planned for (SIGNATURE); False:
    apply it anyway with a warning that its memory prediction does not hold, unless its blocks differ.
    ``compile``: run each stage's modules as compiled regions (None: as COMPILED says).
    """
    if STAGES is not None and SIGNATURE is not None:
        check_model(model, SIGNATURE, container, strict)
    previous = model.__dict__.pop("_memprof_schedule", None)
    if previous is not None:
        previous[0].remove()
    unwatch_input(model)
    remove_chunked_head(model)
    remove_embedding_grads(model)
    if STAGES is None:
        target = model.get_submodule(container) if container else model
        groups = [[child] for child in target.children()]
    else:
        try:
            groups = [[model.get_submodule(name) if name else model for name in group] for group in STAGES]
        except AttributeError as exc:
            raise ValueError(f"this schedule was made for a model with modules {STAGES}: {exc}") from None
    if len(groups) != SCHEDULE["stages"]:
        raise ValueError(f"this schedule has {SCHEDULE['stages']} stages; the model offers {len(groups)}")
    policies = {tuple(int(v) for v in key.split(":")): value for key, value in POLICIES.items()}
    executor = ScheduleExecutor(groups, [tuple(op) for op in OPS], min_offload_bytes, policies, STREAMED, root=model,
                                partial=PARTIAL, compiled=COMPILED if compile is None else compile)
    executor.install()
    if LOSS_CHUNKS[0]:
        install_chunked_head(model, chunks=LOSS_CHUNKS[0], eager=LOSS_CHUNKS[1])
    install_embedding_grads(model)
    if optimizer is not None:
        executor.follow(optimizer)
    if STAGES is not None and SIGNATURE is not None:
        watch_input(model, groups[0][0], SIGNATURE["input_bytes"], STAGES[0][0])
    object.__setattr__(model, "_memprof_schedule", (executor, SCHEDULE))
    return model


def _register_this_module():
    """Puts this file's module into sys.modules when it was loaded without it (importlib.util's
    spec_from_file_location and exec_module alone). torch.compile's dynamo imports, by name, the module of each
    function it traces that reads a global (the embeddings' forward above is one), and fails with "No module
    named ..." otherwise. A name another module already holds gets a suffix."""
    import gc
    import sys
    import types

    name = globals().get("__name__")
    if not name or (name in sys.modules and vars(sys.modules[name]) is globals()):
        return
    for referrer in gc.get_referrers(globals()):
        if isinstance(referrer, types.ModuleType) and vars(referrer) is globals():
            if name in sys.modules:
                name = globals()["__name__"] = f"{name}_{id(referrer):x}"
            sys.modules[name] = referrer
            return


_register_this_module()
'''
