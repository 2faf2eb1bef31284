"""Synthetic traffic: arrival processes over a rate curve, and length distributions that may drift.

Arrivals come from one mechanism, time rescaling: a unit-rate renewal process (exponential gaps for
Poisson, Gamma gaps for bursts with a chosen coefficient of variation) is drawn in "operational time"
and mapped back through the inverse of the cumulative rate Λ(t). A constant curve gives a homogeneous
process, a diurnal or step curve a non-homogeneous one, without thinning and in a few vectorised calls.
Everything is driven by a numpy `Generator`, so a seed fixes the trace.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

from xpyd_controller.sim.traces.records import DAY_S, Trace, TraceError

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


class Curve(Protocol):
    """A non-negative function of time (seconds), evaluated on arrays."""

    def __call__(self, time_s: FloatArray) -> FloatArray: ...


def _positive(field: str, value: float) -> None:
    if not (math.isfinite(value) and value > 0):
        raise TraceError(field, value, "must be a finite number > 0")


def _non_negative(field: str, value: float) -> None:
    if not (math.isfinite(value) and value >= 0):
        raise TraceError(field, value, "must be a finite number >= 0")


@dataclass(frozen=True)
class Constant:
    """The same value at all times (a steady arrival rate, or a fixed mix weight)."""

    value: float

    def __post_init__(self) -> None:
        _non_negative("value", self.value)

    def __call__(self, time_s: FloatArray) -> FloatArray:
        return np.full(np.shape(time_s), self.value, dtype=np.float64)


@dataclass(frozen=True)
class Step:
    """`before` until `at_s`, then `after` (e.g. 10 → 20 req/s at t = 1800 s)."""

    before: float
    after: float
    at_s: float

    def __post_init__(self) -> None:
        _non_negative("before", self.before)
        _non_negative("after", self.after)
        _non_negative("at_s", self.at_s)

    def __call__(self, time_s: FloatArray) -> FloatArray:
        return np.where(np.asarray(time_s) < self.at_s, self.before, self.after).astype(np.float64)


@dataclass(frozen=True)
class Diurnal:
    """mean·(1 + swing·cos(2π(t − peak_s)/period_s)): one smooth peak and trough per period.

    `swing` is the relative amplitude in [0, 1]; with mean 0.5 and swing 1 the curve spans [0, 1]
    and serves as a mix weight.
    """

    mean: float
    swing: float
    period_s: float = DAY_S
    peak_s: float = 14 * 3600.0

    def __post_init__(self) -> None:
        _non_negative("mean", self.mean)
        if not (math.isfinite(self.swing) and 0 <= self.swing <= 1):
            raise TraceError("swing", self.swing, "must be in [0, 1]")
        _positive("period_s", self.period_s)

    def __call__(self, time_s: FloatArray) -> FloatArray:
        phase = 2 * np.pi * (np.asarray(time_s, dtype=np.float64) - self.peak_s) / self.period_s
        result: FloatArray = self.mean * (1 + self.swing * np.cos(phase))
        return result


@dataclass(frozen=True)
class PiecewiseLinear:
    """Linear interpolation through (time, value) points, constant beyond the ends (a user's own day)."""

    times_s: tuple[float, ...]
    values: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.times_s) != len(self.values) or not self.times_s:
            raise TraceError("values", len(self.values), f"need one value per time ({len(self.times_s)})")
        if any(b <= a for a, b in zip(self.times_s, self.times_s[1:], strict=False)):
            raise TraceError("times_s", self.times_s, "must be strictly increasing")
        for value in self.values:
            _non_negative("values", value)

    def __call__(self, time_s: FloatArray) -> FloatArray:
        return np.interp(np.asarray(time_s, dtype=np.float64), self.times_s, self.values)


def _unit_renewal_gaps(rng: np.random.Generator, count: int, cv: float) -> FloatArray:
    """`count` gaps with mean 1 and the given coefficient of variation (cv = 1 is Poisson)."""
    if cv == 1.0:
        return rng.exponential(1.0, count)
    shape = 1.0 / (cv * cv)
    return rng.gamma(shape, 1.0 / shape, count)


@dataclass(frozen=True)
class Shifted:
    """`curve` seen from time `offset_s` (arrivals drawn window by window, each window from 0)."""

    curve: Curve
    offset_s: float

    def __call__(self, time_s: FloatArray) -> FloatArray:
        return self.curve(np.asarray(time_s, dtype=np.float64) + self.offset_s)


