"""Finding chains of blocks anywhere in a profiled model's module tree, from the trace's storage links.

A chain is a sequence of modules, each consuming the storage the previous one produced, that the model's
forward calls one after the other. The trace's ``layers`` table says, per module, which storages it
received (``input_ids``) and returned (``output_ids``); from it:

* A module that is never called itself (an ``nn.ModuleList``) is see-through: its children are called by
  its parent's ``forward`` (a Python loop), so they count as the parent's children.
* A container (an ``nn.Sequential``, a ResNet stage) is *transparent* when its children form one chain
  from its input to its output: it is replaced by that chain, so chains cross nesting levels
  (``conv1, bn1, maxpool, layer1.0, layer1.1, layer2.0, ...``). Blocks (any other class) stay whole: a
  chain is made of blocks, not of the layers inside them.
* Among the children a parent calls, maximal linked runs are chains. A module returning its input's
  storage (an in-place ReLU, a view) is folded into the stage before it; a module called more than once
  per step (a shared block) cannot be a stage and breaks a run; so does an output that a later module
  outside the next stage also reads (a skip connection: the chain's rules would free it too early).

Every parent proposes its runs; :func:`planner.discovery.from_trace.chain_from_trace` costs them and keeps the one
that saves the most memory.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pandas as pd

CONTAINER_KINDS = frozenset({"Sequential", "ModuleList", "ModuleDict"})


@dataclass(frozen=True)
class Candidate:
    """One chain the model offers.

    Attributes:
        parent: the module whose ``forward`` calls the chain's modules (``""``: the model).
        groups: the modules of each stage, in order (qualified names).
    """

    parent: str
    groups: tuple[tuple[str, ...], ...]

    @property
    def modules(self) -> tuple[str, ...]:
        """Every module the chain runs, in order."""
        return tuple(name for group in self.groups for name in group)


@dataclass(frozen=True)
class _Node:
    module: str
    order: int
    calls: int
    kind: str
    inputs: frozenset[int]
    outputs: frozenset[int]


class ModuleTree:
    """The modules of one iteration, as the finder needs them."""

    def __init__(self, structure: pd.DataFrame) -> None:
        self.nodes: dict[str, _Node] = {}
        self.children: dict[str, list[str]] = {}
        self._flattened: dict[str, list[str]] = {}
        for row in structure.sort_values("order").itertuples():
            self.nodes[row.module] = _Node(row.module, int(row.order), int(row.calls), str(row.kind),
                                           frozenset(int(i) for i in row.input_ids),
                                           frozenset(int(i) for i in row.output_ids))
            if row.module:
                self.children.setdefault(row.parent, []).append(row.module)

    def called_children(self, parent: str) -> list[str]:
        """The modules ``parent``'s forward calls directly, in call order (see-through containers opened)."""
        out: list[str] = []
        for child in self.children.get(parent, []):
            if self.nodes[child].calls == 0:
                out += self.called_children(child)
            elif self.nodes[child].calls > 0:
                out.append(child)
        return sorted(out, key=lambda name: self.nodes[name].order)

    def flattened(self, parent: str) -> list[str]:
        """``called_children(parent)`` with every transparent child replaced by its own chain."""
        if parent not in self._flattened:  # memoised: transparent() and every parent ask for the same subtrees
            out: list[str] = []
            for child in self.called_children(parent):
                out += self.flattened(child) if self.transparent(child) else [child]
            self._flattened[parent] = out
        return self._flattened[parent]

    def transparent(self, module: str) -> bool:
        """Whether ``module``'s children form one chain from its input to its output."""
        node = self.nodes[module]
        if node.calls != 1 or node.kind not in CONTAINER_KINDS:
            return False
        inner = self.flattened(module)
        if not inner:
            return False
        runs = linked_runs(self, inner)
        if len(runs) != 1 or len([m for g in runs[0] for m in g]) != len(inner):
            return False
        if len(split_at_skips(self, runs[0])) != 1:
            return False
        first, last = self.nodes[inner[0]], self.nodes[runs[0][-1][-1]]
        return bool(first.inputs & node.inputs) and bool(node.outputs) and node.outputs <= last.outputs

    def descendants(self, module: str) -> Iterator[str]:
        """``module`` and every module below it."""
        yield module
        for child in self.children.get(module, []):
            yield from self.descendants(child)


