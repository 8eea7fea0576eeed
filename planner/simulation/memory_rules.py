"""The operations' memory rules: what each operation of a schedule does to device and host memory.

This is the one copy of the rules (:class:`Memory`); :mod:`planner.simulation.simulator` replays schedules with it,
:mod:`planner.simulation.replay` and :mod:`planner.simulation.streams` time them, and the exhaustive search moves with it
(:func:`planner.simulation.simulator.step`).

The rules are Table 1 and Definitions 3.3-3.4 of the ROTOR paper (Beaumont et al., ACM TOMS 2024):

* The start state holds ``a^0`` (the input) and ``delta^{L+1}`` (the gradient of the loss, the seed of the
  backward pass); the sequence must end by computing ``delta^0``.
* ``F_all(l)`` needs ``a^{l-1}`` (held on its own or inside ``a-bar^{l-1}``), keeps it and adds ``a-bar^l``
  (which contains ``a^l``). ``F_ck(l)`` keeps ``a^{l-1}`` and adds ``a^l``. ``F_none(l)`` adds ``a^l`` and
  drops ``a^{l-1}`` -- unless ``a^{l-1}`` is only held inside ``a-bar^{l-1}``, which a forward cannot free,
  or ``a-bar^l`` is held: the graph recorded by ``F_all(l)`` references its input, which ``B(l)`` needs,
  so in PyTorch dropping the input's handle frees nothing until ``B(l)``. (Read literally, Table 1 would
  let ``F_all(l) F_none(l)`` delete ``a^{l-1}`` and keep ``a-bar^l``; no DP uses that, and no executor
  could realise the memory it promises.)
* ``B(l)`` needs ``delta^l``, ``a-bar^l`` and ``a^{l-1}``; it frees ``delta^l`` and ``a-bar^l``, frees
  ``a^{l-1}`` when that is held on its own (first line of Table 1) and keeps ``a-bar^{l-1}`` when it is
  held instead (second line), and adds ``delta^{l-1}``.
* ``B(l)`` also allocates the stage's parameter gradients (``weight_grad_bytes``), which stay allocated
  to the end of the sequence (the optimizer step uses them).
* The memory during an operation is everything held before it, plus its output, plus its overhead
  (``o_f`` for a forward, ``o_b`` for a backward). The peak is the largest such value.
* A forward whose output is already held recomputes it (its memory counts the new copy) and keeps one;
  ``F_all(l)`` over a held ``a^l`` replaces it by ``a-bar^l``. Nothing may follow ``B(1)``.
* ``F_all(l)`` with recomputation option ``k > 0`` (:mod:`planner.model.stage_option`) follows the same rules
  holding a-bar_k^l instead of a-bar^l (a re-recording replaces the one held). ``B(l)`` after it first
  recomputes what the option dropped (``recompute_ms`` more time), bringing the stage back to a-bar^l:
  the memory during it is the larger of the recomputation (held + a-bar^l - a-bar_k^l + the option's
  recomputation overhead: ``o_f``, or a partial replay's own peak above a-bar^l when that is more) and the
  backward (held + a-bar^l - a-bar_k^l + its output + ``o_b``); afterwards it frees as from a-bar^l.
* A chunked-loss option of the loss stage (``chunks > 0``, :mod:`planner.discovery.loss_options`) holds
  a-bar_k (no logits) and has its own ``o_f`` and ``o_b`` (one chunk's logits and softmax); ``B`` after it
  regrows nothing: the memory during it is held + its output + the option's ``o_b``. An ``eager`` one
  computed its gradients in the forward and holds them in a-bar_k: ``B`` hands them over (held + ``o_b``).

Only what the paper's memory M counts is counted: the input, activations, their gradients, the
overheads and the parameter gradients the backward creates; weights, the optimizer's state and the rest of
the training step are :class:`planner.model.step.StepCosts`.

Tensor streaming adds two operations on a stage whose a-bar is held (:class:`~planner.model.schedule.OpKind`):

* ``OFFLOAD(l)`` copies a-bar^l - a^l (what ``F_all(l)`` recorded besides its output, which stays: it is
  the next stage's input) to host memory; the host holds it from then on, the device until the copy is
  retired. Not for the loss; not twice; the host total must stay within the chain's host cap.
* ``PREFETCH(l)`` copies it back: device memory is allocated when it is issued, the host's is returned
  when it is retired. ``B(l)`` needs it back; ``F_all(l)`` cannot record a stage that is offloaded.

When copies run and are retired, and what the makespan is then, is :mod:`planner.simulation.streams`: the compute
stream waits for a copy only where one must be retired.

Tensors carried across stages add their own rule (:mod:`planner.simulation.carried_memory`), which
:func:`planner.simulation.simulator.simulate` applies to the replay.
"""

