"""One device of a snapshot as a consistent history: what was live when the trace began, then every change.

``device_traces`` is a ring buffer (``max_entries``): it may begin long after the program did, so blocks
allocated before it are freed in it without their ``alloc``, or are still live at its end. The snapshot's
``segments`` give the state when it was taken; the state when the trace began is that state minus the
trace's net effect:

- live blocks at the start = the blocks live in ``segments`` that the trace did not allocate, plus the blocks
  the trace frees without having allocated them (sizes and frames from those entries);
- reserved bytes at the start = the segments' total size minus the trace's net ``segment_alloc``/``map``
  minus ``segment_free``/``unmap``.

Sizes are the allocator's requested sizes (what the trace's ``alloc`` and ``free_completed`` entries and the
blocks' ``requested_size`` carry, and what memory_viz plots), not the rounded block sizes. Torch-free.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

#: Nanoseconds between consecutive entries at least: room for the marks memprof puts before an entry.
MIN_GAP_NS = 4
_LIVE_STATES = ("active_allocated", "active_pending_free")
_GROW = ("segment_alloc", "segment_map")
_SHRINK = ("segment_free", "segment_unmap")


class Entry(NamedTuple):
    """One trace entry memprof uses: ``action`` as in the snapshot, ``time_ns`` strictly increasing."""

    action: str
    addr: int
    size: int
    time_ns: int
    frames: Sequence[Mapping[str, Any]]
    device_free: int = 0


class Block(NamedTuple):
    """A block live when the trace began; ``freed_at``: the position in ``Replay.entries`` of its free (-1: none)."""

    addr: int
    size: int
    frames: Sequence[Mapping[str, Any]]
    freed_at: int = -1


@dataclass(frozen=True)
class Replay:
    """One device's history.

    Attributes:
        device: the device index.
        entries: the trace's entries memprof reads (``alloc``, ``free_completed``, segment actions, ``oom``), in
            order, with a ``free_completed`` put in where the trace allocates a live address again.
        initial: the blocks live when the trace began.
        initial_reserved_bytes: reserved bytes then.
        end_allocated_bytes, end_reserved_bytes: what the snapshot's segments hold.
        entries_read: entries of the device's trace (all actions).
        timed: the entries carry ``time_us`` (else times are their positions, 1 us apart).
        repairs: inconsistencies found and how many (kept out of the timeline's levels).
    """

    device: int
    entries: list[Entry]
    initial: list[Block]
    initial_reserved_bytes: int
    end_allocated_bytes: int
    end_reserved_bytes: int
    entries_read: int
    timed: bool
    repairs: dict[str, int] = field(default_factory=dict)


def devices(snapshot: Mapping[str, Any]) -> list[int]:
    """The devices a snapshot has something for (trace entries or segments), ascending."""
    found = {d for d, trace in enumerate(snapshot["device_traces"]) if trace}
    found.update(int(s.get("device", 0)) for s in snapshot["segments"])
    return sorted(found)


def end_blocks(snapshot: Mapping[str, Any], device: int) -> tuple[dict[int, Block], int]:
    """Blocks live at the end (address -> block) and the reserved bytes of ``device``'s segments."""
    live: dict[int, Block] = {}
    reserved = 0
    for segment in snapshot["segments"]:
        if int(segment.get("device", 0)) != device:
            continue
        reserved += int(segment["total_size"])
        address = int(segment["address"])
        for block in segment.get("blocks", []):
            if block["state"] in _LIVE_STATES:
                size, frames = _requested(block)
                live[address] = Block(address, size, frames)
            address += int(block["size"])  # a block's address is its segment's plus the sizes before it
    return live, reserved


def _requested(block: Mapping[str, Any]) -> tuple[int, Sequence[Mapping[str, Any]]]:
    history = block.get("history")
    if "frames" not in block and isinstance(history, list) and history and isinstance(history[0], dict):
        # the format before PyTorch 2.1: frames and real sizes in the block's history
        return int(sum(int(h.get("real_size", 0)) for h in history)) or int(block["size"]), history[0].get("frames", [])
    return int(block.get("requested_size", block["size"])), block.get("frames", [])


def replay(snapshot: Mapping[str, Any], device: int) -> Replay:
    """Reconstructs ``device``'s history (module docstring); warns once about inconsistencies it repaired."""
    live_end, end_reserved = end_blocks(snapshot, device)
    traces = snapshot["device_traces"]
    raw: list[Mapping[str, Any]] = traces[device] if device < len(traces) else []
    timed = bool(raw) and all("time_us" in e for e in raw)
    entries: list[Entry] = []
    allocated: dict[int, int] = {}  # address -> size, for blocks the trace allocated and has not freed
    ever_allocated: set[int] = set()
    initial: list[Block] = []
    repairs: dict[str, int] = {}
    segment_net = 0
    previous_ns = -MIN_GAP_NS
    for position, entry in enumerate(raw):
        action = entry["action"]
        time_ns = int(entry["time_us"] * 1000) if timed else position * 1000
        time_ns = max(time_ns, previous_ns + MIN_GAP_NS)
        frames = entry.get("frames", [])
        addr, size = int(entry.get("addr", 0)), int(entry.get("size", 0))
        if action == "alloc":
            if addr in allocated:
                repairs["alloc of a live address (a free the trace lost)"] = repairs.get(
                    "alloc of a live address (a free the trace lost)", 0) + 1
                entries.append(Entry("free_completed", addr, allocated.pop(addr), time_ns, frames))
                time_ns += MIN_GAP_NS
            allocated[addr] = size
            ever_allocated.add(addr)
        elif action == "free_completed":
            if addr in allocated:
                del allocated[addr]
            else:  # allocated before the trace began
                initial.append(Block(addr, size, frames, len(entries)))
        elif action in _GROW:
            segment_net += size
        elif action in _SHRINK:
            segment_net -= size
        elif action != "oom":
            continue  # free_requested and snapshot change nothing
        entries.append(Entry(action, addr, size, time_ns, frames, int(entry.get("device_free", 0) or 0)))
        previous_ns = time_ns
    taken = {b.addr for b in initial} | ever_allocated
    for addr, block in live_end.items():
        if addr not in allocated and addr in taken:  # it would have been freed, or allocated, in the trace
            what = "live block at an address the trace used without allocating it for good"
            repairs[what] = repairs.get(what, 0) + 1
        elif addr not in allocated:
            initial.append(block)
        elif allocated[addr] != block.size:
            repairs["live block whose size differs from its alloc"] = repairs.get(
                "live block whose size differs from its alloc", 0) + 1
    missing = sum(1 for addr in allocated if addr not in live_end)
    if missing:
        repairs["block allocated and never freed in the trace but not live in the segments"] = missing
    initial_allocated = sum(b.size for b in initial)
    initial_reserved = end_reserved - segment_net
    if initial_reserved < initial_allocated:
        repairs["reserved bytes below allocated bytes when the trace began"] = 1
        initial_reserved = initial_allocated
    end_allocated = sum(b.size for b in live_end.values())
    if repairs:
        warnings.warn(f"the snapshot's trace of device {device} disagrees with its segments: "
                      + "; ".join(f"{count} x {what}" for what, count in repairs.items())
                      + "; memprof kept the trace's changes", RuntimeWarning, stacklevel=3)
    return Replay(device, entries, initial, initial_reserved, end_allocated, end_reserved, len(raw), timed, repairs)
