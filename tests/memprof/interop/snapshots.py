"""Hand-built PyTorch memory snapshots with the documented structure (``torch.cuda.memory._snapshot()``).

:class:`Builder` plays a CUDA caching allocator: segments from ``cudaMalloc``, blocks carved from them
(rounded to 512 bytes, their requested size kept), and a trace entry for every action, with frames shaped
like the ones PyTorch records (innermost first; Python frames, and the autograd engine's C++ frames in
backward). :func:`training_snapshot` is two training steps of a two-layer model with Adam.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

TORCH = "/venv/lib/python3.11/site-packages/torch"
MODULE_PY = f"{TORCH}/nn/modules/module.py"
BLOCK_BYTES = 512


def frame(filename: str, line: int, name: str) -> dict[str, Any]:
    return {"filename": filename, "line": line, "name": name}


def train_frames(line: int = 40) -> list[dict[str, Any]]:
    """Code in the training loop itself (the batch copy, the loss)."""
    return [frame("/work/train.py", line, "train_step"), frame("/work/train.py", 90, "<module>")]


def weight_frames() -> list[dict[str, Any]]:
    """``model.cuda()``: parameters moved by ``Module._apply``."""
    return [frame(MODULE_PY, 1340, "convert"), frame(MODULE_PY, 900, "_apply"), frame(MODULE_PY, 1343, "to"),
            frame("/work/train.py", 12, "main")]


def module_call(callee_file: str, callee_line: int) -> list[dict[str, Any]]:
    """One module call's frames, innermost first: its forward, then torch's call wrappers."""
    return [frame(callee_file, callee_line, "forward"), frame(MODULE_PY, 1784, "_call_impl"),
            frame(MODULE_PY, 1773, "_wrapped_call_impl")]


def forward_frames(*calls: tuple[str, int, int]) -> list[dict[str, Any]]:
    """An allocation inside nested module calls ``(callee file, its line running, line of the call in the parent)``.

    The outermost call is the model (``model.py``), called from line 30 of ``train.py``.
    """
    chain = [("/work/model.py", 20, 30), *calls]
    frames: list[dict[str, Any]] = []
    for j in range(len(chain) - 1, -1, -1):
        filename, line, _ = chain[j]
        running = line if j == len(chain) - 1 else chain[j + 1][2]
        frames += [frame(filename, running, "forward"), frame(MODULE_PY, 1784, "_call_impl"),
                   frame(MODULE_PY, 1773, "_wrapped_call_impl")]
    return frames + [frame("/work/train.py", chain[0][2], "train_step"), frame("/work/train.py", 90, "<module>")]


def backward_frames() -> list[dict[str, Any]]:
    """An allocation in autograd's engine thread, as ``stacks="all"`` records it (C++ frames only)."""
    return [frame("??", 0, "c10::cuda::CUDACachingAllocator::malloc"),
            frame("??", 0, "torch::autograd::generated::AddmmBackward0::apply"),
            frame("??", 0, "torch::autograd::Engine::evaluate_function"),
            frame("??", 0, "torch::autograd::Engine::thread_main")]


def optimizer_frames() -> list[dict[str, Any]]:
    return [frame(f"{TORCH}/optim/adam.py", 160, "_init_group"), frame(f"{TORCH}/optim/adam.py", 230, "step"),
            frame(f"{TORCH}/optim/optimizer.py", 480, "wrapper"), frame("/work/train.py", 50, "train_step")]


