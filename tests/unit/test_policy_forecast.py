"""The load forecast the xpyd policy sizes for: damped trend over horizon-long buckets."""

from __future__ import annotations

import pytest

from xpyd_controller.policy.forecast import RateForecast


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
