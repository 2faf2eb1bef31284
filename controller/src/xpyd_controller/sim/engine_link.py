"""The link KV transfers share when the deployment caps its total bandwidth (`shared_link_bandwidth`).

Processor sharing: every flow in progress gets an equal share of the capacity, at most the link's
per-flow bandwidth. It is tracked as a virtual clock of the bytes each flow has been served since it
started, so a flow finishes when the clock reaches its start plus its size, and a new or finished
flow changes only the rate, never the other flows' finishing order. Compiled with the rest of the
event loop (engine*.py, hack/native).
"""

from __future__ import annotations

from heapq import heappop, heappush


class SharedLink:
    """Flows of KV bytes sharing `capacity` bytes/s, each at most `per_flow` bytes/s."""

    def __init__(self, capacity: float, per_flow: float) -> None:
        self.capacity = capacity
        self.per_flow = per_flow
        self.virtual = 0.0  # bytes served to each flow in progress since the clock started
        self.last = 0.0  # when the virtual clock was last advanced
        self.flows: list[tuple[float, int]] = []  # (virtual time at which it finishes, request id)
        self.version = 0  # the finish event scheduled last; older ones are stale

    def rate(self) -> float:
        """Bytes/s each flow in progress is served now."""
        share = self.capacity / max(1, len(self.flows))
        return self.per_flow if self.per_flow < share else share

    def advance(self, t: float) -> None:
        if self.flows:
            self.virtual += (t - self.last) * self.rate()
        self.last = t

    def start(self, rid: int, size: float, t: float) -> None:
        """Request `rid`'s `size` bytes start flowing at t."""
        self.advance(t)
        heappush(self.flows, (self.virtual + size, rid))

    def finished(self, t: float) -> list[int]:
        """The requests whose transfer has finished by t, in finishing order (taken off the link)."""
        self.advance(t)
        flows = self.flows
        done: list[int] = []
        while flows and flows[0][0] <= self.virtual * (1 + 1e-12) + 1e-6:
            done.append(heappop(flows)[1])
        return done

    def next_finish(self, t: float) -> float | None:
        """When the first flow in progress finishes at today's rate (None: the link is idle); makes the
        finish scheduled before stale (`version`)."""
        self.version += 1
        if not self.flows:
            return None
        return t + (self.flows[0][0] - self.virtual) / self.rate()
