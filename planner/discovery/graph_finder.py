"""General graphs of blocks as one chain of stages, with the tensors that cross stages (skips) carried.

A U-Net's decoder reads the encoder's outputs; every decoder layer of an encoder-decoder transformer reads
the encoder's output. Their blocks still run one after the other, each reading the previous one's output,
so they are a chain -- plus *carried* tensors: a tensor a block reads besides the running activation, made
by an earlier stage (a skip connection) or before the chain (the target embedding of a decoder). A carried
tensor stays live from its producer to its last reader and its gradient flows back to its producer; the
executor passes it to every reader and :mod:`planner.solvers.carried_fit` counts its memory (the rule lives there).

Cuts that no carried tensor crosses are the graph's *articulation points* (the OpenAI gradient-checkpointing
``memory`` strategy); they are reported with the chain. Unlike that strategy, a graph without any (a U-Net)
is still planned: its skips are carried across the cuts.

The block sequence of a parent is found as in :mod:`planner.discovery.chain_finder`, except that modules which loop
over their own blocks (an ``nn.TransformerEncoder``, an ``nn.Transformer`` made of two such stacks) are
opened too when their children cover them (``graph_sequence``). A user may also name the stages'
modules outright (``named_candidate``, the seed's ``collection``).
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.discovery.chain_finder import CONTAINER_KINDS, Candidate, ModuleTree, runs_per_step
from planner.errors import NotAChainError


@dataclass(frozen=True)
class CarriedEdge:
    """A tensor a stage reads besides the running activation.

    Attributes:
        storage: the tensor's storage id in the trace.
        producer: the module that returned it.
        producer_stage: the 1-based stage that produced it; 0 when made before the chain (or by nothing the
            trace saw: a mask computed in the model's forward).
        consumers: the 1-based stages that read it.
    """

    storage: int
    producer: str
    producer_stage: int
    consumers: tuple[int, ...]


def _loops_over_blocks(tree: ModuleTree, module: str) -> bool:
    """Whether ``module`` calls children of a container it never calls itself (``for layer in self.layers``)."""
    return any(tree.nodes[child].calls == 0 and tree.children.get(child) for child in tree.children.get(module, []))


def _opens(tree: ModuleTree, module: str) -> bool:
    """Whether a module is replaced by its children in a graph sequence."""
    node = tree.nodes[module]
    inner = tree.called_children(module)
    if node.calls != 1 or not inner:
        return False
    stack = node.kind in CONTAINER_KINDS or _loops_over_blocks(tree, module) or all(
        _loops_over_blocks(tree, child) for child in inner)
    if not stack:
        return False
    sequence = graph_sequence(tree, module)
    first, last = tree.nodes[sequence[0]], tree.nodes[sequence[-1]]
    if not (first.inputs & node.inputs) or not node.outputs or not node.outputs <= last.outputs:
        return False
    made = set(node.inputs)
    for name in sequence:  # every block reads what its siblings made or what the module received
        if not tree.nodes[name].inputs <= made:
            return False
        made |= tree.nodes[name].outputs
    return True


def graph_sequence(tree: ModuleTree, parent: str) -> list[str]:
    """The blocks ``parent``'s forward runs, in order, with containers and block stacks opened."""
    out: list[str] = []
    for child in tree.called_children(parent):
        out += graph_sequence(tree, child) if _opens(tree, child) else [child]
    return out


def _producers(tree: ModuleTree) -> dict[int, str]:
    """For each storage, the first module that returned it (outermost first among equals)."""
    found: dict[int, str] = {}
    for node in sorted(tree.nodes.values(), key=lambda n: n.order):
        for storage in node.outputs:
            found.setdefault(storage, node.module)
    return found


def graph_runs(tree: ModuleTree, sequence: list[str]) -> list[tuple[tuple[str, ...], ...]]:
    """Maximal runs of blocks each reading the previous one's output (shared modules break a run).

    In-place modules and views (output storage among their inputs) are folded into the stage before them;
    unlike :func:`planner.discovery.chain_finder.linked_runs`, a block may read other tensors too (they are carried).
    """
    runs: list[list[list[str]]] = []
    current: list[list[str]] = []
    previous_out: frozenset[int] = frozenset()
    for name in sequence:
        node = tree.nodes[name]
        if node.calls > 1:
            if current:
                runs.append(current)
            current, previous_out = [], frozenset()
            continue
        if current and node.inputs & previous_out:
            if node.outputs and node.outputs <= node.inputs and len(node.inputs) == 1:
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


def carried_edges(tree: ModuleTree, groups: tuple[tuple[str, ...], ...]) -> tuple[CarriedEdge, ...]:
    """The tensors each stage's first module reads besides the previous stage's output."""
    producers = _producers(tree)
    stage_of: dict[int, int] = {}
    for index, group in enumerate(groups, start=1):
        for name in group:
            for storage in tree.nodes[name].outputs:
                stage_of.setdefault(storage, index)
    readers: dict[int, list[int]] = {}
    for index, group in enumerate(groups, start=1):
        node = tree.nodes[group[0]]
        previous = tree.nodes[groups[index - 2][-1]].outputs if index > 1 else frozenset()
        link = node.inputs & previous if index > 1 else frozenset(sorted(node.inputs)[:1])
        for storage in sorted(node.inputs - link):
            readers.setdefault(storage, []).append(index)
    return tuple(CarriedEdge(storage, producers.get(storage, ""), stage_of.get(storage, 0), tuple(stages))
                 for storage, stages in sorted(readers.items()))


def _read_outside(tree: ModuleTree, groups: tuple[tuple[str, ...], ...]) -> str | None:
    """A tensor a stage (not the last) returns that a module outside the chain reads, in words; else None."""
    inside = {m for group in groups for name in group for m in tree.descendants(name)}
    for group in groups[:-1]:
        outputs = tree.nodes[group[-1]].outputs
        start = tree.nodes[group[-1]].order
        for node in tree.nodes.values():
            reads = node.module not in inside and node.calls > 0 and node.order > start and node.inputs & outputs
            if reads and not any(m.startswith(f"{node.module}.") for m in inside):  # an enclosing module passes it
                return f"{node.module!r} reads the output of {group[-1]!r} outside the chain"
    return None


def articulation_points(groups: tuple[tuple[str, ...], ...], edges: tuple[CarriedEdge, ...]) -> tuple[str, ...]:
    """The stages after which no tensor made by an earlier stage crosses the cut (besides the activation)."""
    crossed = {cut for e in edges if e.producer_stage for cut in range(e.producer_stage + 1, max(e.consumers))}
    return tuple(groups[k - 1][-1] for k in range(1, len(groups)) if k not in crossed)


def graph_candidates(tree: ModuleTree) -> list[Candidate]:
    """Chains of blocks that read tensors of earlier blocks (skips), found under every parent.

    Runs that read nothing but the previous block's output are left to :func:`planner.discovery.chain_finder.candidates`.
    """
    found: list[Candidate] = []
    for parent, node in tree.nodes.items():
        if node.calls < 1:
            continue
        for run in graph_runs(tree, graph_sequence(tree, parent)):
            edges = carried_edges(tree, run)
            if len(run) >= 2 and any(e.producer_stage for e in edges) and _read_outside(tree, run) is None:
                found.append(Candidate(parent, run))
    return found


def container_graph(tree: ModuleTree, container: str) -> Candidate:
    """The chain of segments of ``container``'s children.

    Raises:
        NotAChainError: the children are not one run (the message names the block that does not read the
            previous one's output, e.g. a parallel branch) or a stage's output is read outside the chain.
    """
    sequence = graph_sequence(tree, container)
    runs = graph_runs(tree, sequence) if sequence else []
    if len(runs) != 1:
        raise NotAChainError(_why_not_one_run(tree, container, sequence, runs))
    outside = _read_outside(tree, runs[0])
    if outside is not None:
        raise NotAChainError(f"the blocks of {container!r} cannot be segmented: {outside}; plan a container that "
                             "holds that reader too")
    return Candidate(container, runs[0])


def _why_not_one_run(tree: ModuleTree, container: str, sequence: list[str],
                     runs: list[tuple[tuple[str, ...], ...]]) -> str:
    if not sequence:
        return f"{container!r} calls no modules; name a module whose forward calls blocks"
    for previous, name in zip(sequence, sequence[1:]):
        node = tree.nodes[name]
        if node.calls > 1:
            return (f"the blocks of {container!r} cannot be segmented: {runs_per_step(tree, name)} "
                    "(a shared module cannot be one stage)")
        if not node.inputs & tree.nodes[previous].outputs:
            return (f"the blocks of {container!r} cannot be segmented: {name!r} does not read the output of "
                    f"{previous!r} (parallel branches), so no cut between them separates the graph; plan the "
                    f"module that holds both branches as one block (e.g. its parent), or name the checkpoints")
    return f"the blocks of {container!r} form {len(runs)} separate runs"


def _what_it_reads(tree: ModuleTree, name: str) -> str:
    """``"; it reads the output of 'm' (...)"`` for the outermost modules that made ``name``'s inputs (its own
    enclosing modules left out), those that ran more than once (never a checkpoint, nor inside one) said so;
    ``""`` when none is known."""
    made: dict[str, str] = {}
    for storage in sorted(tree.nodes[name].inputs):
        makers = [n for n in tree.nodes.values()
                  if n.module and storage in n.outputs and not f"{name}.".startswith(f"{n.module}.")]
        if makers:
            outer = min(makers, key=lambda n: (n.module.count("."), n.order))
            made.setdefault(outer.module, "" if outer.calls == 1 else
                            f" (run {outer.calls} times per step: it cannot be a checkpoint, nor lie inside one)")
    if not made:
        return ""
    ordered = sorted(made, key=lambda m: tree.nodes[m].order)
    return "; it reads the output of " + ", ".join(f"{m!r}{made[m]}" for m in ordered)


def named_candidate(tree: ModuleTree, names: list[str]) -> Candidate:
    """The chain whose stages are the named modules, in the order they ran (the user's checkpoints).

    Raises:
        NotAChainError: a name is unknown or shared, a named module does not read the previous one's output,
            or a named module's output is read by a module between the checkpoints (the message names it).
    """
    if len(names) < 1:
        raise NotAChainError("checkpoints: name at least one module")
    for name in names:
        if name not in tree.nodes or not name:
            known = ", ".join(repr(m) for m in tree.nodes if m)[:300]
            raise NotAChainError(f"checkpoint {name!r} is not a module that ran; modules: {known}")
        if tree.nodes[name].calls != 1:
            raise NotAChainError(f"checkpoint {runs_per_step(tree, name)}; a checkpoint must run once")
    ordered = sorted(dict.fromkeys(names), key=lambda n: tree.nodes[n].order)
    for outer in ordered:
        inner = [n for n in ordered if n.startswith(f"{outer}.")]
        if inner:
            raise NotAChainError(f"checkpoint {inner[0]!r} lies inside checkpoint {outer!r}; name blocks at one level")
    for previous, name in zip(ordered, ordered[1:]):
        if not tree.nodes[name].inputs & tree.nodes[previous].outputs:
            raise NotAChainError(
                f"checkpoint {name!r} does not cut the graph after {previous!r}: it does not read {previous!r}'s "
                f"output{_what_it_reads(tree, name)}; name every block between two checkpoints, in the order they run")
    groups = tuple((name,) for name in ordered)
    outside = _read_outside(tree, groups)
    if outside is not None:
        raise NotAChainError(f"the checkpoints do not cut the graph: {outside}; name that module as a checkpoint too")
    parents = {n.rpartition(".")[0] for n in ordered}
    return Candidate(parents.pop() if len(parents) == 1 else "", groups)