from __future__ import annotations

from planner.model.chain import Chain
from planner.model.schedule import Op, OpKind
from planner.simulation.memory_state import MemoryState, StepError

__all__ = ["ARRIVING", "HOSTED", "LEAVING", "Memory"]

LEAVING, HOSTED, ARRIVING = "leaving", "hosted", "arriving"  # where an offloaded a-bar^l is


class Memory:
    """The memory during a replay, mutated in place (O(1) per operation); the one copy of Table 1's rules.

    ``live`` is device memory; ``host`` the host memory offloaded activations hold; ``away`` maps each
    offloaded stage to where its a-bar is (:data:`LEAVING`, :data:`HOSTED`, :data:`ARRIVING`).
    """

    __slots__ = ("chain", "plain", "saved", "delta", "live", "named", "host", "away", "options", "reserved")

    def __init__(self, chain: Chain, plain: set[int], saved: set[int], delta: int, live: int, named: bool = True,
                 options: dict[int, int] | None = None) -> None:
        self.chain, self.plain, self.saved, self.delta, self.live = chain, plain, saved, delta, live
        self.options = options if options is not None else {}  # stage -> option k > 0 of its held a-bar
        self.named = named  # False: skip naming what each operation adds and frees (faster)
        self.host = 0
        self.reserved = 0  # host memory streamed weights hold, counted against the host cap too
        self.away: dict[int, str] = {}

    @classmethod
    def start(cls, chain: Chain, named: bool = True) -> Memory:
        top = chain.length + 1
        return cls(chain, {0}, set(), top, chain.a(0) + chain.delta(top), named)

    def freeze(self) -> MemoryState:
        return MemoryState(frozenset(self.plain), frozenset(self.saved), self.delta, self.live,
                           frozenset(self.options.items()))

    def apply(self, op: Op) -> tuple[int, tuple[str, ...], tuple[str, ...]]:
        """Runs ``op``; returns the memory during it and the names of the values it added and freed.

        Raises:
            StepError: an input is missing (nothing is changed then).
        """
        top = self.chain.length + 1
        if op.stage > top:
            raise StepError(f"stage {op.stage} does not exist; the chain has stages 1..{top}")
        if self.delta == 0:
            raise StepError("delta^0 is already computed; no operation may follow")
        if op.kind.is_transfer:
            raise StepError("a transfer's effect depends on its copy stream; replay it with simulate()")
        if op.stage in self.away:
            where = "in host memory" if self.away[op.stage] != ARRIVING else "coming back"
            if op.kind is OpKind.B:
                raise StepError(f"needs a-bar^{op.stage} in device memory (it is {where}; PREFETCH({op.stage}) "
                                f"must come before B({op.stage}))")
            if op.kind is OpKind.F_ALL:
                raise StepError(f"a-bar^{op.stage} is offloaded; F_all({op.stage}) cannot record it again before "
                                f"B({op.stage})")
        if op.kind is OpKind.B:
            return self._backward(op.stage)
        return self._forward(op.kind, op.stage, op.option)

    def offload(self, stage: int) -> None:
        """``OFFLOAD(stage)`` is issued: the host takes a-bar - a; the device keeps it until retired."""
        top = self.chain.length + 1
        if stage >= top:
            raise StepError(f"the loss (stage {top}) cannot be offloaded: the executor does not run it")
        if stage not in self.saved:
            raise StepError(f"needs a-bar^{stage} in device memory (only what F_all({stage}) recorded is offloaded)")
        if stage in self.away:
            raise StepError(f"a-bar^{stage} is already offloaded")
        if stage in self.options:
            raise StepError(f"a-bar^{stage} was recorded with option {self.options[stage]}; only a full recording "
                            f"(option 0) can be offloaded")
        size = self.chain.offload_bytes(stage)
        cap = self.chain.transfer_costs.host_cap_bytes
        if cap is not None and self.host + self.reserved + size > cap:
            raise StepError(f"host memory would hold {self.host + self.reserved + size} bytes, above the chain's "
                            f"host cap of {cap} bytes")
        self.host += size
        self.away[stage] = LEAVING

    def release(self, stage: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """The offload of ``stage`` is retired: the device frees a-bar - a (a^l stays)."""
        self.live -= self.chain.offload_bytes(stage)
        self.away[stage] = HOSTED
        return ((f"a^{stage}",), (f"abar^{stage}",)) if self.named else ((), ())

    def prefetch(self, stage: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """``PREFETCH(stage)`` is issued: the device allocates a-bar - a again."""
        if self.away.get(stage) != HOSTED:
            found = "not offloaded" if stage not in self.away else "already coming back"
            raise StepError(f"needs a-bar^{stage} in host memory (it is {found}; OFFLOAD({stage}) comes first)")
        self.live += self.chain.offload_bytes(stage)
        self.away[stage] = ARRIVING
        return ((f"abar^{stage}",), (f"a^{stage}",)) if self.named else ((), ())

    def arrive(self, stage: int) -> None:
        """The prefetch of ``stage`` is retired: the host returns its buffer."""
        self.host -= self.chain.offload_bytes(stage)
        del self.away[stage]

    def _has_a(self, index: int) -> bool:
        return index in self.plain or index in self.saved

    def _forward(self, kind: OpKind, stage: int, option: int = 0) -> tuple[int, tuple[str, ...], tuple[str, ...]]:
        if not self._has_a(stage - 1):
            raise StepError(f"needs a^{stage - 1} (not in memory)")
        spec = self.chain.stage(stage)
        if option > len(spec.options):
            raise StepError(f"stage {stage} has {len(spec.options)} recomputation options besides keeping "
                            f"everything; option {option} does not exist")
        added: tuple[str, ...] = ()
        freed: tuple[str, ...] = ()
        if kind is OpKind.F_ALL:
            kept = spec.saved_with(option)
            during = self.live + kept + spec.forward_overhead_with(option)
            if stage not in self.saved:
                self.saved.add(stage)
                self.live += kept
                added = (f"abar^{stage}",) if self.named else ()
            else:  # a new recording replaces the one held
                self.live += kept - spec.saved_with(self.options.pop(stage, 0))
            if option:
                self.options[stage] = option
            if stage in self.plain:  # a^l is part of a-bar^l now
                self.plain.remove(stage)
                self.live -= spec.output_bytes
                freed = (f"a^{stage}",) if self.named else ()
            return during, added, freed
        during = self.live + spec.output_bytes + spec.forward_overhead_bytes
        if stage not in self.plain and stage not in self.saved:
            self.plain.add(stage)
            self.live += spec.output_bytes
            added = (f"a^{stage}",) if self.named else ()
        if kind is OpKind.F_NONE and stage - 1 in self.plain and stage not in self.saved:
            self.plain.remove(stage - 1)
            self.live -= self.chain.a(stage - 1)
            freed = (f"a^{stage - 1}",) if self.named else ()
        return during, added, freed

    def _backward(self, stage: int) -> tuple[int, tuple[str, ...], tuple[str, ...]]:
        if self.delta != stage:
            raise StepError(f"needs delta^{stage} (the gradient in memory is delta^{self.delta})")
        if stage not in self.saved:
            hint = f"; a^{stage} is held but only F_all({stage}) keeps what B({stage}) needs" if stage in self.plain else ""
            raise StepError(f"needs a-bar^{stage} (not in memory{hint})")
        if not self._has_a(stage - 1):  # a guard: a-bar^l pins a^{l-1}, so this cannot happen
            raise StepError(f"needs a^{stage - 1} (not in memory)")
        spec = self.chain.stage(stage)
        option = self.options.pop(stage, 0)
        regrown = spec.regrown_with(option)  # what the recomputation brings back before the backward
        grad_out = self.chain.delta(stage - 1) + spec.weight_grad_bytes  # the parameter gradients stay
        handed = grad_out if option and spec.options[option - 1].eager else 0  # a-bar_k holds them already
        during = self.live + regrown + grad_out - handed + spec.backward_overhead_with(option)
        if option and not spec.options[option - 1].chunks:  # a selective option recomputes the forward first
            during = max(during, self.live + regrown + spec.recompute_overhead_with(option))
        self.live += grad_out - spec.saved_with(option) - spec.grad_bytes
        self.saved.remove(stage)
        self.delta = stage - 1
        kept_input = stage - 1 not in self.plain
        if not kept_input:
            self.plain.remove(stage - 1)
            self.live -= self.chain.a(stage - 1)
        if not self.named:
            return during, (), ()
        freed = (f"abar^{stage}", f"delta^{stage}") + (() if kept_input else (f"a^{stage - 1}",))
        return during, (f"delta^{stage - 1}",), freed
