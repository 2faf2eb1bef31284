"""The damped-trend candidate `benchmarks/forecasters.py` sets beside Dynamo's predictors."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from forecasters import DampedTrend, Errors


def forecasts(values: list[float]) -> list[float]:
    predictor = DampedTrend()
    out = []
    for value in values:
        predictor.add_data_point(value)
        out.append(predictor.predict_next())
    return out


def test_a_steady_ramp_is_followed_and_a_flat_series_stays_flat() -> None:
    ramp = forecasts([10.0 + 2 * i for i in range(40)])
    assert ramp[-1] == pytest.approx(10.0 + 2 * 40, rel=0.05)  # the next value, not the last one
    assert forecasts([25.0] * 10) == [25.0] * 10


def test_the_trend_is_damped_after_a_ramp_stops() -> None:
    after = forecasts([10.0 + 5 * i for i in range(20)] + [105.0] * 30)
    assert after[-1] == pytest.approx(105.0, rel=0.01)  # no overshoot carried on
    assert min(forecasts([5.0, 0.0, 0.0, 0.0])) >= 0.0  # a falling series never forecasts below zero


def test_errors_count_under_forecasts_beyond_ten_percent() -> None:
    errors = Errors.of(np.array([80.0, 100.0, 95.0, 130.0]), np.array([100.0, 100.0, 100.0, 100.0]))
    assert errors.under == 0.25 and errors.mape == pytest.approx((0.2 + 0 + 0.05 + 0.3) / 4)
