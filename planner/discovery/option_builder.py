"""A stage's recomputation options, generated from the op records of a planning pass (selective recomputation).

No list per model type: the options come from what the ops of the stage's forward cost and keep.

* The candidates are the ops that allocate (``output_bytes > 0``) and whose output some op of the stage
  needs for backward (``OpRecord.needs``) or that have FLOPs (keeping a matmul's output spares its
  recomputation even when no backward reads it); the op producing the stage's output (the last one that
  allocates) is not one: its output, a^l, is always kept; nor is an output an op of the stage later writes
  in place, nor a random op's (see :func:`_cacheable`).
* Which options exist depends on the ops' bytes and FLOPs only, never on their recorded times: a planning
  pass times each op once, and on a busy machine those times move by several times, so two passes over
  the same model would otherwise offer different options (and different schedules at the same budget).
  The candidates are ranked by the FLOPs recomputing them costs per byte kept (by op count when no op of
  the stage has FLOPs; position breaks ties): :func:`menu_weights`.
* The options: ``"compute"`` keeps the output of every candidate with FLOPs (matmuls, convolutions,
  attention: the 'speed' strategy of selective activation checkpointing); the ranking's prefixes up to
  :data:`BYTE_CUTS` of the candidates' bytes, and the shortest prefixes that spare :data:`TIME_CUTS` of
  the forward's recomputation (in FLOPs), named by the ops they keep; ``"none"`` keeps only a^l and
  recomputes the whole forward. Keeping a prefix of the ranking is the cheapest way to keep that many
  bytes (the recomputation replays every op it does not keep, in order), so the options lie on the block's
  memory/FLOPs front; cutting by bytes places them where most bytes are (cheap elementwise outputs), by
  FLOPs where a few expensive outputs spare most of the recomputation (a transformer block keeping its
  last matmul's output alone spares a quarter of it for a tenth of the bytes).
* Option ``o`` keeps a-bar_o = a^l + the kept candidates' bytes, within [a^l, a-bar^l], and ``B(l)``
  recomputes every op it did not keep: the stage's ``forward_ms`` times their share of the op times (of
  the FLOPs when no op has a time, of the op count when neither is known), so ``"none"`` recomputes
  exactly ``forward_ms`` even when the op times and the module's time disagree; plus, on every op of the
  stage, what running it under a selective checkpoint costs (``overhead_ms_per_op``: its dispatch mode
  calls the policy on each op of the forward and of the recomputation and caches what it keeps), measured
  by the planning pass on the model's device. With
  ``recompute_cost="flops"`` the share is of the FLOPs (as torch.compile's min-cut partitioner counts
  by default: elementwise ops are free to recompute), for devices where the recorded op times, each
  with a dispatch mode's overhead, misjudge what a recomputation costs.
* Options that keep no less memory and replay no fewer FLOPs (ops, without FLOPs) than another (keeping
  everything included) are dropped; the rest are listed from the most memory to the least. The times then
  only price the options: the DP picks the fastest of those that fit.
* Partial options (``StageOption.partial``), when every record of the stage says what it reads
  (``OpRecord.reads``; older traces keep the behaviour above exactly): ``B(l)`` then replays only the cone
  (:mod:`planner.discovery.cone`), the ops needed to rebuild the dropped saved tensors, so an option's
  recomputation is the cone's share of the op weights and FLOPs; the ranking is a greedy on what keeping each
  output spares of the cone's FLOPs per byte (:mod:`planner.discovery.cone_ranking`), cut as above (the FLOPs
  cuts as fractions of what ``"none"`` replays); random ops' outputs may be kept (the replay restores the RNG state
  before each random op it runs, so keeping one shifts no other draw); the stage's output is held anyway
  and never replayed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from memprof.analysis.op_records import OpRecord
from planner.discovery.cone import cone, has_reads, stage_graph
from planner.discovery.cone_ranking import greedy_ranking
from planner.discovery.replay_peak import replay_overhead_bytes
from planner.errors import ChainError
from planner.model.chain import Chain, Stage
from planner.model.stage_option import StageOption

RECOMPUTE_COSTS = ("time", "flops")
"""What an option's recomputation is weighed by: the ops' recorded times, or their FLOPs."""

BYTE_CUTS = (0.25, 0.5, 0.75)
"""Fractions of the candidates' bytes at which the ranking is cut into options."""

