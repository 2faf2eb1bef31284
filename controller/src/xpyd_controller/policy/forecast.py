"""A load forecast over the cold-start horizon: what the pools must serve by the time an instance added
now can serve. On the benchmark days it beats Dynamo 1.6.1's constant, ARIMA and Kalman predictors
one 180 s interval ahead (docs/BENCHMARKS.md, load forecasts).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


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
    # exponentially weighted mean and mean square of the errors forecasting each sample from the last
    _error: float = 0.0
    _error_square: float = 0.0
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
        error = rate - (previous + damped * elapsed)
        self._error += level_weight * (error - self._error)
        self._error_square += level_weight * (error * error - self._error_square)
        self._level = level_weight * rate + (1 - level_weight) * (previous + damped * elapsed)
        self._slope = trend_weight * (self._level - previous) / elapsed + (1 - trend_weight) * damped
        self._last_s = time_s

    def forecast(self) -> float | None:
        rise = self.rise()
        return None if rise is None or self._level is None else max(0.0, self._level + rise)

    def scatter(self) -> float | None:
        """The rate's scatter around the forecast: the standard deviation of the errors of forecasting
        each sample from the one before (counting noise and bursts; not their mean, the level's lag
        behind a ramp sampled more often than once per horizon, which is the trend, not noise)."""
        if self._level is None or self._last_s - self._first_s < self.horizon_s:
            return None
        return math.sqrt(max(self._error_square - self._error * self._error, 0.0))

    def rise(self) -> float | None:
        """The damped trend's change of the rate over the next `horizon_s` (negative when falling).

        Sampled more often than once per horizon, the smoothed level trails a ramp by several
        samples; the policy adds this change to the window's own rate instead."""
        if self._level is None or self._last_s - self._first_s < self.horizon_s:
            return None
        return self.damping * self._slope * self.horizon_s
