"""The chain finder ranks its candidates by what the planner reaches with the loss stage's chunked options.

On a Llama whose logits dominate the step (:mod:`tests.planner.large_vocab`), ranked as written it picked
the chain (model, ``lm_head``), whose loss stage is only the cross-entropy and offers no chunked option;
with the options counted it picks the layers, whose loss stage (norm, head, cross-entropy) can be chunked,
and the planner's minimum budget drops. Oracle: the minimum feasible budgets of the two chains, each solved
by ``selective`` (the solver that takes the loss's options).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from memprof import load_trace
from planner import chain_from_trace, min_feasible_budget, store_all_budget
from planner.discovery.chain_ranking import TIE
from planner.model.chain import Chain
from planner.solvers.loss_choice import has_loss_options
from tests.planner.large_vocab import LAYER_NAMES, profile_large_vocab_llama


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return profile_large_vocab_llama(tmp_path_factory.mktemp("large_vocab"))


def _modules(chain: Chain) -> list[str]:
    return [module for stage in chain.stages[:-1] for module in stage.modules]


def test_the_finder_picks_the_layers_whose_loss_can_be_chunked(run_dir: Path) -> None:
    trace = load_trace(run_dir)
    chain = chain_from_trace(trace)
    assert set(LAYER_NAMES) <= set(_modules(chain)) and "lm_head" not in _modules(chain), _modules(chain)
    assert has_loss_options(chain) and "chunked options counted" in chain.source["why"]
    # ranked as written (no loss options), the finder keeps the head as a stage of its own
    written = chain_from_trace(trace, loss_chunks=())
    assert "lm_head" in _modules(written) and not has_loss_options(written), _modules(written)
    # and what the planner reaches is the reason: a lower whole-step minimum on the layers
    assert min_feasible_budget(chain, "selective") < min_feasible_budget(written, "selective")


def test_naming_the_layers_is_no_longer_needed(run_dir: Path) -> None:
    """Benchmark 10 named the layers (``checkpoints=``) to get their chain: the finder's saves as much, to within
    the ranking's tie (here 32 KiB, one of the norm's outputs, on a 32 MiB saving)."""
    trace = load_trace(run_dir)
    found, named = chain_from_trace(trace), chain_from_trace(trace, checkpoints=list(LAYER_NAMES))
    assert has_loss_options(named)
    lowest = min_feasible_budget(named, "selective")
    assert min_feasible_budget(found, "selective") <= lowest + TIE * (store_all_budget(named) - lowest)