TIME_CUTS = (0.25, 0.5, 0.75, 0.9)
"""Fractions of the forward's recomputation (its FLOPs: :func:`menu_weights`) that the kept ops of an option
spare, at least."""


def ops_of_stage(records: Sequence[OpRecord], stage: Stage) -> tuple[OpRecord, ...]:
    """The records run by ``stage``'s modules or their submodules, in forward order."""
    prefixes = tuple(f"{m}." for m in stage.modules)
    return tuple(r for r in sorted(records, key=lambda r: r.index)
                 if r.module in stage.modules or r.module.startswith(prefixes))


def stage_options(ops: Sequence[OpRecord], stage: Stage, recompute_cost: str = "time",
                  overhead_ms_per_op: float = 0.0) -> tuple[StageOption, ...]:
    """The recomputation options of ``stage`` from the records of its forward.

    Args:
        ops: the stage's op records, in forward order (global indexes: ``needs`` are matched by
            ``OpRecord.index``, and needs of ops outside ``ops`` are ignored: the stage's input is kept
            anyway). ``StageOption.saves`` are positions in ``ops`` (0-based).
        stage: the stage's costs (a^l, a-bar^l, ``forward_ms``).
        recompute_cost: ``"time"`` (the ops' recorded times) or ``"flops"`` (their FLOPs): what decides
            an option's share of ``forward_ms``. Which options there are does not depend on it.
        overhead_ms_per_op: what a selective checkpoint adds to each op's forward + recomputation, added to
            every option's ``recompute_ms`` for each op of the stage (``selective_overhead_us_per_op`` of
            the run's ``meta.json``, in ms).

    Returns:
        The options besides keeping everything, from the most memory kept to the least; empty when the
        stage has no op.
    """
    if recompute_cost not in RECOMPUTE_COSTS:
        raise ChainError(f"recompute_cost must be one of {RECOMPUTE_COSTS}, found {recompute_cost!r}")
    if not overhead_ms_per_op >= 0.0 or overhead_ms_per_op == float("inf"):
        raise ChainError(f"the selective overhead per op must be a non-negative number of ms, found {overhead_ms_per_op!r}")
    ops = tuple(ops)
    if not ops:
        return ()
    position = {record.index: i for i, record in enumerate(ops)}
    needed = {position[j] for record in ops for j in record.needs if j in position}
    allocating = [i for i, record in enumerate(ops) if record.output_bytes > 0]
    output_op = allocating[-1] if allocating else None
    # A kept op is not recomputed, so keeping a matmul whose output no backward reads still saves its time.
    wanted = needed | {i for i, record in enumerate(ops) if record.flops > 0}
    partial = has_reads(ops)
    candidates = [i for i in sorted(wanted) if ops[i].output_bytes > 0 and i != output_op
                  and _cacheable(ops, i, partial=partial)]
    menu = menu_weights(ops)  # which options there are: bytes and FLOPs, never the recorded times
    if partial:
        graph = stage_graph(ops)
        held = frozenset(() if output_op is None else (output_op,))
        ranked, spared, total = greedy_ranking(graph, candidates, {i: ops[i].output_bytes for i in candidates},
                                               menu, held)

        def replayed(kept: frozenset[int]) -> frozenset[int]:
            return cone(graph, kept | held)

        def regrowth(kept: frozenset[int]) -> int | None:
            return replay_overhead_bytes(graph, [r.output_bytes for r in ops], kept | held, stage.saved_bytes)
    else:
        ranked = sorted(candidates, key=lambda i: (-menu[i] / ops[i].output_bytes, i))
        spared, total = [menu[i] for i in ranked], sum(menu)

        def replayed(kept: frozenset[int]) -> frozenset[int]:  # every op it does not keep, in order
            return frozenset(i for i in range(len(ops)) if i not in kept)

        def regrowth(kept: frozenset[int]) -> int | None:  # the whole forward reruns: the stage's o_f
            return None
    kept_sets: list[tuple[str, frozenset[int]]] = [("compute", frozenset(i for i in candidates if ops[i].flops > 0))]
    for chosen in _prefixes(ranked, [ops[i].output_bytes for i in ranked], spared, total):
        kept_sets.append((_name(ops, chosen), frozenset(chosen)))
    kept_sets.append(("none", frozenset()))
    prices = _weights(ops, recompute_cost)
    made: dict[frozenset[int], tuple[StageOption, float]] = {}
    for name, kept in kept_sets:
        if name and kept not in made:  # one option per kept set, under its first name ("compute")
            replay = replayed(kept)
            option = _option(ops, stage, name, kept, prices, overhead_ms_per_op * len(ops), replay, partial)
            made[kept] = (replace(option, recompute_overhead_bytes=regrowth(kept)), sum(menu[i] for i in replay))
    return _undominated(list(made.values()), stage)


