"""Random chains for the planner's property tests (hypothesis strategies and a seeded generator)."""

from __future__ import annotations

import math
import random
from dataclasses import replace
from pathlib import Path

from hypothesis import strategies as st

from planner.model.chain import Chain, Stage
from planner.model.stage_option import StageOption
from planner.model.transfer import TransferCosts
from planner.solvers.discretize import DiscreteChain, discretize
from planner.solvers.store_all import store_all_peak_bytes

TOY_CHAIN = Path(__file__).with_name("toy_chain.json")
MIB = 2**20


@st.composite
def small_chains(draw: st.DrawFn, max_length: int = 5, max_size: int = 6) -> Chain:
    """Chains of 1..max_length stages with small integer sizes and times (solved exactly: 1-byte slots)."""
    length = draw(st.integers(1, max_length))
    stages = []
    for index in range(length + 1):
        output = draw(st.integers(0, max_size))
        stages.append(Stage(
            forward_ms=float(draw(st.integers(0, 5))),
            backward_ms=float(draw(st.integers(0, 5))),
            output_bytes=output,
            saved_bytes=output + draw(st.integers(0, 3)),
            grad_bytes=draw(st.sampled_from([output, draw(st.integers(0, max_size))])),
            forward_overhead_bytes=draw(st.integers(0, 3)),
            backward_overhead_bytes=draw(st.integers(0, 4)),
            name=f"s{index + 1}",
            weight_grad_bytes=draw(st.sampled_from([0, 0, draw(st.integers(1, 4))])),
        ))
    return Chain("random", draw(st.integers(0, max_size)), tuple(stages))


def random_chain(seed: int, length: int, unit_bytes: int = MIB) -> Chain:
    """A reproducible chain of ``length`` stages with sizes in whole ``unit_bytes`` and times in ms."""
    rng = random.Random(seed)
    stages = []
    for _ in range(length + 1):
        output = rng.randint(1, 50) * unit_bytes
        stages.append(Stage(
            forward_ms=rng.uniform(1, 10),
            backward_ms=rng.uniform(2, 20),
            output_bytes=output,
            saved_bytes=output + rng.randint(0, 30) * unit_bytes,
            grad_bytes=output,
            forward_overhead_bytes=rng.randint(0, 20) * unit_bytes,
            backward_overhead_bytes=rng.randint(0, 60) * unit_bytes,
        ))
    return Chain(f"random{seed}", rng.randint(1, 50) * unit_bytes, tuple(stages))


def exact_grid(chain: Chain) -> DiscreteChain:
    """1-byte slots up to store-all's peak: the DPs are exact on it."""
    peak = store_all_peak_bytes(chain)
    return discretize(chain, max(peak, 1), reference_bytes=max(peak, 1))


def toy_chain() -> Chain:
    """The ROTOR paper's toy example (Table 2), sizes in MiB."""
    return Chain.from_json(TOY_CHAIN)


@st.composite
def transfer_costs(draw: st.DrawFn, max_cap: int = 12) -> TransferCosts:
    """Bandwidths (bytes per ms) from none to instantaneous, and no host cap or a small one."""
    rates = st.sampled_from([0.5, 1.0, 2.0, 4.0, math.inf])
    cap = draw(st.one_of(st.none(), st.integers(0, max_cap)))
    return TransferCosts(draw(rates), draw(rates), cap)


@st.composite
def offload_chains(draw: st.DrawFn, max_length: int = 4) -> Chain:
    """:func:`small_chains` with :func:`transfer_costs` (a-bar above a more often, so offloads matter)."""
    chain = draw(small_chains(max_length=max_length))
    stages = tuple(replace(s, saved_bytes=s.saved_bytes + draw(st.integers(0, 4))) for s in chain.stages)
    return replace(chain, stages=stages, transfer=draw(transfer_costs()))


@st.composite
def option_chains(draw: st.DrawFn, max_length: int = 5, max_size: int = 6, max_options: int = 3) -> Chain:
    """:func:`small_chains` whose stages offer 0..max_options recomputation options.

    Each option keeps between a and a-bar and recomputes at most the stage's forward time (recomputing part
    of a forward cannot take longer than the forward); its recomputation holds o_f above a-bar (a whole
    forward rerun) or an overhead of its own (a partial replay's), up to a-bar.
    """
    chain = draw(small_chains(max_length=max_length, max_size=max_size))
    stages = []
    for stage in chain.stages:
        options = tuple(
            StageOption(name=f"o{k + 1}", saved_bytes=draw(st.integers(stage.output_bytes, stage.saved_bytes)),
                        recompute_ms=float(draw(st.integers(0, int(stage.forward_ms)))),
                        recompute_overhead_bytes=draw(st.none() | st.integers(0, stage.saved_bytes)))
            for k in range(draw(st.integers(0, max_options)))
        )
        stages.append(replace(stage, options=options))
    return replace(chain, stages=tuple(stages))


def random_option_chain(seed: int, length: int, options: int, unit_bytes: int = MIB) -> Chain:
    """:func:`random_chain` with ``options`` recomputation options per stage (kept bytes and times at random)."""
    chain = random_chain(seed, length, unit_bytes)
    rng = random.Random(seed + 1)
    stages = []
    for stage in chain.stages:
        kept = sorted(rng.randint(stage.output_bytes, stage.saved_bytes) for _ in range(options))
        made = tuple(StageOption(name=f"o{k + 1}", saved_bytes=size, recompute_ms=stage.forward_ms * (1 - k / options)
                                 * rng.uniform(0.5, 1.0)) for k, size in enumerate(kept))
        stages.append(replace(stage, options=made))
    return replace(chain, stages=tuple(stages))