def linked_runs(tree: ModuleTree, sequence: list[str]) -> list[tuple[tuple[str, ...], ...]]:
    """Maximal runs of ``sequence`` linked by storage, as stage groups (in-place modules and views folded)."""
    runs: list[list[list[str]]] = []
    current: list[list[str]] = []
    previous_out: frozenset[int] = frozenset()
    for name in sequence:
        node = tree.nodes[name]
        if node.calls > 1:  # a shared module cannot be one stage of the chain
            if current:
                runs.append(current)
            current, previous_out = [], frozenset()
            continue
        if current and node.inputs & previous_out:
            if node.outputs and node.outputs <= node.inputs:  # in place or a view: no new activation
                current[-1].append(name)
            else:
                current.append([name])
        else:
            if current:
                runs.append(current)
            current = [[name]]
        previous_out = node.outputs or previous_out
    if current:
        runs.append(current)
    return [tuple(tuple(g) for g in run) for run in runs]


def split_at_skips(tree: ModuleTree, groups: tuple[tuple[str, ...], ...]) -> list[tuple[tuple[str, ...], ...]]:
    """Cuts a run where a stage's output is also read by a module outside the next stage (a skip)."""
    pieces: list[list[tuple[str, ...]]] = [[groups[0]]]
    for index in range(1, len(groups)):
        previous, stage = groups[index - 1], groups[index]
        # what the next stage returns again (T5's position bias, passed block to block) is read from it
        outputs = tree.nodes[previous[-1]].outputs - tree.nodes[stage[-1]].outputs
        allowed = {m for name in (*previous, *stage) for m in tree.descendants(name)}
        start = tree.nodes[stage[0]].order
        readers = [n for n in tree.nodes.values()
                   if n.module not in allowed and n.order > start and n.inputs & outputs and n.calls > 0]
        if readers:
            pieces.append([stage])
        else:
            pieces[-1].append(stage)
    return [tuple(piece) for piece in pieces]


def candidates(tree: ModuleTree) -> list[Candidate]:
    """Every chain some parent's ``forward`` runs, finest first (transparent modules opened)."""
    found: list[Candidate] = []
    seen: set[tuple[tuple[str, ...], ...]] = set()
    for parent, node in tree.nodes.items():
        if node.calls < 1:
            continue
        for run in linked_runs(tree, tree.flattened(parent)):
            for piece in split_at_skips(tree, run):
                if piece not in seen:
                    seen.add(piece)
                    found.append(Candidate(parent, piece))
    return found


def container_candidate(tree: ModuleTree, container: str) -> tuple[list[tuple[tuple[str, ...], ...]], list[str]]:
    """The runs among the children of ``container`` (opened as usual), and those children."""
    sequence = tree.flattened(container)
    runs = [piece for run in linked_runs(tree, sequence) for piece in split_at_skips(tree, run)]
    return runs, sequence


def runs_per_step(tree: ModuleTree, module: str) -> str:
    """``"'m' runs N times per step"``: how the finders say why a module cannot be a stage or a checkpoint."""
    return f"{module!r} runs {tree.nodes[module].calls} times per step"


def repeated(tree: ModuleTree) -> list[str]:
    """The outermost modules below the model that ran more than once per step, in call order.

    A block called again in a loop, or a module whose weights are shared between calls, runs several times
    in one forward: it cannot be one stage of a chain (and modules inside it run as often).
    """
    several = [name for name, node in tree.nodes.items() if name and node.calls > 1]
    return [name for name in several if not any(name.startswith(f"{other}.") for other in several)]


def why_no_chain(tree: ModuleTree) -> str:
    """What keeps every module's children from forming a chain, when modules ran more than once; else ``""``."""
    root = tree.nodes.get("")
    if root is not None and root.calls > 1:
        return (f"the model's forward runs {root.calls} times per step with no backward after each (memprof divides "
                "a step into micro-batches only when each forward is followed by its own backward, as in gradient "
                "accumulation; a trace written before memprof recognised accumulation is summed over them: "
                "profile it again), so every module runs as often and none can be one stage of a chain; profile "
                "a step that calls the model once per backward")
    found = repeated(tree)
    if not found:
        return ""
    named = ", ".join(runs_per_step(tree, name) for name in found[:5])
    more = f" and {len(found) - 5} more" if len(found) > 5 else ""
    return (f"{named}{more}: a module that runs more than once in one step (a block called again in a loop, "
            "weights shared between calls) cannot be one stage of a chain; name a container whose blocks each run "
            "once (container=...), or give each call a module of its own")
