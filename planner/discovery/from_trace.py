"""Building a chain's cost model, and what the training step holds around it, from a profiled run.

The chain is found in the module tree by :mod:`planner.discovery.chain_finder`; every candidate is costed, and by
default the one whose step can save the most memory (the widest range between its minimum feasible and
store-all budgets, the loss stage's chunked options counted: :mod:`planner.discovery.chain_ranking`) is kept.
Costs are medians over the recorded iterations (the first is dropped when there are more, since it includes
one-off allocations and warm-up), over the latest iterations that kept their detail, their times scaled to the
step without the profiler's hooks (:mod:`planner.discovery.time_scale`); the step around the chain
(:mod:`planner.discovery.step_costs`) comes from the last complete detailed iteration's timeline (from its last
micro-batch on when it accumulated gradients: :mod:`planner.discovery.accumulation`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

import pandas as pd

from memprof.trace import Trace
from planner.discovery import chain_ranking, step_costs
from planner.discovery.accumulation import last_micro_batch
from planner.discovery.chain_finder import (
    Candidate,
    ModuleTree,
    candidates,
    container_candidate,
    why_no_chain,
)
from planner.discovery.costed import median_iterations, structure_iteration
from planner.discovery.existing_grads import (
    embedding_weights,
    largest_after,
    module_weights,
    with_existing_grads,
)
from planner.discovery.graph_finder import (
    articulation_points,
    carried_edges,
    container_graph,
    graph_candidates,
    named_candidate,
)
from planner.discovery.loss_options import (
    CAUSAL_LM_CLASSES,
    DEFAULT_CHUNKS,
    head_from_costs,
    with_loss_options,
)
from planner.discovery.option_builder import RECOMPUTE_COSTS, ops_of_stage, with_options
from planner.discovery.signature import with_signature
from planner.discovery.time_scale import NO_SCALE, TimeScale, time_scale
from planner.errors import ChainError, NotAChainError
from planner.model.chain import Chain, Stage
from planner.model.transfer import TransferCosts
from planner.model.weights import weights_from_trace
from planner.solvers.carried_fit import Carried

_COST_COLUMNS = ["forward_ms", "backward_ms", "output_bytes", "saved_bytes", "input_bytes",
                 "forward_overhead_bytes", "backward_overhead_bytes", "weight_grad_bytes"]


def _structure(trace: Trace) -> pd.DataFrame:
    columns = ["iteration", "module", "parent", "order", "calls", "kind", "input_ids", "output_ids"]
    iteration = structure_iteration(trace)
    layers = trace.read("layers", columns=columns, iterations=iteration) if iteration else pd.DataFrame()
    if layers.empty:
        raise NotAChainError(f"run {trace.run_id} has no layer rows: record at least one iteration with record_stats()")
    return layers


def _candidates(trace: Trace, tree: ModuleTree, container: str | None) -> list[Candidate]:
    if container is None:
        found = [c for c in [*candidates(tree), *graph_candidates(tree)] if len(c.groups) >= 2]
        why = why_no_chain(tree) if not found else ""
        if why:  # modules run several times per step broke every run: say so rather than plan one stage
            raise NotAChainError(f"no chain of blocks found in run {trace.run_id}: {why}")
        found = found or candidates(tree)
        if not found:
            raise NotAChainError(f"no sequential chain found in run {trace.run_id}: no module has children that "
                                 "consume each other's outputs")
        return found
    if container not in tree.nodes:
        known = ", ".join(repr(m) for m in tree.nodes if m)[:300]
        raise NotAChainError(f"no module named {container!r} ran in run {trace.run_id}; modules: {known}")
    runs, sequence = container_candidate(tree, container)
    covered = [m for run in runs for g in run for m in g]
    if len(runs) != 1 or covered != sequence:
        try:  # a graph: blocks that also read earlier blocks' outputs
            return [container_graph(tree, container)]
        except NotAChainError as exc:
            raise NotAChainError(
                f"the children of {container!r} do not form one chain (found {len(runs)} separate runs"
                f"{': ' + ' | '.join(','.join(m for g in r for m in g) for r in runs) if runs else ''}); "
                f"name a container whose children each consume the previous one's output. As a graph: {exc}"
            ) from None
    return [Candidate(container, runs[0])]


def _medians(trace: Trace, scale: TimeScale) -> pd.DataFrame:
    layers = trace.read("layers", columns=["iteration", "module", *_COST_COLUMNS], iterations=median_iterations(trace))
    costs = layers.groupby("module")[_COST_COLUMNS].median()
    costs["forward_ms"] *= scale.forward
    costs["backward_ms"] *= scale.backward
    return costs


def _timeline(trace: Trace) -> step_costs.Timeline:
    iteration = structure_iteration(trace)
    events = trace.read("events", iterations=iteration)
    split = trace.read("iterations", columns=["iteration", "micro_batches"], iterations=iteration).micro_batches
    # gradient accumulation: the step around the chain is the last micro-batch's (planner.discovery.accumulation)
    return step_costs.Timeline(last_micro_batch(events, int(split.max()) if len(split) else 1))


def _stages(candidate: Candidate, costs: pd.DataFrame, fresh_grads: bool, freed: tuple[int, ...]) -> list[Stage]:
    stages = []
    for group, freed_bytes in zip(candidate.groups, freed):
        rows = costs.loc[list(group)]
        output = int(rows.output_bytes.iloc[-1])
        stages.append(Stage(
            forward_ms=float(rows.forward_ms.sum()),
            backward_ms=float(rows.backward_ms.sum()),
            output_bytes=output,
            saved_bytes=max(int(rows.saved_bytes.sum()) - freed_bytes, output),
            grad_bytes=output,
            forward_overhead_bytes=int(rows.forward_overhead_bytes.max()),
            backward_overhead_bytes=int(rows.backward_overhead_bytes.max()),
            name=group[0] if len(group) == 1 else f"{group[0]}..{group[-1]}",
            modules=group,
            weight_grad_bytes=int(rows.weight_grad_bytes.sum()) if fresh_grads else 0,
        ))
    return stages


def _build(trace: Trace, tree: ModuleTree, candidate: Candidate, costs: pd.DataFrame, timeline: step_costs.Timeline,
           auto: bool, fuse: bool = True, weights: Mapping[str, int] | None = None,
           scale: TimeScale = NO_SCALE) -> Chain:
    input_bytes = int(costs.loc[candidate.groups[0][0]].input_bytes)
    outputs = {m: int(costs.loc[m].output_bytes) for m in candidate.modules}
    readers = frozenset(candidate.groups[c - 1][0] for e in carried_edges(tree, candidate.groups) for c in e.consumers)
    if fuse:
        groups, freed = step_costs.fuse_freed_outputs(candidate.groups, timeline, outputs, readers)
    else:
        groups, freed = candidate.groups, tuple(0 for _ in candidate.groups)
    candidate = Candidate(candidate.parent, groups)
    carried = _carried(tree, candidate, costs)
    bounds = step_costs.boundaries(timeline, candidate.groups[0], candidate.groups[-1])
    step, loss, fresh = None, Stage(0.0, 0.0, 0, 0, 0, name="loss"), True
    if bounds is None:
        stages = _stages(candidate, costs, True, freed)
    else:
        # gradients already held when the chain starts (zero_grad(set_to_none=False)) are model state
        fresh = int(timeline.rows.at[bounds.chain_start, "weight_grads"]) * 2 < int(timeline.rows.weight_grads.max())
        stages = step_costs.calibrated(_stages(candidate, costs, fresh, freed), timeline, candidate.groups,
                                       input_bytes)
        step, loss = step_costs.measure(timeline, bounds, input_bytes, stages[-1].grad_bytes,
                                        sum(stage.saved_bytes for stage in stages))
        weights = weights or {}
        stages, loss = with_existing_grads(stages, loss, timeline, candidate.groups, input_bytes,
                                           embedding_weights(tree, weights), largest_after(tree, weights, candidate.groups))
        # the loss stage is timed on the timeline (the host's clock of a hooked iteration), like the layers
        loss = replace(loss, forward_ms=loss.forward_ms * scale.forward, backward_ms=loss.backward_ms * scale.backward)
    return Chain(
        name=candidate.parent or trace.meta.get("model", "model"),
        input_bytes=input_bytes,
        stages=(*stages, loss),
        source={"run_id": trace.run_id, "container": candidate.parent, "auto": auto,
                "modules": [list(g) for g in candidate.groups], "time_scale": scale.to_json(),
                # costed as compiled regions (memprof.capture.regional): its schedules run their stages so too
                **({"compiled": True} if trace.meta.get("regional_iterations") or trace.meta.get("compiled_regions")
                   else {}),
                **({"articulation_points": list(articulation_points(candidate.groups, carried_edges(
                    tree, candidate.groups)))} if carried else {})},
        step=step,
        transfer=transfer_from_meta(trace.meta),
        carried=carried,
        weights=weights_from_trace(trace, candidate.groups, step, fresh),
    )


def _carried(tree: ModuleTree, candidate: Candidate, costs: pd.DataFrame) -> tuple[Carried, ...]:
    """The tensors the stages read besides the running activation, with their sizes (see planner.solvers.carried_fit)."""
    out = []
    for edge in carried_edges(tree, candidate.groups):
        consumers = tuple(c for c in edge.consumers if c > max(edge.producer_stage + 1, 1))
        grad = bool(edge.producer)  # made by a module: it may carry a gradient; a mask made by an op does not
        if not consumers or (edge.producer_stage == 0 and not grad):
            continue
        size = int(costs.loc[edge.producer].output_bytes) if edge.producer in costs.index else 0
        out.append(Carried(edge.producer_stage, consumers, size, edge.producer, grad))
    return tuple(out)


def transfer_from_meta(meta: dict) -> TransferCosts | None:
    """The transfer costs a run stored in ``meta.json`` (key ``transfer``), or ``None`` (the default applies).

    The key is optional and written only by a training script that measured its device
    (:func:`planner.measure.bandwidth.measure_transfer_bandwidth`, passed as ``extra_meta``).
    """
    raw = meta.get("transfer")
    return TransferCosts.from_dict(raw) if raw is not None else None


def chain_from_trace(trace: Trace, container: str | None = None, checkpoints: Sequence[str] | None = None,
                     recompute_cost: str = "time", selective_overhead_us: float | None = None,
                     loss_chunks: Sequence[int] = DEFAULT_CHUNKS) -> Chain:
    """Builds the cost model of the model's chain from a profiled run.

    Blocks that read earlier blocks' outputs besides the previous one's (a U-Net's skips, an encoder's output
    read by every decoder layer) still form a chain: those tensors are carried across the stages between
    (:mod:`planner.discovery.graph_finder`, :mod:`planner.solvers.carried_fit`).

    Args:
        trace: a run opened with :func:`memprof.load_trace`.
        container: the module whose children form the chain (e.g. ``"features"``); when omitted, the chain
            anywhere in the model whose step can save the most memory (with its loss stage's options).
        checkpoints: the modules whose outputs are the stage boundaries, i.e. the stages themselves, in the
            order they run (the user's choice of checkpoints); excludes ``container``.
        recompute_cost: what weighs the recomputation of a stage's options when the run recorded its ops:
            ``"time"`` (their recorded times) or ``"flops"`` (their FLOPs, as torch.compile's partitioner).
        selective_overhead_us: what a selective checkpoint adds per op (microseconds), paid by every option on
            each op of its stage; default: what the run's planning pass measured (``meta.json``), else 0. Pass
            0 for a device whose kernels hide the dispatch (large blocks on a GPU).
        loss_chunks: the chunk counts the loss stage offers when a language-model head runs after the chain
            (:mod:`planner.discovery.loss_options`; the executor then computes the head and its cross-entropy
            in chunks, gradients equal to float rounding); ``()``: none, the loss always runs as written and
            the candidate chains are ranked so (``memprof plan --no-loss-options``).

    Raises:
        ChainError: an unknown ``recompute_cost``, a negative or unknown ``selective_overhead_us`` (given
            or in ``meta.json``).
        NotAChainError: no chain could be found, or the checkpoints do not cut the graph (the message says
            what was looked at, or which tensor crosses which checkpoint).
    """
    if recompute_cost not in RECOMPUTE_COSTS:
        raise ChainError(f"recompute_cost must be one of {RECOMPUTE_COSTS}, found {recompute_cost!r}")
    tree = ModuleTree(_structure(trace))
    if checkpoints is not None and container is not None:
        raise NotAChainError("give either a container or the checkpoints, not both")
    found = [named_candidate(tree, list(checkpoints))] if checkpoints is not None else _candidates(trace, tree, container)
    scale = time_scale(trace, median_iterations(trace))
    costs, timeline = _medians(trace, scale), _timeline(trace)
    weights = module_weights(trace, structure_iteration(trace))
    chains = [_build(trace, tree, candidate, costs, timeline, container is None and checkpoints is None,
                     fuse=checkpoints is None, weights=weights, scale=scale) for candidate in found]
    loss_options = _loss_options(trace, tree, costs, loss_chunks)
    if len(chains) == 1:
        return with_signature(trace, loss_options(_with_op_options(trace, chains[0], recompute_cost,
                                                                    selective_overhead_us)))
    # ranked as the planner would get them: the loss stage's options lower some candidates' minimums
    best, reason = chain_ranking.best([loss_options(chain) for chain in chains])
    chosen = replace(chains[best], source={**chains[best].source, "why": reason})
    return with_signature(trace, loss_options(_with_op_options(trace, chosen, recompute_cost, selective_overhead_us)))


def _loss_options(trace: Trace, tree: ModuleTree, costs: pd.DataFrame,
                  chunks: Sequence[int]) -> Callable[[Chain], Chain]:
    """What gives a chain the options of its loss stage: computing the language-model head and its loss in
    chunks, when the model is a Hugging Face causal LM (the executor replaces its ``loss_function``), a head
    runs after the chain and the loss stage was measured (a chain with step costs); else the chain as it is."""
    if not chunks or not str(trace.meta.get("model", "")).endswith(CAUSAL_LM_CLASSES):
        return lambda chain: chain
    structure = [(name, node.order, node.kind) for name, node in tree.nodes.items()]
    flops: dict[str, int] = {}
    for record in trace.op_records():
        flops[record.module] = flops.get(record.module, 0) + record.flops
    layers = trace.read("layers", columns=["iteration", "module", "weight_bytes"],
                        iterations=structure_iteration(trace))
    weights = {str(m): int(b) for m, b in zip(layers.module, layers.weight_bytes)}
    outputs, times = costs.output_bytes.astype(int).to_dict(), costs.forward_ms.astype(float).to_dict()

    def attach(chain: Chain) -> Chain:
        head = head_from_costs(structure, chain, outputs, times, flops, weights) if chain.step is not None else None
        return chain if head is None else with_loss_options(chain, head, chunks)

    return attach


def _with_op_options(trace: Trace, chain: Chain, recompute_cost: str, overhead_us: float | None) -> Chain:
    """``chain`` with each stage's recomputation options, when the run recorded a planning pass (its ops)."""
    records = trace.op_records()
    if not records:
        return chain
    by_stage = {index: ops_of_stage(records, stage) for index, stage in enumerate(chain.stages[:-1], start=1)}
    return with_options(chain, {index: ops for index, ops in by_stage.items() if ops}, recompute_cost,
                        _selective_overhead_ms(trace, overhead_us))


def _selective_overhead_ms(trace: Trace, given_us: float | None) -> float:
    """The selective checkpoint's cost per op in ms: ``given_us``, else what the run's planning pass measured
    (0 when it did not: a run recorded before the measurement was added, or not closed)."""
    where = "selective_overhead_us" if given_us is not None else "meta.json's selective_overhead_us_per_op"
    value = given_us if given_us is not None else trace.meta.get("selective_overhead_us_per_op", 0.0)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < float("inf"):
        raise ChainError(f"{where} must be a non-negative number of microseconds, found {value!r}")
    return float(value) / 1000.0