def renewal_arrivals(
    rng: np.random.Generator, rate: Curve, duration_s: float, *, cv: float = 1.0, resolution_s: float = 1.0
) -> FloatArray:
    """Arrival times in [0, duration_s) of a renewal process with CV `cv` whose rate follows `rate`.

    Λ(t) is integrated with the midpoint rule on a `resolution_s` grid, so a `Step` at a whole second
    is exact; finer features than the grid are averaged.
    """
    _positive("duration_s", duration_s)
    _positive("cv", cv)
    _positive("resolution_s", resolution_s)
    grid = np.append(np.arange(0.0, duration_s, resolution_s), duration_s)
    widths = np.diff(grid)
    rates = np.asarray(rate(grid[:-1] + widths / 2), dtype=np.float64)
    if not np.all(np.isfinite(rates) & (rates >= 0)):
        bad = int(np.flatnonzero(~(np.isfinite(rates) & (rates >= 0)))[0])
        raise TraceError("rate", float(rates[bad]), f"must be finite and >= 0 (at t = {grid[bad]:g} s)")
    cumulative = np.concatenate(([0.0], np.cumsum(rates * widths)))
    total = float(cumulative[-1])
    operational = np.cumsum(
        _unit_renewal_gaps(rng, int(total + 8 * math.sqrt(total + 1) * max(cv, 1)) + 16, cv)
    )
    while operational[-1] < total:
        more = np.cumsum(_unit_renewal_gaps(rng, len(operational), cv)) + operational[-1]
        operational = np.concatenate((operational, more))
    operational = operational[operational < total]
    # Λ is flat where the rate is 0; searchsorted on the right edge keeps arrivals out of those spans.
    segment = np.clip(np.searchsorted(cumulative, operational, side="right") - 1, 0, len(widths) - 1)
    fraction = (operational - cumulative[segment]) / (rates[segment] * widths[segment])
    result: FloatArray = grid[segment] + fraction * widths[segment]
    return result


def counted_arrivals(rng: np.random.Generator, rate: float, count: int, *, cv: float = 1.0) -> FloatArray:
    """Exactly `count` arrivals at a constant `rate` (the seed's "6000 arrivals" style)."""
    _positive("rate", rate)
    _positive("cv", cv)
    if count < 0:
        raise TraceError("count", count, "must be >= 0")
    result: FloatArray = np.cumsum(_unit_renewal_gaps(rng, count, cv)) / rate
    return result


class LengthDistribution(Protocol):
    """Draws (prompt, output) token counts for requests arriving at the given times."""

    def sample(self, rng: np.random.Generator, arrival_s: FloatArray) -> tuple[IntArray, IntArray]: ...


@dataclass(frozen=True)
class UniformLengths:
    """Prompt and output lengths uniform on inclusive integer ranges (the seed's U[500, 8000], U[80, 480])."""

    prompt_min: int
    prompt_max: int
    output_min: int
    output_max: int

    def __post_init__(self) -> None:
        for low, high in (("prompt_min", "prompt_max"), ("output_min", "output_max")):
            if getattr(self, low) < 1:
                raise TraceError(low, getattr(self, low), "must be >= 1")
            if getattr(self, high) < getattr(self, low):
                raise TraceError(high, getattr(self, high), f"must be >= {low} = {getattr(self, low)}")

    def sample(self, rng: np.random.Generator, arrival_s: FloatArray) -> tuple[IntArray, IntArray]:
        count = len(arrival_s)
        prompt = rng.integers(self.prompt_min, self.prompt_max, count, endpoint=True, dtype=np.int64)
        output = rng.integers(self.output_min, self.output_max, count, endpoint=True, dtype=np.int64)
        return prompt, output


@dataclass(frozen=True, eq=False)
class EmpiricalLengths:
    """Resamples observed (prompt, output) pairs jointly, keeping their correlation."""

    prompt_tokens: IntArray
    output_tokens: IntArray
    name: str = ""

    def __post_init__(self) -> None:
        if len(self.prompt_tokens) != len(self.output_tokens) or len(self.prompt_tokens) == 0:
            raise TraceError(
                "output_tokens",
                len(self.output_tokens),
                f"need one output per prompt ({len(self.prompt_tokens)}) and at least one pair",
            )
        if (np.asarray(self.prompt_tokens) < 1).any() or (np.asarray(self.output_tokens) < 1).any():
            raise TraceError("tokens", "< 1", "every observed length must be >= 1")

    @classmethod
    def of(cls, trace: Trace) -> EmpiricalLengths:
        """The length distribution of a trace (its arrival times are ignored)."""
        return cls(trace.prompt_tokens, trace.output_tokens, trace.name)

    def sample(self, rng: np.random.Generator, arrival_s: FloatArray) -> tuple[IntArray, IntArray]:
        picks = rng.integers(0, len(self.prompt_tokens), len(arrival_s))
        return self.prompt_tokens[picks], self.output_tokens[picks]


