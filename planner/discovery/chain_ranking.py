"""Ranking the candidate chains of a profiled model: the one whose step can save the most memory is kept.

A candidate's saving is store-all's budget minus the lowest budget the planner reaches on it: rotor's on its
stages as profiled and, when its loss stage offers the language-model head and its cross-entropy in chunks
(:mod:`planner.discovery.loss_options`), the lowest over those options (:mod:`planner.solvers.loss_choice`),
which is what ``selective`` reaches before any block option. Ranked without the loss's options, a model whose
logits outweigh its blocks (a 128k vocabulary on small layers) would get the chain (model, ``lm_head``): its
head is a stage of its own, its loss stage only the cross-entropy, and no chunked option applies there, so its
minimum keeps the whole logits however the blocks are checkpointed.
"""

from __future__ import annotations

from planner.model.chain import Chain
from planner.solvers import loss_choice
from planner.solvers.dispatch import min_feasible_budget, store_all_budget

RANKING_SLOTS = 100
"""Memory slots of the ranking's dynamic programs: a coarse grid is enough to rank candidates; the chosen chain
is solved finely later."""

TIE = 0.01
"""Savings within this fraction of the largest are equal for the ranking (:func:`best`)."""


def minimum_bytes(chain: Chain) -> int:
    """The lowest budget the planner reaches on ``chain``: rotor's, its loss stage with its best option."""
    return loss_choice.min_budget_bytes(chain, lambda fixed: min_feasible_budget(fixed, "rotor", slots=RANKING_SLOTS))


def saving_bytes(chain: Chain) -> int:
    """How much memory checkpointing can save on ``chain``: store-all's budget minus :func:`minimum_bytes`."""
    return store_all_budget(chain) - minimum_bytes(chain)


def savings(chains: list[Chain]) -> list[int]:
    """What each chain can save, against one store-all peak when every chain has the step around it.

    Every candidate describes the same profiled step, so store-all's peak is one number; the candidates'
    predictions of it differ only by their models' errors (coarse stages overestimate it), which must not
    decide the ranking: against the highest, the chain that saves the most is the one whose minimum is lowest.
    """
    if not all(chain.step is not None for chain in chains):
        return [saving_bytes(chain) for chain in chains]
    reference = max(store_all_budget(chain) for chain in chains)
    return [reference - minimum_bytes(chain) for chain in chains]


def best(chains: list[Chain]) -> tuple[int, str]:
    """The index of the chain that saves the most, and why, in words.

    Savings within :data:`TIE` of the largest count as equal: the difference is then the cost model's noise,
    or the step's floor binds every candidate (a chunked loss on a model whose logits dominate brings chains
    inside one block to the same minimum as the chain of blocks). Among them the longest chain wins, then the
    one whose stages hold the most activations (what the planner can trade above the minimum), then the first.
    """
    saved = savings(chains)
    top = max(saved)
    ranked = [(saving >= top - TIE * abs(top), chain.length, sum(stage.saved_bytes for stage in chain.stages[:-1]),
               -index) for index, (chain, saving) in enumerate(zip(chains, saved))]
    chosen = max(range(len(chains)), key=lambda i: ranked[i])
    chunked = " (its loss stage's chunked options counted)" if loss_choice.has_loss_options(chains[chosen]) else ""
    others = [saving for index, saving in enumerate(saved) if index != chosen]
    if not others:
        return chosen, f"saves up to {saved[chosen]} bytes of the step{chunked}, the only chain found"
    return chosen, (f"saves up to {saved[chosen]} bytes of the step{chunked}, the most of {len(chains)} chains "
                    f"found to within {TIE:.0%} (the others: up to {max(others)} bytes)")
