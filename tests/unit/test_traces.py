"""Trace records and synthetic generators: shapes, statistics and validation messages."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from xpyd_controller.sim.traces import (
    Constant,
    Diurnal,
    EmpiricalLengths,
    MixDrift,
    PiecewiseLinear,
    Request,
    Step,
    Trace,
    TraceError,
    UniformLengths,
    counted_arrivals,
    diurnal,
    gamma_bursts,
    mix_drift_day,
    poisson,
    renewal_arrivals,
    step,
    synthesize,
)

SEED_LENGTHS = UniformLengths(500, 8000, 80, 480)
ONE_TOKEN = UniformLengths(1, 1, 1, 1)


def test_request_round_trip_through_trace() -> None:
    requests = [Request(2.0, 100, 10, 50), Request(1.0, 200, 20)]
    trace = Trace.from_requests(requests, name="two")
    assert [r.arrival_s for r in trace] == [1.0, 2.0]
    assert trace[1] == requests[0]
    assert trace[1].hit_fraction == 0.5
    assert trace.duration_s == 2.0
    assert len(trace) == 2


def test_trace_arrays_are_read_only() -> None:
    trace = Trace.from_requests([Request(0.0, 10, 1)])
    with pytest.raises(ValueError, match="read-only"):
        trace.prompt_tokens[0] = 5


@pytest.mark.parametrize(
    ("columns", "message"),
    [
        (([0.0, 1.0], [10], [1, 1], [0, 0]), "prompt_tokens = 1: length must equal arrival_s length 2"),
        (([1.0, 0.5], [10, 10], [1, 1], [0, 0]), r"arrival_s\[1\] = 0.5: arrivals must be sorted"),
        (([-1.0], [10], [1], [0]), r"arrival_s\[0\] = -1.0: must be >= 0"),
        (([np.nan], [10], [1], [0]), r"arrival_s\[0\] = nan: must be finite"),
        (([0.0, 1.0], [10, 0], [1, 1], [0, 0]), r"prompt_tokens\[1\] = 0: must be >= 1"),
        (([0.0], [10], [0], [0]), r"output_tokens\[0\] = 0: must be >= 1"),
        (([0.0], [10], [1], [11]), r"prefix_hit_tokens\[0\] = 11: must be in \[0, prompt_tokens = 10\]"),
        (([0.0], [10], [1], [-1]), r"prefix_hit_tokens\[0\] = -1"),
    ],
)
@pytest.mark.parametrize("as_arrays", [True, False], ids=["numpy", "lists"])
def test_trace_rejects_bad_columns(columns: tuple[list[float], ...], message: str, as_arrays: bool) -> None:
    """Arrays are checked vectorised, lists in Python (no numpy): the same rules, the same messages."""
    with pytest.raises(TraceError, match=message):
        Trace(*(np.asarray(c) if as_arrays else c for c in columns))  # type: ignore[arg-type]


def test_a_list_built_trace_is_the_array_built_one() -> None:
    columns = ([0.0, 0.5, 0.5, 2.25], [10, 20, 30, 40], [1, 2, 3, 4], [0, 5, 0, 40])
    from_lists, from_arrays = Trace(*columns), Trace(*(np.asarray(c) for c in columns))
    assert from_lists.columns == from_arrays.columns
    for field in ("arrival_s", "prompt_tokens", "output_tokens", "prefix_hit_tokens"):
        listed, arrayed = getattr(from_lists, field), getattr(from_arrays, field)
        assert listed.dtype == arrayed.dtype and not listed.flags.writeable
        np.testing.assert_array_equal(listed, arrayed)
    assert list(from_lists) == list(from_arrays)
    assert from_lists.duration_s == from_arrays.duration_s == 2.25


def test_time_scale_and_window() -> None:
    trace = poisson(1, 10.0, ONE_TOKEN, duration_s=100.0)
    faster = trace.with_time_scale(0.5)
    assert faster.mean_rate == pytest.approx(2 * trace.mean_rate)
    window = trace.window(10.0, 20.0)
    assert np.all((window.arrival_s >= 10.0) & (window.arrival_s < 20.0))
    assert len(window) == np.count_nonzero((trace.arrival_s >= 10) & (trace.arrival_s < 20))
    with pytest.raises(TraceError, match="factor = 0"):
        trace.with_time_scale(0)


@pytest.mark.parametrize(
    ("curve", "times", "expected"),
    [
        (Constant(3.0), [0.0, 5.0], [3.0, 3.0]),
        (Step(10, 20, 30), [29.9, 30.0, 100.0], [10.0, 20.0, 20.0]),
        (Diurnal(10, 0.5, period_s=100, peak_s=0), [0.0, 50.0, 25.0], [15.0, 5.0, 10.0]),
        (PiecewiseLinear((0, 10), (0, 20)), [-5.0, 5.0, 50.0], [0.0, 10.0, 20.0]),
    ],
)
def test_curves(curve: Constant, times: list[float], expected: list[float]) -> None:
    np.testing.assert_allclose(curve(np.asarray(times, dtype=np.float64)), expected, atol=1e-9)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: Constant(-1), "value = -1: must be a finite number >= 0"),
        (lambda: Diurnal(1, 1.5), "swing = 1.5: must be in"),
        (lambda: PiecewiseLinear((0, 0), (1, 1)), "times_s = .*strictly increasing"),
        (lambda: PiecewiseLinear((0,), (1, 2)), "need one value per time"),
        (lambda: UniformLengths(0, 5, 1, 1), "prompt_min = 0: must be >= 1"),
        (lambda: UniformLengths(5, 4, 1, 1), "prompt_max = 4: must be >= prompt_min = 5"),
        (lambda: EmpiricalLengths(np.array([1]), np.array([], dtype=np.int64)), "need one output per prompt"),
        (lambda: synthesize(0, 1.0, ONE_TOKEN), "give exactly one of duration_s and count"),
        (lambda: synthesize(0, Constant(1.0), ONE_TOKEN, count=5), "a fixed count needs a constant rate"),
        (lambda: synthesize(0, 1.0, ONE_TOKEN, count=5, hit_fraction=1.0), r"hit_fraction = 1.0"),
        (
            lambda: gamma_bursts(0, 1.0, 0.0, ONE_TOKEN, duration_s=10),
            "cv = 0.0: must be a finite number > 0",
        ),
        (lambda: poisson(0, 1.0, ONE_TOKEN, duration_s=-1), "duration_s = -1"),
        (
            lambda: renewal_arrivals(np.random.default_rng(0), lambda t: -t, 10.0),
            "rate = -0.5: must be finite",
        ),
    ],
)
def test_generators_reject_bad_input(build: object, message: str) -> None:
    with pytest.raises(TraceError, match=message):
        build()  # type: ignore[operator]


def test_same_seed_same_trace_and_different_seed_differs() -> None:
    first = poisson(7, 5.0, SEED_LENGTHS, duration_s=200.0)
    again = poisson(7, 5.0, SEED_LENGTHS, duration_s=200.0)
    other = poisson(8, 5.0, SEED_LENGTHS, duration_s=200.0)
    np.testing.assert_array_equal(first.arrival_s, again.arrival_s)
    np.testing.assert_array_equal(first.prompt_tokens, again.prompt_tokens)
    assert len(first) != len(other) or not np.array_equal(first.arrival_s, other.arrival_s)


@pytest.mark.parametrize("cv", [1.0, 0.5, 3.0])
def test_renewal_rate_and_cv(cv: float) -> None:
    trace = gamma_bursts(11, 20.0, cv, ONE_TOKEN, duration_s=5_000.0)
    gaps = np.diff(trace.arrival_s)
    assert trace.mean_rate == pytest.approx(20.0, rel=0.03 * max(cv, 1))
    assert gaps.std() / gaps.mean() == pytest.approx(cv, rel=0.06)
    assert trace.arrival_s[-1] < 5_000.0


def test_counted_poisson_has_exact_count_and_rate() -> None:
    trace = poisson(3, 8.0, SEED_LENGTHS, count=6000)
    assert len(trace) == 6000
    assert trace.mean_rate == pytest.approx(8.0, rel=0.05)
    assert trace.prompt_tokens.min() >= 500 and trace.prompt_tokens.max() <= 8000
    assert trace.output_tokens.min() >= 80 and trace.output_tokens.max() <= 480
    assert len(counted_arrivals(np.random.default_rng(0), 1.0, 0)) == 0


def test_step_changes_rate_at_the_step() -> None:
    trace = step(5, 10.0, 20.0, 1800.0, ONE_TOKEN, duration_s=3600.0)
    assert len(trace.window(0, 1800)) / 1800 == pytest.approx(10.0, rel=0.05)
    assert len(trace.window(1800, 3600)) / 1800 == pytest.approx(20.0, rel=0.05)


def test_zero_rate_span_has_no_arrivals() -> None:
    trace = synthesize(2, Step(0.0, 50.0, 100.0), ONE_TOKEN, duration_s=200.0)
    assert trace.arrival_s.min() >= 100.0
    assert len(trace) == pytest.approx(5000, rel=0.05)


def test_diurnal_follows_its_curve() -> None:
    trace = diurnal(9, 10.0, 0.8, ONE_TOKEN, peak_s=12 * 3600.0)
    per_hour = np.bincount((trace.arrival_s // 3600).astype(int), minlength=24)
    expected = (
        Diurnal(10.0, 0.8, peak_s=12 * 3600.0)(np.arange(24, dtype=np.float64) * 3600.0 + 1800.0) * 3600
    )
    np.testing.assert_allclose(per_hour, expected, rtol=0.06)
    assert per_hour.argmax() in (11, 12)


def test_empirical_lengths_resample_observed_pairs() -> None:
    lengths = EmpiricalLengths(np.array([100, 2000]), np.array([7, 3]))
    prompt, output = lengths.sample(np.random.default_rng(0), np.zeros(1000))
    pairs = set(zip(prompt.tolist(), output.tolist(), strict=True))
    assert pairs == {(100, 7), (2000, 3)}


def test_mix_drift_moves_between_distributions() -> None:
    chat = UniformLengths(100, 100, 300, 300)
    rag = UniformLengths(5000, 5000, 20, 20)
    trace = mix_drift_day(4, 5.0, chat, rag, rag_peak_s=6 * 3600.0)
    rag_share = [
        float(np.mean(trace.window(hour * 3600, (hour + 1) * 3600).prompt_tokens == 5000)) for hour in (5, 17)
    ]
    assert rag_share[0] > 0.9
    assert rag_share[1] < 0.1
    assert set(np.unique(trace.output_tokens).tolist()) == {20, 300}


def test_mix_drift_rejects_weights_outside_unit_interval() -> None:
    lengths = MixDrift(ONE_TOKEN, ONE_TOKEN, Constant(2.0))
    with pytest.raises(TraceError, match=r"second_weight = 2\.0"):
        lengths.sample(np.random.default_rng(0), np.zeros(3))


def test_hit_fraction_applies_to_every_prompt() -> None:
    trace = synthesize(1, 2.0, SEED_LENGTHS, count=100, hit_fraction=0.25)
    np.testing.assert_array_equal(trace.prefix_hit_tokens, np.floor(trace.prompt_tokens * 0.25))


@settings(max_examples=50, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    before=st.floats(0.0, 50.0),
    after=st.floats(0.0, 50.0),
    at_s=st.floats(0.0, 200.0),
    duration_s=st.floats(0.5, 300.0),
    cv=st.floats(0.2, 5.0),
    hit=st.floats(0.0, 0.99),
)
def test_any_synthetic_trace_is_valid(
    *, seed: int, before: float, after: float, at_s: float, duration_s: float, cv: float, hit: float
) -> None:
    trace = synthesize(
        seed, Step(before, after, at_s), SEED_LENGTHS, duration_s=duration_s, cv=cv, hit_fraction=hit
    )
    assert np.all(np.diff(trace.arrival_s) >= 0)
    assert len(trace) == 0 or (trace.arrival_s[0] >= 0 and trace.arrival_s[-1] < duration_s)
    if before == 0:
        assert np.all(trace.arrival_s >= at_s - 1.0)  # the rate is integrated on a 1 s grid
    assert np.all(trace.prefix_hit_tokens <= trace.prompt_tokens)
