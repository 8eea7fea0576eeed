"""The executor: runs a schedule inside a model's own ``forward`` and ``loss.backward()``.

:mod:`~planner.executor.apply` validates a schedule (through the simulator) and finds its stages in the
model; the runtime it installs is pure torch and is embedded verbatim by the standalone export:
:mod:`~planner.executor.block_io` (a block's arguments and results), :mod:`~planner.executor.stage` (how one
stage's modules are called), :mod:`~planner.executor.offload` and :mod:`~planner.executor.transfers` (saved
tensors to host memory and back), :mod:`~planner.executor.selective` (options as selective checkpoints),
:mod:`~planner.executor.partial` and :mod:`~planner.executor.partial_tape` (partial options: a recorded forward
replayed only where its dropped saved tensors need it),
:mod:`~planner.executor.program` (the schedule split into forward, recompute and backward segments),
:mod:`~planner.executor.grads` (gradients handed between stages), :mod:`~planner.executor.runtime` (running
them), :mod:`~planner.executor.weights` (streamed weights) and :mod:`~planner.executor.install` (the wrappers
put in place of each stage's first module's ``forward``); :mod:`~planner.executor.chunked_loss` and
:mod:`~planner.executor.chunked_head` compute a language-model head and its cross-entropy in chunks (the loss
stage's options); :mod:`~planner.executor.model_check` compares a model with the one a schedule was planned for
(the chain's signature) and watches the stage-1 input's size.
"""

from planner.executor.apply import (
    CheckpointedSequential,
    apply_schedule,
    remove_schedule,
    stage_modules,
    validate_ops,
)
from planner.executor.chunked_head import install_chunked_head, remove_chunked_head
from planner.executor.chunked_loss import chunked_linear_cross_entropy

__all__ = ["CheckpointedSequential", "apply_schedule", "chunked_linear_cross_entropy", "install_chunked_head",
           "remove_chunked_head", "remove_schedule", "stage_modules", "validate_ops"]
