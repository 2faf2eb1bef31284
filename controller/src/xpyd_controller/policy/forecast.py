"""A load forecast over the cold-start horizon: what the pools must serve by the time an instance added
now can serve. On the benchmark days it beats Dynamo 1.6.1's constant, ARIMA and Kalman predictors
one 180 s interval ahead (docs/BENCHMARKS.md, load forecasts).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from xpyd_controller.policy.state import JsonMap, maybe_number, number

# A kept slope beyond this (requests/s per second: from 0 to a million req/s in a second) is no slope
# of ours: the forecast would size for it.
MAX_SLOPE = 1e6


@dataclass
class RateForecast:
    """The arrival rate `horizon_s` ahead: damped-trend exponential smoothing (Holt's linear method with
    a damped trend, Gardner & McKenzie) on the measured rates, its weights and damping stated per
    horizon and scaled to the time between samples, so a sample every `horizon_s` is exactly the
    textbook recursion (level weight 0.5, trend weight 0.3, damping 0.9 per step; what
    benchmarks/forecasters.py scores against Dynamo's predictors one 180 s interval ahead). None until
    `horizon_s` of samples are in (before that the slope is noise)."""

    horizon_s: float
    level_weight: float = 0.5
    trend_weight: float = 0.3
    damping: float = 0.9
    _level: float | None = None
    _slope: float = 0.0  # rate change per second
    _first_s: float = 0.0
    _last_s: float = 0.0

    def add(self, time_s: float, rate: float) -> None:
        if self._level is None:
            self._level, self._first_s, self._last_s = rate, time_s, time_s
            return
        elapsed = time_s - self._last_s
        if elapsed <= 0:
            return
        steps = elapsed / self.horizon_s
        level_weight = 1 - (1 - self.level_weight) ** steps
        trend_weight = 1 - (1 - self.trend_weight) ** steps
        damped = self.damping**steps * self._slope
        previous = self._level
        self._level = level_weight * rate + (1 - level_weight) * (previous + damped * elapsed)
        self._slope = trend_weight * (self._level - previous) / elapsed + (1 - trend_weight) * damped
        self._last_s = time_s

    def state(self) -> dict[str, Any]:
        return {
            "level": self._level,
            "slope": self._slope,
            "firstS": self._first_s,
            "lastS": self._last_s,
        }

    def restore(self, data: JsonMap, latest_s: float) -> None:
        """Continue from `state()`'s output (a `StateError` leaves this unchanged)."""
        values = (
            maybe_number(data, "level", low=0),
            number(data, "slope", -MAX_SLOPE, MAX_SLOPE),
            number(data, "firstS", high=latest_s),
            number(data, "lastS", high=latest_s),
        )
        self._level, self._slope, self._first_s, self._last_s = values

    def forecast(self) -> float | None:
        rise = self.rise()
        return None if rise is None or self._level is None else max(0.0, self._level + rise)

    def rise(self) -> float | None:
        """The damped trend's change of the rate over the next `horizon_s` (negative when falling).

        Sampled more often than once per horizon, the smoothed level trails a ramp by several
        samples; the policy adds this change to the window's own rate instead."""
        if self._level is None or self._last_s - self._first_s < self.horizon_s:
            return None
        return self.damping * self._slope * self.horizon_s
