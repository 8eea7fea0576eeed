"""Finding the sequential chain in a profiled model and building its cost model from the trace.

A chain is a run of sibling modules in which each consumes the storage the previous one produced
(views share storage, so a ``flatten`` between two layers does not break it). A module that returns
its input's storage (an in-place ReLU, a view) adds no activation of its own and is folded into the
stage before it. Costs are medians over the recorded iterations (the first is dropped when there are
more, since it includes one-off allocations and warm-up).
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from memprof.reader import Trace
from planner.chain import Chain, Stage
from planner.errors import NotAChainError

_COST_COLUMNS = ["forward_ms", "backward_ms", "output_bytes", "saved_bytes", "input_bytes",
                 "forward_overhead_bytes", "backward_overhead_bytes"]


@dataclass(frozen=True)
class _Candidate:
    container: str
    groups: tuple[tuple[str, ...], ...]  # modules of each stage, in order


def _complete(trace: Trace, layers: pd.DataFrame) -> pd.DataFrame:
    """Drops the partial iteration of a failed run (its backward never happened)."""
    failure = trace.meta.get("failure") or {}
    if "iteration" in failure and layers.iteration.nunique() > 1:
        layers = layers[layers.iteration != failure["iteration"]]
    return layers


def _structure(trace: Trace) -> pd.DataFrame:
    columns = ["iteration", "module", "parent", "order", "calls", "input_ids", "output_ids"]
    layers = _complete(trace, trace.read("layers", columns=columns))
    if layers.empty:
        raise NotAChainError(f"run {trace.run_id} has no layer rows: record at least one iteration with record_stats()")
    last = layers[layers.iteration == layers.iteration.max()]
    return last[last.calls > 0].sort_values("order")


def _chains_under(children: pd.DataFrame) -> list[tuple[tuple[str, ...], ...]]:
    """Maximal runs of consecutive children linked by storage, as stage groups."""
    runs: list[list[list[str]]] = []
    current: list[list[str]] = []
    previous_out: set[int] = set()
    for row in children.itertuples():
        inputs, outputs = set(row.input_ids), set(row.output_ids)
        if current and inputs & previous_out:
            if outputs and outputs <= inputs:  # in place or a view: no new activation
                current[-1].append(row.module)
            else:
                current.append([row.module])
        else:
            if current:
                runs.append(current)
            current = [[row.module]]
        previous_out = outputs or previous_out
    if current:
        runs.append(current)
    return [tuple(tuple(g) for g in run) for run in runs]


def find_chain(trace: Trace, container: str | None = None) -> tuple[str, tuple[tuple[str, ...], ...]]:
    """Returns ``(container, stage groups)`` of the chosen chain.

    Raises:
        NotAChainError: the named container does not exist or its children do not form a chain, or
            no chain of at least one stage exists.
    """
    layers = _structure(trace)
    if container is not None:
        if container not in set(layers.module):
            known = ", ".join(repr(m) for m in layers.module if m)[:300]
            raise NotAChainError(f"no module named {container!r} ran in run {trace.run_id}; modules: {known}")
        children = layers[layers.parent == container]
        runs = _chains_under(children) if len(children) else []
        if len(runs) != 1:
            raise NotAChainError(
                f"the children of {container!r} do not form one chain (found {len(runs)} separate runs"
                f"{': ' + ' | '.join(','.join(m for g in r for m in g) for r in runs) if runs else ''}); "
                "name a container whose children each consume the previous one's output"
            )
        return container, runs[0]
    best: _Candidate | None = None
    for parent in layers[layers.module != ""].parent.unique():
        for run in _chains_under(layers[(layers.parent == parent) & (layers.module != "")]):
            if best is None or len(run) > len(best.groups):
                best = _Candidate(parent, run)
    if best is None or len(best.groups) < 1:
        raise NotAChainError(f"no sequential chain found in run {trace.run_id}: no module has children that "
                             "consume each other's outputs")
    return best.container, best.groups


def _medians(trace: Trace) -> pd.DataFrame:
    layers = _complete(trace, trace.read("layers", columns=["iteration", "module", *_COST_COLUMNS]))
    iterations = sorted(layers.iteration.unique())
    if len(iterations) > 1:
        layers = layers[layers.iteration != iterations[0]]
    return layers.groupby("module")[_COST_COLUMNS].median()


def chain_from_trace(trace: Trace, container: str | None = None) -> Chain:
    """Builds the cost model of the model's chain from a profiled run.

    Args:
        trace: a run opened with :func:`memprof.load_trace`.
        container: the module whose children form the chain (e.g. ``"features"``); found
            automatically (the longest chain) when omitted.

    Raises:
        NotAChainError: no chain could be found (the message says what was looked at).
    """
    chosen, groups = find_chain(trace, container)
    costs = _medians(trace)
    stages = []
    for group in groups:
        rows = costs.loc[list(group)]
        output = int(rows.output_bytes.iloc[-1])
        stages.append(Stage(
            forward_ms=float(rows.forward_ms.sum()),
            backward_ms=float(rows.backward_ms.sum()),
            output_bytes=output,
            saved_bytes=max(int(rows.saved_bytes.sum()), output),
            grad_bytes=output,
            forward_overhead_bytes=int(rows.forward_overhead_bytes.max()),
            backward_overhead_bytes=int(rows.backward_overhead_bytes.max()),
            name=group[0] if len(group) == 1 else f"{group[0]}..{group[-1]}",
            modules=group,
        ))
    stages.append(Stage(0.0, 0.0, 0, 0, 0, name="loss"))
    return Chain(
        name=chosen or trace.meta.get("model", "model"),
        input_bytes=int(costs.loc[groups[0][0]].input_bytes),
        stages=tuple(stages),
        source={"run_id": trace.run_id, "container": chosen, "auto": container is None,
                "modules": [list(g) for g in groups]},
    )
