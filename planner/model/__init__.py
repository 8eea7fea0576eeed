"""The planner's data: a chain and its stages, carried tensors, the whole step, weights, the link to host
memory, and schedules. Pure, frozen, validated dataclasses with their JSON forms; no torch, no pandas."""