@dataclass(frozen=True)
class MixDrift:
    """Each request draws from `second` with probability `second_weight(t)`, else from `first`.

    With chat-like `first`, RAG/code-like `second` and a `Diurnal(0.5, 1)` weight, the prefill:decode
    token ratio swings over the day while the arrival rate may stay flat.
    """

    first: LengthDistribution
    second: LengthDistribution
    second_weight: Curve

    def sample(self, rng: np.random.Generator, arrival_s: FloatArray) -> tuple[IntArray, IntArray]:
        weight = np.asarray(self.second_weight(arrival_s), dtype=np.float64)
        if not np.all((weight >= 0) & (weight <= 1)):
            raise TraceError(
                "second_weight", float(weight[(weight < 0) | (weight > 1)][0]), "must be in [0, 1]"
            )
        use_second = rng.random(len(arrival_s)) < weight
        prompt_a, output_a = self.first.sample(rng, arrival_s)
        prompt_b, output_b = self.second.sample(rng, arrival_s)
        return np.where(use_second, prompt_b, prompt_a), np.where(use_second, output_b, output_a)


def _generator(seed: np.random.Generator | int) -> np.random.Generator:
    return seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)


def synthesize(
    seed: np.random.Generator | int,
    rate: Curve | float,
    lengths: LengthDistribution,
    *,
    duration_s: float | None = None,
    count: int | None = None,
    cv: float = 1.0,
    hit_fraction: float = 0.0,
    name: str = "",
) -> Trace:
    """A trace from a rate (number or curve), an arrival CV and a length distribution.

    Give `duration_s` (any curve) or `count` (a constant rate only). `hit_fraction` is the share of
    every prompt found in the prefix cache.
    """
    rng = _generator(seed)
    if not (math.isfinite(hit_fraction) and 0 <= hit_fraction < 1):
        raise TraceError("hit_fraction", hit_fraction, "must be in [0, 1)")
    if (duration_s is None) == (count is None):
        raise TraceError("duration_s", duration_s, "give exactly one of duration_s and count")
    if count is not None:
        if not isinstance(rate, int | float):
            raise TraceError("count", count, "a fixed count needs a constant rate, not a curve")
        arrivals = counted_arrivals(rng, float(rate), count, cv=cv)
    else:
        assert duration_s is not None
        curve = Constant(float(rate)) if isinstance(rate, int | float) else rate
        arrivals = renewal_arrivals(rng, curve, duration_s, cv=cv)
    prompt, output = lengths.sample(rng, arrivals)
    hits = np.floor(prompt * hit_fraction).astype(np.int64)
    return Trace(arrivals, prompt, output, hits, name=name)


def poisson(
    seed: np.random.Generator | int,
    rate: float,
    lengths: LengthDistribution,
    *,
    duration_s: float | None = None,
    count: int | None = None,
) -> Trace:
    """Poisson arrivals at a constant rate."""
    return synthesize(seed, rate, lengths, duration_s=duration_s, count=count, name=f"poisson-{rate:g}")


def gamma_bursts(
    seed: np.random.Generator | int, rate: float, cv: float, lengths: LengthDistribution, *, duration_s: float
) -> Trace:
    """Gamma-renewal arrivals: mean rate `rate`, inter-arrival CV `cv` (> 1 is bursty)."""
    return synthesize(seed, rate, lengths, duration_s=duration_s, cv=cv, name=f"gamma-{rate:g}-cv{cv:g}")


def step(
    seed: np.random.Generator | int,
    before: float,
    after: float,
    at_s: float,
    lengths: LengthDistribution,
    *,
    duration_s: float,
) -> Trace:
    """Poisson arrivals whose rate jumps from `before` to `after` at `at_s`."""
    return synthesize(
        seed, Step(before, after, at_s), lengths, duration_s=duration_s, name=f"step-{before:g}-{after:g}"
    )


def diurnal(
    seed: np.random.Generator | int,
    mean_rate: float,
    swing: float,
    lengths: LengthDistribution,
    *,
    duration_s: float = DAY_S,
    peak_s: float = 14 * 3600.0,
) -> Trace:
    """Non-homogeneous Poisson arrivals following a daily cosine around `mean_rate`."""
    curve = Diurnal(mean_rate, swing, peak_s=peak_s)
    return synthesize(seed, curve, lengths, duration_s=duration_s, name=f"diurnal-{mean_rate:g}")


def mix_drift_day(
    seed: np.random.Generator | int,
    rate: Curve | float,
    chat: LengthDistribution,
    rag: LengthDistribution,
    *,
    duration_s: float = DAY_S,
    rag_peak_s: float = 11 * 3600.0,
    period_s: float = DAY_S,
) -> Trace:
    """A day whose length mix moves from all chat-like (night) to all RAG/code-like (at `rag_peak_s`).

    A shorter `period_s` repeats the swing several times (a cheap scenario for role conversion).
    """
    lengths = MixDrift(chat, rag, Diurnal(0.5, 1.0, period_s=period_s, peak_s=rag_peak_s))
    return synthesize(seed, rate, lengths, duration_s=duration_s, name="mix-drift-day")