def rounded(size: int) -> int:
    return max(BLOCK_BYTES, -(-size // BLOCK_BYTES) * BLOCK_BYTES)


@dataclass
class _Segment:
    address: int
    total_size: int
    next: int = 0
    blocks: dict[int, tuple[int, list]] = field(default_factory=dict)  # address -> (requested size, frames)


@dataclass
class Builder:
    """Records allocator actions into one device's trace and keeps the live state for ``segments``."""

    device: int = 0
    timed: bool = True
    trace: list[dict[str, Any]] = field(default_factory=list)
    segments: list[_Segment] = field(default_factory=list)
    time_us: int = 1_700_000_000_000_000
    _next_segment: int = 0x7F0000000000

    def _entry(self, action: str, addr: int, size: int, frames: list) -> None:
        self.time_us += 10
        entry = {"action": action, "addr": addr, "size": size, "stream": 0, "frames": frames}
        if self.timed:
            entry["time_us"] = self.time_us
        self.trace.append(entry)

    def segment_alloc(self, size: int) -> int:
        segment = _Segment(self._next_segment, size)
        self._next_segment += 1 << 30
        self.segments.append(segment)
        self._entry("segment_alloc", segment.address, size, [])
        return segment.address

    def segment_free(self, address: int) -> None:
        segment = next(s for s in self.segments if s.address == address)
        assert not segment.blocks, "free a segment's blocks first"
        self.segments.remove(segment)
        self._entry("segment_free", address, segment.total_size, [])

    def alloc(self, size: int, frames: list) -> int:
        for segment in self.segments:
            if segment.next + rounded(size) <= segment.total_size:
                addr = segment.address + segment.next
                segment.next += rounded(size)
                segment.blocks[addr] = (size, frames)
                self._entry("alloc", addr, size, frames)
                return addr
        raise AssertionError(f"no segment has room for {size} bytes")

    def free(self, addr: int, frames: list | None = None) -> None:
        segment = next(s for s in self.segments if addr in s.blocks)
        size, alloc_frames = segment.blocks.pop(addr)
        self._entry("free_requested", addr, size, frames if frames is not None else alloc_frames)
        self._entry("free_completed", addr, size, frames if frames is not None else alloc_frames)

    def oom(self, size: int, device_free: int) -> None:
        self.time_us += 10
        self.trace.append({"action": "oom", "device_free": device_free, "size": size, "stream": 0, "frames": [],
                           "time_us": self.time_us})

    def snapshot(self, first_entry: int = 0) -> dict[str, Any]:
        """The snapshot dict: the segments now, the trace from ``first_entry`` on (a ring buffer's tail)."""
        segments = []
        for s in self.segments:
            blocks, offset = [], 0
            for addr in sorted(s.blocks):
                if addr - s.address > offset:
                    blocks.append({"address": s.address + offset, "size": addr - s.address - offset,
                                   "requested_size": 0, "state": "inactive", "frames": []})
                size, frames = s.blocks[addr]
                blocks.append({"address": addr, "size": rounded(size), "requested_size": size,
                               "state": "active_allocated", "frames": frames})
                offset = addr - s.address + rounded(size)
            if offset < s.total_size:
                blocks.append({"address": s.address + offset, "size": s.total_size - offset, "requested_size": 0,
                               "state": "inactive", "frames": []})
            allocated = sum(rounded(size) for size, _ in s.blocks.values())
            segments.append({"device": self.device, "address": s.address, "total_size": s.total_size,
                             "allocated_size": allocated, "active_size": allocated,
                             "requested_size": sum(size for size, _ in s.blocks.values()), "stream": 0,
                             "segment_type": "large" if s.total_size > 1 << 20 else "small",
                             "segment_pool_id": (0, 0), "is_expandable": False, "frames": [], "blocks": blocks})
        traces: list[list[dict[str, Any]]] = [[] for _ in range(self.device + 1)]
        traces[self.device] = [dict(e) for e in self.trace[first_entry:]]
        return {"segments": segments, "device_traces": traces,
                "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": "", "max_split_size": -1,
                                       "garbage_collection_threshold": 0.0, "expandable_segments": False}}


# ----------------------------------------------------------------------------------- a training step
FC1 = ("/work/torch_nn/linear.py", 125, 31)  # called at model.py:31
ACT = ("/work/torch_nn/activation.py", 133, 32)
FC2 = ("/work/torch_nn/linear.py", 125, 33)

KIB = 1024


@dataclass
class TrainingRun:
    """The snapshot of :func:`training_snapshot`, and what happened, for the tests' arithmetic."""

    builder: Builder
    weights: int
    adam_state: int


def training_snapshot(steps: int = 2, engine_frames: bool = True, segment_bytes: int = 2 << 20) -> TrainingRun:
    """``steps`` training steps of model(fc1 -> relu -> fc2) with Adam, on one 2 MiB segment.

    Per step (bytes requested): the batch 4 KiB (train.py); forward: fc1's output 8 KiB, relu's 8 KiB, a 1 KiB
    workspace in fc2 freed at once, fc2's output 2 KiB; the loss 512 (train.py); backward (engine frames): the
    loss's gradient 512 (freed), fc2's input gradient 8 KiB (freed), the weight gradients 16 KiB + 4 KiB (kept
    until zero_grad frees them at the next step's start), relu's and fc1's input gradients 8 KiB each (freed),
    the activations freed; optimizer: Adam's state 2 x (16 + 4) KiB on the first step (kept), a 2 KiB
    temporary (freed); then the batch and the loss are freed. ``engine_frames=False``: backward allocations have
    no frames, as with ``_record_memory_history(stacks="python")``. Addresses are never reused: many steps need a
    larger ``segment_bytes``.
    """
    b = Builder()
    backward = backward_frames if engine_frames else list
    b.segment_alloc(segment_bytes)
    w1 = b.alloc(16 * KIB, weight_frames())
    w2 = b.alloc(4 * KIB, weight_frames())
    grads: list[int] = []
    for step in range(steps):
        for g in grads:
            b.free(g, [frame(f"{TORCH}/optim/optimizer.py", 900, "zero_grad"), *train_frames(45)])
        x = b.alloc(4 * KIB, train_frames(28))
        a1 = b.alloc(8 * KIB, forward_frames(FC1))
        a2 = b.alloc(8 * KIB, forward_frames(ACT))
        ws = b.alloc(1 * KIB, forward_frames(FC2))
        b.free(ws)
        out = b.alloc(2 * KIB, forward_frames(FC2))
        loss = b.alloc(512, train_frames(35))
        g_loss = b.alloc(512, backward())
        g_out = b.alloc(8 * KIB, backward())
        b.free(g_loss, backward())
        gw2 = b.alloc(4 * KIB, backward())
        g_a2 = b.alloc(8 * KIB, backward())
        b.free(g_out, backward())
        b.free(out, backward())
        b.free(a2, backward())
        gw1 = b.alloc(16 * KIB, backward())
        g_a1 = b.alloc(8 * KIB, backward())
        b.free(g_a2, backward())
        b.free(a1, backward())
        b.free(g_a1, backward())
        grads = [gw1, gw2]
        if step == 0:
            for size in (16 * KIB, 16 * KIB, 4 * KIB, 4 * KIB):
                b.alloc(size, optimizer_frames())
        tmp = b.alloc(2 * KIB, optimizer_frames())
        b.free(tmp, optimizer_frames())
        b.free(x, train_frames(55))
        b.free(loss, train_frames(55))
    del w1, w2
    return TrainingRun(b, weights=20 * KIB, adam_state=40 * KIB)
