"""How long capacity the policy asked for took to serve: cold starts and conversions, as measured.

A pool can grow two ways: a new instance (a cold start: scheduling, image, model load) or an instance
of the other pool converted in place (its drain, then the switch). Which is faster depends on the
deployment: a cold start is minutes for a real model and seconds for a small one on a warm node; a
conversion is as long as the giver's longest request still running (a decode instance finishing
long answers: tens of seconds) plus the KV lease. The policy only sees instance counts, so it times
each growth it asked for from the decision to the pass whose ready count reaches the asked-for size.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from xpyd_controller.policy.state import JsonMap, StateError, number, rows, section

COLD_START = "cold_start"
CONVERSION = "conversion"
KINDS = (COLD_START, CONVERSION)
NEW_SAMPLE_WEIGHT = 0.5  # exponentially weighted mean: the latest growth counts half


@dataclass
class _Growth:
    target: int  # ready count that means the growth is serving
    since_s: float
    kind: str  # COLD_START, or CONVERSION (the other pool shrank in the same decision)


@dataclass
class LeadTimes:
    """Exponentially weighted mean seconds from asking for growth to serving it, per way of growing.

    A growth that never reaches its size within `timeout_s` (or that a later decision asks to undo)
    gives no sample: only completed growths are timed, so a stuck pod does not read as slow capacity.
    """

    timeout_s: float
    seconds: dict[str, float] = field(default_factory=dict)
    _pending: dict[int, _Growth] = field(default_factory=dict)

    def observe(self, time_s: float, ready: tuple[int, int]) -> None:
        """Close the growths whose pool is now ready at its asked-for size."""
        for pool, growth in list(self._pending.items()):
            if ready[pool] >= growth.target:
                took = time_s - growth.since_s
                old = self.seconds.get(growth.kind)
                self.seconds[growth.kind] = took if old is None else old + NEW_SAMPLE_WEIGHT * (took - old)
                del self._pending[pool]
            elif time_s - growth.since_s > self.timeout_s:
                del self._pending[pool]

    def state(self) -> dict[str, Any]:
        return {
            "seconds": {kind: self.seconds[kind] for kind in KINDS if kind in self.seconds},
            "pending": [
                [pool, g.target, g.since_s, KINDS.index(g.kind)] for pool, g in sorted(self._pending.items())
            ],
        }

    def restore(self, data: JsonMap, latest_s: float) -> None:
        """Continue from `state()`'s output (a `StateError` leaves this unchanged)."""
        seconds = section(data, "seconds")
        measured = {kind: number(seconds, kind, 0, self.timeout_s) for kind in KINDS if kind in seconds}
        pending = {}
        for pool, target, since_s, kind in rows(data, "pending", (True, True, False, True)):
            if pool > 1 or kind >= len(KINDS) or since_s > latest_s:
                raise StateError(
                    "pending",
                    [pool, target, since_s, kind],
                    f"must name pool 0 or 1, kind 0 or 1, a time no later than {latest_s:g}",
                )
            pending[int(pool)] = _Growth(int(target), since_s, KINDS[int(kind)])
        self.seconds, self._pending = measured, pending

    def asked(self, time_s: float, supply: tuple[int, int], decided: tuple[int, int]) -> None:
        """Start timing each pool the decision grows (the first growth of a pool is timed until it
        serves); a decision that asks a pool for less than a timed growth drops that timing."""
        for pool in (0, 1):
            growth = self._pending.get(pool)
            if growth is not None and decided[pool] < growth.target:
                del self._pending[pool]
            elif growth is None and decided[pool] > supply[pool]:
                other = 1 - pool
                kind = CONVERSION if decided[other] < supply[other] else COLD_START
                self._pending[pool] = _Growth(decided[pool], time_s, kind)

    def waited_s(self, time_s: float) -> dict[str, float]:
        """Per way of growing, how long its growth still being timed has waited so far: that way takes
        at least this long now, whatever it took before."""
        waited: dict[str, float] = {}
        for growth in self._pending.values():
            waited[growth.kind] = max(waited.get(growth.kind, 0.0), time_s - growth.since_s)
        return waited

    def cold_start_faster(self) -> bool:
        """Both ways measured, and a cold start served sooner than a conversion."""
        cold, conversion = self.seconds.get(COLD_START), self.seconds.get(CONVERSION)
        return cold is not None and conversion is not None and cold < conversion
