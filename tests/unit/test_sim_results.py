"""Metrics, percentiles and the hindsight oracles, on small hand-made inputs."""

from __future__ import annotations

import math

import numpy as np
import pytest

from xpyd_controller.policy.types import Decision, Limits, Observation, PoolState
from xpyd_controller.sim.config import Fleet, SimConfig
from xpyd_controller.sim.engine import RawRun
from xpyd_controller.sim.oracles import make_oracle, plan_windows
from xpyd_controller.sim.results import SeriesPoint, SimResult, count_oscillations, recovery_time_s
from xpyd_controller.sim.seed import SEED_HARDWARE, SEED_SLO, seed_requests
from xpyd_controller.sim.stats import (
    gap_bin,
    mean_confidence_interval,
    seed_percentile,
    weighted_bin_percentile,
)
from xpyd_controller.sim.traces import Trace


@pytest.mark.parametrize(
    ("values", "q", "expected"),
    [
        ([3.0, 1.0, 2.0], 0.5, 2.0),
        ([1.0, 2.0, 3.0, 4.0], 0.5, 3.0),
        ([5.0], 0.99, 5.0),
        (list(range(100)), 0.99, 99),
    ],
)
def test_seed_percentile_indexes_without_interpolation(
    values: list[float], q: float, expected: float
) -> None:
    assert seed_percentile(values, q) == expected


def test_empty_percentile_is_nan_not_zero() -> None:
    assert math.isnan(seed_percentile([], 0.5))


def test_weighted_percentile_matches_the_expanded_list() -> None:
    gaps = {0.01: 90, 0.05: 9, 0.2: 1}
    histogram: dict[int, int] = {}
    for gap, count in gaps.items():
        histogram[gap_bin(gap)] = histogram.get(gap_bin(gap), 0) + count
    expanded = [g for g, c in gaps.items() for _ in range(c)]
    for q in (0.5, 0.9, 0.95, 0.99):
        assert weighted_bin_percentile(histogram, q) == pytest.approx(seed_percentile(expanded, q), rel=1e-4)


def test_confidence_interval_uses_student_t() -> None:
    mean, half = mean_confidence_interval([1.0, 2.0, 3.0])
    assert mean == 2.0
    assert half == pytest.approx(4.303 * 1.0 / math.sqrt(3))
    assert math.isnan(mean_confidence_interval([1.0])[1])


def raw_with(decisions: list[tuple[int | None, int | None]]) -> RawRun:
    empty = np.zeros(0)
    return RawRun(
        empty,
        empty,
        empty,
        {},
        0.0,
        0.0,
        (),
        tuple((float(i), Decision(p, d)) for i, (p, d) in enumerate(decisions)),
        0,
        0,
        0,
        0,
    )


@pytest.mark.parametrize(
    ("decisions", "expected"),
    [
        ([(1, 1), (2, 1), (3, 1)], 0),
        ([(1, 1), (2, 1), (1, 1), (2, 1)], 2),
        ([(2, 2), (2, 3), (None, None), (2, 2), (2, 2)], 1),
        ([(1, 4), (2, 3), (3, 2)], 0),
    ],
)
def test_oscillations_count_direction_reversals(
    decisions: list[tuple[int | None, int | None]], expected: int
) -> None:
    assert count_oscillations(raw_with(decisions)) == expected


def result_with_goodput(per_minute: list[float]) -> SimResult:
    points = tuple(
        SeriesPoint(60.0 * i, 1.0, 1.0, 1.0, 1, 1, 2, 0.1, 0.1, 0.01, 0.01, g)
        for i, g in enumerate(per_minute)
    )
    return SimResult(
        0,
        0,
        0,
        0,
        0,
        0,
        0,
        0,
        0,
        0,
        0,
        0,
        0,
        0,
        0,
        0,
        0,
        0,
        0,
        0,
        points,  # only the series matters here
    )


@pytest.mark.parametrize(
    ("per_minute", "after", "expected"),
    [
        ([1.0, 1.0, 0.5, 0.8, 1.0, 1.0], 120.0, 120.0),
        ([1.0, 1.0, 1.0], 60.0, 0.0),
        ([1.0, 0.5, 0.5], 60.0, math.inf),
        ([1.0, 0.5, math.nan, 1.0], 60.0, 60.0),
    ],
)
def test_recovery_is_the_first_time_after_which_goodput_holds(
    per_minute: list[float], after: float, expected: float
) -> None:
    assert recovery_time_s(result_with_goodput(per_minute), after) == expected


def step_trace() -> Trace:
    low = seed_requests(2.0, count=1400, seed=1, prompt_range=(2000, 4000), output_range=(50, 100))
    low = low.window(0.0, 600.0)
    high = seed_requests(12.0, count=7200, seed=2, prompt_range=(2000, 4000), output_range=(50, 100))
    return Trace(
        np.concatenate([low.arrival_s, high.arrival_s + 600.0]),
        np.concatenate([low.prompt_tokens, high.prompt_tokens]),
        np.concatenate([low.output_tokens, high.output_tokens]),
        np.zeros(len(low) + len(high), dtype=np.int64),
    )


def observation_at(time_s: float) -> Observation:
    return Observation(time_s, 60.0, PoolState(1), PoolState(1), 1.0, 1000.0, 100.0)


def test_window_oracle_scales_ahead_of_the_step_and_static_takes_the_peak() -> None:
    trace = step_trace()
    config = SimConfig(SEED_HARDWARE, Fleet("disagg", 1, 1), slo=SEED_SLO)
    plan = plan_windows(trace, config)
    assert plan.prefill[0] < plan.prefill[2]  # 2 req/s before 600 s, 12 req/s after
    window = make_oracle("oracle-window", trace, config)
    limits = Limits()
    before = window.decide(observation_at(0.0), limits).prefill
    ahead = window.decide(observation_at(590.0), limits).prefill  # the step is within the lead time
    assert before is not None and ahead is not None and ahead > before
    static = make_oracle("oracle-static", trace, config).decide(observation_at(0.0), limits)
    assert static.prefill == int(plan.prefill.max())
    assert static.decode == int(plan.decode.max())


@pytest.mark.parametrize("size", [0, 1, 2, 10, 6000])
@pytest.mark.parametrize("nan_every", [0, 7, 1])
def test_the_python_percentile_is_the_numpy_one(size: int, nan_every: int) -> None:
    """Short samples are sorted in Python (no numpy for a seed row), long ones partitioned by numpy."""
    values = np.random.default_rng(size).exponential(size=size)
    if nan_every:
        values[::nan_every] = math.nan
    for q in (0.0, 0.5, 0.9, 0.99, 1.0):
        listed, arrayed = seed_percentile(values.tolist(), q), seed_percentile(values, q)
        assert listed == arrayed or (math.isnan(listed) and math.isnan(arrayed))