def _prefixes(ranked: Sequence[int], sizes: Sequence[int], weights: Sequence[float],
              total_weight: float) -> list[list[int]]:
    """The prefixes of ``ranked`` cut at :data:`BYTE_CUTS` of its bytes (the longest within each, at least
    one op) and at :data:`TIME_CUTS` of ``total_weight`` (the shortest sparing at least that much; ``weights``:
    what each ranked op spares when kept after those before it)."""
    cuts: list[list[int]] = []
    total_bytes = sum(sizes)
    for cut in BYTE_CUTS:
        size, end = 0, 0
        while end < len(ranked) and (end == 0 or size + sizes[end] <= cut * total_bytes):
            size += sizes[end]
            end += 1
        cuts.append(list(ranked[:end]))
    for cut in TIME_CUTS:
        spared, end = 0.0, 0
        while end < len(ranked) and spared < cut * total_weight:
            spared += weights[end]
            end += 1
        if spared >= cut * total_weight:
            cuts.append(list(ranked[:end]))
    return cuts


def _short(record: OpRecord) -> str:
    return record.op.split(".")[1] if record.op.count(".") >= 2 else record.op


RANDOM_OPS = ("bernoulli", "native_dropout", "dropout", "fused_dropout", "rand", "randn", "randint", "randperm",
              "normal", "uniform", "exponential", "geometric", "cauchy", "log_normal", "multinomial", "poisson",
              "rrelu")
"""Short names (``aten.<name>.<overload>``, trailing ``_`` and leading ``_`` ignored) of ops that draw random
numbers. A selective option always recomputes them: the recomputation replays the stage's random numbers from
its saved RNG state in the forward's order, so skipping one draw would shift every later one. A partial option
may keep them (its replay restores the RNG state before each random op)."""


def _cacheable(ops: Sequence[OpRecord], i: int, partial: bool = False) -> bool:
    """Whether op ``i``'s output may be kept and handed back in the recomputation.

    A kept output is the forward's tensor itself; if an op of the stage then writes into it (dropout's
    ``empty_like`` filled by ``bernoulli_``, a convolution's output by ``relu_``), the recomputation would
    apply that write a second time, so it is never kept. Records that do not say what an in-place op writes
    (traces from before ``OpRecord.writes``) fall back to refusing an output followed at once by an in-place
    op or made uninitialised to be filled (``empty*``). Random ops are kept only by ``partial`` options
    (:data:`RANDOM_OPS`), which keep no output of an op that writes in place (their replay skips a kept op,
    and would skip its write with it).
    """
    short = _short(ops[i])
    if (short.strip("_") in RANDOM_OPS and not partial) or short.startswith(("empty", "new_empty")):
        return False
    index = ops[i].index
    if partial and ops[i].writes:
        return False
    if all(r.writes is not None for r in ops):
        return not any(index in (r.writes or ()) for r in ops[i + 1:])
    return i + 1 >= len(ops) or not _short(ops[i + 1]).endswith("_")


