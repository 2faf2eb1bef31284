"""A load that fell faster than the fleet can regrow, and below its usual level, may come back as fast.

During a drop to near zero, an off phase or a lull, the arrivals say nothing of the load that comes
back, and growing back to meet it takes a cold start while its requests queue: a fleet sized for the
lull serves the return late (on the generalisation suite, 70-88 % goodput after a drop to 1-3 % and
back, where holding the fleet serves 99.6-99.9 %). So after such a fall each pool holds the largest
size it had over the regrowth before the fall, of what the load asked it to keep (the down window's
share: the arrivals' need, not growth for a backlog, nor growth asked for and not yet had;
`…HeldForReturningLoad`), until the load is back near its usual level or `hold_s` has passed since
it was last seen fallen. A fall only back to the usual level (the end of a flash crowd) or slower
than a regrowth (a ramp down, an evening) is followed as ever. The usual level is the arrival rate
smoothed with time constant `hold_s`.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from xpyd_controller.policy.state import JsonMap, StateError, maybe_number, number, rows

FAST_FALL = 0.5  # a rate below this share of both its usual level and its level one regrowth ago fell
MAX_RECENT = 64  # observations kept over one regrowth (a kept state may hold no more)


@dataclass
class ReturnHold:
    """Each pool's size to hold for a load that may return; its whole state is in `state()`."""

    hold_s: float
    _recent: deque[tuple[float, float, int, int]] = field(default_factory=deque)  # time, rate, P, D
    _usual: float | None = None
    _held: tuple[int, int] = (0, 0)
    _since_s: float = 0.0  # when the load was last seen fallen

    def observe(
        self, time_s: float, rate: float, regrowth_s: float, kept: tuple[int, int]
    ) -> tuple[int, int]:
        """Each pool's size to hold now ((0, 0): nothing held). `regrowth_s` is how long growing back
        takes (a cold start plus the window a rate is measured over); `kept` each pool's size now, as
        far as this decision asks it to keep it."""
        if self.hold_s <= 0:
            return (0, 0)
        usual = self._remember(time_s, rate, regrowth_s, kept)
        before = max(r for _, r, _, _ in self._recent)
        if rate < FAST_FALL * min(usual, before):
            prefill = max(row[2] for row in self._recent)
            decode = max(row[3] for row in self._recent)
            self._held = (max(self._held[0], prefill), max(self._held[1], decode))
            self._since_s = time_s
        elif rate >= FAST_FALL * usual or time_s - self._since_s > self.hold_s:
            self._held = (0, 0)
        return self._held

    def details(self) -> dict[str, float]:
        """For a decision's details: the usual level, and each pool's held size while one is held."""
        held = {
            "prefill_held_for_return": float(self._held[0]),
            "decode_held_for_return": float(self._held[1]),
        }
        usual = {} if self._usual is None else {"usual_arrival_rate": self._usual}
        return usual | (held if self._held != (0, 0) else {})

    def _remember(self, time_s: float, rate: float, regrowth_s: float, kept: tuple[int, int]) -> float:
        """Keep this observation for one regrowth; move the usual level towards its rate and return it.
        The last observation is always kept, so its time is the previous one's."""
        recent = self._recent
        if self._usual is None or not recent:
            self._usual = rate
        else:
            weight = 1.0 - math.exp(-max(time_s - recent[-1][0], 0.0) / self.hold_s)
            self._usual += weight * (rate - self._usual)
        recent.append((time_s, rate, kept[0], kept[1]))
        while len(recent) > MAX_RECENT or time_s - recent[0][0] > regrowth_s:
            recent.popleft()
        return self._usual

    def state(self) -> dict[str, Any]:
        return {
            "recent": [list(row) for row in self._recent],
            "usual": self._usual,
            "held": list(self._held),
            "sinceS": self._since_s,
        }

    def restore(self, data: JsonMap, latest_s: float) -> None:
        """Continue from `state()`'s output (a `StateError` leaves this unchanged)."""
        recent = rows(data, "recent", (False, False, True, True), latest_s=latest_s)
        if len(recent) > MAX_RECENT or any(rate < 0 for _, rate, _, _ in recent):
            raise StateError("recent", data.get("recent"), f"needs at most {MAX_RECENT} rows, rates >= 0")
        held = rows({"held": [data.get("held")]}, "held", (True, True))[0]
        usual = maybe_number(data, "usual", low=0)
        since_s = number(data, "sinceS", high=latest_s)
        self._recent = deque((t, r, int(p), int(d)) for t, r, p, d in recent)
        self._usual, self._since_s = usual, since_s
        self._held = (int(held[0]), int(held[1]))
