"""A serving instance of the event loop: its lifecycle state and its engine state.

Prefill instances are FIFO servers (each job's completion is known when it is assigned); batch
instances (decode, or co-located GPUs) interleave chunked local prefill with runs of decode steps,
and keep their token gaps on a monotonic stack so that a member's largest gap is found in O(log n).
Compiled with the rest of the event loop (engine*.py, hack/native).
"""

from __future__ import annotations

import math
from collections import deque
from typing import Final

# Lifecycle states and roles. Constants are `Final` so that the compiled build (hack/native) inlines
# them instead of looking them up in the module's namespace at every use.
STARTING: Final = "starting"
READY: Final = "ready"
DRAINING: Final = "draining"
CONVERTING: Final = "converting"
PREFILL: Final = "prefill"
DECODE: Final = "decode"
# Operations of a batch instance.
IDLE: Final = 0
RUN: Final = 1
CHUNK: Final = 2
CYCLE: Final = 3


class Instance:
    """One serving instance. Prefill instances are FIFO servers; batch instances (decode or
    co-located) interleave chunked local prefill with runs of decode steps."""

    __slots__ = (
        "alt",
        "chunks_done",
        "created_s",
        "ctx_sum",
        "departures",
        "done_times",
        "free_at",
        "fresh",
        "gap_count",
        "gap_max_at",
        "gap_max_value",
        "kv_used",
        "last_step_end",
        "op",
        "op_end",
        "op_first",
        "op_n",
        "op_start",
        "op_step",
        "queue",
        "ready_at",
        "role",
        "size",
        "state",
        "steps",
        "target_role",
        "uid",
        "version",
    )

    def __init__(self, uid: int, role: str, state: str, created_s: float) -> None:
        self.uid = uid
        self.state = state
        self.created_s = created_s
        self.ready_at = created_s
        self.target_role = role
        self.version = 0
        self.reset(role)

    def reset(self, role: str) -> None:
        """Empty engine state for `role` (also used when a conversion completes)."""
        self.role = role
        self.done_times: deque[float] = deque()
        self.free_at = 0.0
        self.queue: deque[int] = deque()
        self.chunks_done = 0
        self.size = 0  # requests in the batch (each holds its reserved KV tokens until it leaves)
        self.departures: list[tuple[int, int]] = []  # (step count at which it finishes, rid)
        self.fresh: list[int] = []  # members still waiting for their first token
        self.steps = 0
        self.kv_used = 0
        self.ctx_sum = 0.0
        self.op = IDLE
        self.op_start = self.op_first = self.op_step = self.op_end = 0.0
        self.op_n = 0
        self.alt = False
        self.last_step_end = 0.0
        # Token gaps as a monotonic stack (entry index, value), values decreasing: the largest gap
        # since entry i is the first value whose index is >= i (a member's max gap in O(log n)).
        self.gap_count = 0
        # The bottom entry (index -1, infinite) is never popped nor found: no emptiness checks.
        self.gap_max_at: list[int] = [-1]
        self.gap_max_value: list[float] = [math.inf]

    def prefill_load(self, t: float) -> int:
        """The seed's prefill load: jobs assigned and not finished, plus one if one is running."""
        done = self.done_times
        while done and done[0] < t:
            done.popleft()
        return len(done) + (1 if done else 0)

    def is_empty(self, t: float) -> bool:
        if self.role == PREFILL:
            return self.free_at <= t
        return self.op == IDLE and not self.size and not self.queue


def record_gap(inst: Instance, gap: float) -> None:
    """Push a token gap on the instance's monotonic stack (dropping smaller, older entries)."""
    at, values = inst.gap_max_at, inst.gap_max_value
    if values[-1] == gap:  # the common case: the same step time again
        at[-1] = inst.gap_count
        inst.gap_count += 1
        return
    while values[-1] <= gap:
        values.pop()
        at.pop()
    at.append(inst.gap_count)
    values.append(gap)
    inst.gap_count += 1


def smallest_batch(instances: list[Instance]) -> Instance:
    """The instance with the fewest members, ties to the first (`min` without a key call each)."""
    best = instances[0]
    fewest = best.size
    for inst in instances:
        size = inst.size
        if size < fewest:
            best, fewest = inst, size
    return best