def _name(ops: Sequence[OpRecord], kept: Sequence[int]) -> str:
    """``"keep addmm*2,bmm"``: the short op names kept, in forward order ("" when nothing is kept)."""
    counts: dict[str, int] = {}
    for i in sorted(kept):
        short = _short(ops[i])
        counts[short] = counts.get(short, 0) + 1
    return "keep " + ",".join(n if c == 1 else f"{n}*{c}" for n, c in counts.items()) if counts else ""


def menu_weights(ops: Sequence[OpRecord]) -> list[float]:
    """What each op's recomputation weighs when the options are chosen: its FLOPs, or 1 per op when no op of
    the stage has FLOPs. Deterministic (the same model gives the same options however loaded the machine
    that recorded it was); :func:`_weights` prices the options chosen."""
    return _weights(ops, "flops")


def _weights(ops: Sequence[OpRecord], recompute_cost: str) -> list[float]:
    """What each op's recomputation weighs: its time (or FLOPs, by ``recompute_cost``), else its FLOPs, else 1."""
    if recompute_cost == "time" and any(r.forward_ms > 0 for r in ops):
        return [r.forward_ms for r in ops]
    if any(r.flops > 0 for r in ops):
        return [float(r.flops) for r in ops]
    return [1.0] * len(ops)


def _option(ops: Sequence[OpRecord], stage: Stage, name: str, kept: frozenset[int], weights: Sequence[float],
            overhead_ms: float, replayed: frozenset[int], partial: bool) -> StageOption:
    """The option keeping ``kept``, whose ``B(l)`` replays the ops ``replayed``."""
    share = sum(weights[i] for i in replayed) / sum(weights)
    saved = stage.output_bytes + sum(ops[i].output_bytes for i in kept)
    saves = tuple(sorted(kept))
    return StageOption(name=name, saved_bytes=min(max(saved, stage.output_bytes), stage.saved_bytes),
                       recompute_ms=stage.forward_ms * share + overhead_ms,
                       recompute_flops=sum(ops[i].flops for i in replayed), saves=saves,
                       save_ops=tuple(ops[i].op for i in saves),
                       save_occurrences=tuple(sum(1 for r in ops[:i] if r.op == ops[i].op) for i in saves),
                       partial=partial)


def _undominated(options: Sequence[tuple[StageOption, float]], stage: Stage) -> tuple[StageOption, ...]:
    """The options no other one (keeping everything included) beats or equals in both memory and what it
    replays (each option with the :func:`menu_weights` of its replay: not its time, so that which options
    survive does not depend on the recorded times)."""
    kept: list[tuple[StageOption, float]] = []
    points = [(stage.saved_bytes, 0.0)]
    for option, replay in sorted(options, key=lambda o: (o[1], o[0].saved_bytes)):
        if any(saved <= option.saved_bytes and weight <= replay for saved, weight in points):
            continue
        kept.append((option, replay))
        points.append((option.saved_bytes, replay))
    return tuple(option for option, _ in sorted(kept, key=lambda o: (-o[0].saved_bytes, o[1])))


def with_options(chain: Chain, ops_by_stage: Mapping[int, Sequence[OpRecord]], recompute_cost: str = "time",
                 overhead_ms_per_op: float = 0.0) -> Chain:
    """``chain`` with the options :func:`stage_options` makes for each stage of ``ops_by_stage``.

    Args:
        chain: the chain.
        ops_by_stage: stage number (1..L+1) to the records of its forward (:func:`ops_of_stage` finds them
            by module); stages not named keep the options they have.
        recompute_cost: what weighs a recomputation (:func:`stage_options`).
        overhead_ms_per_op: what a selective checkpoint adds per op (:func:`stage_options`).

    Raises:
        ChainError: a stage number outside the chain.
    """
    stages = list(chain.stages)
    for number, ops in ops_by_stage.items():
        if not 1 <= number <= len(stages):
            raise ChainError(f"op records for stage {number}, but the chain has stages 1..{len(stages)}")
        options = stage_options(ops, stages[number - 1], recompute_cost, overhead_ms_per_op)
        stages[number - 1] = replace(stages[number - 1], options=options)
    return replace(chain, stages=tuple(stages))
