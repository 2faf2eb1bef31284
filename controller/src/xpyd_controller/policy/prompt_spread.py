"""How much of the prompt spread the TTFT sizing needs, learned from the measured TTFT.

The observation has a prompt length's mean and p90; the sizing takes a standard deviation from them
assuming normal lengths ((p90 − mean)/z₀.₉) and sizes prefill for the TTFT quantile of the prompt
mean + z_q·σ with the queueing wait's quantile on top. On a skewed mix (the Azure conversation and
code lengths) that reads the spread high and the model's TTFT high: the measured TTFT p90 sits below
what the model predicts for the pool that served it. `SpreadCalibration` keeps a factor on the prompt
spread, between `floor` and 1: each steady window proposes the factor at which the model's p90 TTFT on
the serving pool equals the measured p90, and the factor follows those proposals slowly downwards (time
constant `tau_s`) and four times faster upwards; a measured TTFT above the SLO puts it back to 1 at once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]

CALIBRATION_QUANTILE = 0.9  # the measured TTFT quantile (the observation's p90) the model is held to
GRID_POINTS = 9  # factors tried between the floor and 1 in one vectorised model call
UP_SPEEDUP = 4.0  # the factor goes back up this many times faster than it comes down


@dataclass
class SpreadCalibration:
    """A factor in [`floor`, 1] on the prompt spread the prefill sizing uses; `floor` 1 keeps it at 1."""

    floor: float
    tau_s: float
    factor: float = 1.0
    _time_s: float | None = None

    @property
    def active(self) -> bool:
        return self.floor < 1

    def grid(self) -> FloatArray:
        """The factors a window is tried at, ascending (the model's TTFT rises with the spread)."""
        return np.linspace(self.floor, 1.0, GRID_POINTS)

    def target(self, measured_s: float, predicted_s: FloatArray) -> float:
        """The factor at which the model's TTFT (`predicted_s`, at `grid()`) equals the measured one:
        1 when the model is not above the measurement even at the full spread, `floor` when it is
        above it even at the floor, linear in between."""
        factors = self.grid()
        if not measured_s < float(predicted_s[-1]):
            return 1.0
        if not all(math.isfinite(float(p)) for p in predicted_s) or np.any(np.diff(predicted_s) < 0):
            return 1.0  # saturated or not monotone: nothing to learn from this window
        return float(np.interp(measured_s, predicted_s, factors))

    def update(self, time_s: float, target: float | None) -> None:
        """Move towards `target` (None: an ineligible window, only the clock moves)."""
        last, self._time_s = self._time_s, time_s
        if target is not None and self.tau_s == 0:
            self.factor = target
        if target is None or last is None or self.tau_s == 0:
            return
        tau = self.tau_s / UP_SPEEDUP if target > self.factor else self.tau_s
        weight = 1.0 - math.exp(-max(time_s - last, 0.0) / tau)
        self.factor = min(1.0, max(self.floor, self.factor + weight * (target - self.factor)))

    def reset(self, time_s: float) -> None:
        """The measured TTFT missed its SLO: the full spread again, at once."""
        self.factor, self._time_s = 1.0, time_s
