"""The load forecast the xpyd policy sizes for: damped trend over horizon-long buckets, and the rules
that keep it from ever scaling down or overriding missing data."""

from __future__ import annotations

import pytest
from tests.unit.test_policy_xpyd import observe, policy

from xpyd_controller.policy.forecast import RateForecast
from xpyd_controller.policy.types import Limits


def fed(rates: list[float], horizon_s: float = 60.0, step_s: float = 15.0) -> RateForecast:
    forecast = RateForecast(horizon_s)
    for index, rate in enumerate(rates):
        forecast.add(index * step_s, rate)
    return forecast


@pytest.mark.parametrize(
    ("rates", "expected"),
    [
        ([10.0] * 4, None),  # 45 s of samples: less than one horizon, the slope is noise
        ([10.0] * 5, 10.0),  # a flat rate over one horizon: the rate
    ],
)
def test_a_flat_rate_forecasts_itself_after_one_horizon(rates: list[float], expected: float | None) -> None:
    assert fed(rates).forecast() == (None if expected is None else pytest.approx(expected))


def test_a_ramp_is_forecast_ahead_of_the_last_rate_but_below_a_straight_line() -> None:
    ramp = [10.0 + index for index in range(40)]  # +1 req/s every 15 s: +4 per 60 s horizon
    ahead = fed(ramp).forecast()
    assert ahead is not None and ramp[-1] < ahead < ramp[-1] + 4.0


def test_at_the_top_of_a_ramp_the_damped_trend_flattens() -> None:
    ramp_then_flat = [10.0 + min(index, 20) for index in range(60)]
    ahead = fed(ramp_then_flat).forecast()
    assert ahead == pytest.approx(30.0, rel=0.02)


def test_one_sample_per_horizon_is_the_textbook_damped_trend() -> None:
    """Holt with damping (level weight 0.5, trend weight 0.3, damping 0.9), written out."""
    values = [100.0, 120.0, 90.0, 150.0, 160.0, 155.0]
    level, trend = values[0], 0.0
    for value in values[1:]:
        previous = level
        level = 0.5 * value + 0.5 * (previous + 0.9 * trend)
        trend = 0.3 * (level - previous) + 0.7 * 0.9 * trend
    forecast = fed(values, horizon_s=180.0, step_s=180.0).forecast()
    assert forecast == pytest.approx(level + 0.9 * trend)


def test_a_rising_rate_is_sized_ahead_and_a_flat_or_falling_one_as_measured() -> None:
    ahead, measured = policy(), policy(forecast_horizon_s=0)
    for step in range(41):
        observation = observe(step * 15.0, 3, 3, arrival_rate=10.0 + step)
        forecast_decision = ahead.decide(observation, Limits())
        plain_decision = measured.decide(observation, Limits())
    assert "SizedForForecastLoad" in forecast_decision.reasons
    assert forecast_decision.details["sized_arrival_rate"] > forecast_decision.details["arrival_rate"] == 50.0
    assert forecast_decision.details["prefill_floor"] > plain_decision.details["prefill_floor"]
    falling = policy()
    for step in range(41):
        decision = falling.decide(observe(step * 15.0, 3, 3, arrival_rate=50.0 - step), Limits())
    assert "SizedForForecastLoad" not in decision.reasons
    assert decision.details["sized_arrival_rate"] == decision.details["arrival_rate"] == 10.0


@pytest.mark.parametrize(
    ("rate", "reason"),
    [(None, "MissingArrivalRate"), (float("nan"), "MissingArrivalRate"), (0.0, "ZeroTraffic")],
)
def test_missing_and_zero_rates_keep_their_rules_after_a_rise(rate: float | None, reason: str) -> None:
    scaler = policy()
    for step in range(41):
        scaler.decide(observe(step * 15.0, 3, 3, arrival_rate=10.0 + step), Limits())
    decision = scaler.decide(observe(41 * 15.0, 3, 3, arrival_rate=rate), Limits())
    assert reason in decision.reasons
    if reason == "MissingArrivalRate":
        assert (decision.prefill, decision.decode) == (None, None)


@pytest.mark.parametrize(
    ("rates", "expected"),
    [
        ([10.0] * 4, None),  # less than one horizon
        ([10.0] * 20, 0.0),  # a flat rate: the forecast is exact
        ([10.0 + (-1) ** index for index in range(40)], (0.8, 2.5)),  # ±1 around 10: about its size
    ],
)
def test_the_scatter_is_the_rms_error_of_forecasting_each_sample(
    rates: list[float], expected: float | tuple[float, float] | None
) -> None:
    scatter = fed(rates).scatter()
    if isinstance(expected, tuple):
        assert scatter is not None and expected[0] < scatter < expected[1]
    else:
        assert scatter == expected


def falling_reasons(rates: list[float], **knobs: float) -> list[bool]:
    """Per decision: whether the policy saw the load falling."""
    scaler = policy(**knobs)
    return [
        "LoadFalling" in scaler.decide(observe(step * 15.0, 3, 3, arrival_rate=rate), Limits()).reasons
        for step, rate in enumerate(rates)
    ]


NOISY_FLAT = [20.0 + (1.0 if step % 3 == 0 else -0.5) for step in range(60)]
NOISY_FALL = [40.0 - 0.3 * step + (1.0 if step % 3 == 0 else -0.5) for step in range(60)]


@pytest.mark.parametrize(
    ("rates", "knobs", "expected"),
    [
        (NOISY_FLAT, {}, False),  # scatter but no trend
        ([10.0 + step for step in range(60)], {}, False),  # rising
        (NOISY_FALL, {}, True),  # -0.3 req/s every 15 s under ±1 of scatter
        (NOISY_FALL, {"falling_load_scatter": 0}, False),  # off
        (NOISY_FALL, {"falling_load_scatter": 10}, False),  # a fall smaller than 10 scatters
        (NOISY_FALL, {"forecast_horizon_s": 0}, False),  # no forecast, no fall
    ],
)
def test_the_load_falls_when_the_forecast_falls_beyond_the_rates_scatter(
    rates: list[float], knobs: dict[str, float], expected: bool
) -> None:
    seen = falling_reasons(rates, **knobs)
    assert not any(seen[:12])  # the first horizon (180 s) of samples says nothing
    assert any(seen[20:]) is expected and (all(seen[20:]) if expected else True)


def test_a_falling_load_scales_in_before_the_down_window_with_a_smaller_margin() -> None:
    """Supply follows the decisions; the load falls 40 -> 10 req/s: with the rule the pools shrink
    each time the model allows (no down window), and the scale-in target keeps two scatters to
    spare instead of the 10 % band; without it each step waits out the 300 s window."""
    shrink_at: dict[str, float] = {}
    down_targets: dict[str, list[float]] = {"rule": [], "off": []}
    for name, knobs in (("rule", {}), ("off", {"falling_load_scatter": 0.0})):
        scaler, supply = policy(**knobs), (8, 8)
        for step in range(200):
            rate = 40.0 - 0.15 * step + (0.5 if step % 2 else -0.5)
            decision = scaler.decide(observe(step * 15.0, *supply, arrival_rate=rate), Limits())
            down_targets[name].append(decision.details["prefill_down_target"])
            if "LoadFalling" in decision.reasons:
                assert decision.details["forecast_fall"] > 0.5 * decision.details["rate_scatter"] > 0
            if decision.prefill is not None and decision.prefill < supply[0] and step * 15.0 > 300:
                shrink_at.setdefault(name, step * 15.0)
            supply = (decision.prefill or supply[0], decision.decode or supply[1])
    assert shrink_at["rule"] < shrink_at["off"]
    assert all(r <= o for r, o in zip(down_targets["rule"], down_targets["off"], strict=True))
    assert any(r < o for r, o in zip(down_targets["rule"], down_targets["off"], strict=True))
