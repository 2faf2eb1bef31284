"""The factor on the prompt spread learned from the measured TTFT (policy/prompt_spread.py, xpyd)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from tests.unit.test_policy_xpyd import ISL, observe, policy

from xpyd_controller.policy.prompt_spread import UP_SPEEDUP, SpreadCalibration
from xpyd_controller.policy.types import Decision, Limits, Observation, PoolState

P90 = ISL * 1.5  # a wide prompt mix: the normal reading of mean and p90 gives σ ≈ 2,340 tokens


@pytest.mark.parametrize(
    ("measured", "predicted", "expected"),
    [
        (0.5, [0.2, 0.3, 0.4], 1.0),  # the model is not above the measurement: the full spread
        (0.4, [0.2, 0.3, 0.4], 1.0),
        (0.1, [0.2, 0.3, 0.4], 0.5),  # above it even at the floor: the floor
        (0.3, [0.2, 0.3, 0.4], 0.75),
        (0.25, [0.2, 0.3, 0.4], 0.625),
        (0.3, [0.2, math.inf, math.inf], 1.0),  # saturated: nothing to learn
        (0.3, [0.4, 0.2, 0.5], 1.0),  # not monotone: nothing to learn
    ],
)
def test_target_is_the_factor_at_which_the_model_meets_the_measurement(
    measured: float, predicted: list[float], expected: float
) -> None:
    calibration = SpreadCalibration(floor=0.5, tau_s=900)
    grid = calibration.grid()
    predicted_at_grid = np.interp(grid, np.linspace(0.5, 1.0, len(predicted)), predicted)
    if not all(math.isfinite(p) for p in predicted) or sorted(predicted) != predicted:
        predicted_at_grid = np.array(predicted + [predicted[-1]] * (len(grid) - len(predicted)))
    assert calibration.target(measured, predicted_at_grid) == pytest.approx(expected)


def test_the_factor_comes_down_slowly_goes_up_faster_and_resets_at_once() -> None:
    calibration = SpreadCalibration(floor=0.5, tau_s=900)
    calibration.update(0, 0.5)  # the first window only starts the clock
    assert calibration.factor == 1.0
    calibration.update(900, 0.5)
    assert calibration.factor == pytest.approx(1 - 0.5 * (1 - math.exp(-1)))
    down = calibration.factor
    calibration.update(900 + 900 / UP_SPEEDUP, 1.0)  # the same weight in a quarter of the time
    assert calibration.factor == pytest.approx(down + (1 - down) * (1 - math.exp(-1)))
    calibration.update(2000, None)  # an ineligible window: the clock moves, the factor does not
    held = calibration.factor
    calibration.update(2015, 0.5)
    assert held - calibration.factor < 0.01 * held  # 15 s of learning, not 1,100 s
    calibration.reset(2030)
    assert calibration.factor == 1.0
    for time_s in range(2045, 100_000, 15):
        calibration.update(time_s, 0.2)
    assert calibration.factor == 0.5  # never below the floor


def steady(time_s: float, ttft: float, prefill: int | PoolState = 10, **changes: float | None) -> Observation:
    fields = {"p90_input_tokens": P90, "ttft_p90_s": ttft, "decode_waiting": 0.0, **changes}
    return observe(time_s, prefill, 4, **fields)


def run(
    ttft: float, *, seconds: float = 3600, prefill: int | PoolState = 10, **knobs: float
) -> list[Decision]:
    made = policy(**knobs)
    return [made.decide(steady(t, ttft, prefill), Limits()) for t in np.arange(0, seconds, 15.0)]


def test_a_ttft_far_below_the_model_lowers_the_spread_and_the_prefill_floor() -> None:
    learned = run(0.05)[-1]
    full = run(0.05, spread_floor=1)[-1]
    assert "PromptSpreadFromMeasuredTtft" in learned.reasons
    assert learned.details["prompt_spread_factor"] == pytest.approx(0.7, abs=0.01)  # 4 time constants
    assert learned.details["prompt_spread_target"] == pytest.approx(0.7)
    assert learned.details["ttft_p90_model_seconds"] > 0.05
    assert learned.details["prefill_floor"] < full.details["prefill_floor"]
    assert "PromptSpreadFromMeasuredTtft" not in full.reasons
    assert "prompt_spread_factor" not in full.details


def test_a_ttft_the_model_explains_keeps_the_full_spread() -> None:
    last = run(0.59)[-1]  # at the pool of 10 the model's p90 is below this: nothing to learn
    assert "prompt_spread_factor" not in last.details
    assert last.details["prompt_spread_target"] == 1.0


def test_a_ttft_miss_puts_the_full_spread_back_at_once() -> None:
    made = policy()
    for time_s in np.arange(0, 3600, 15.0):
        made.decide(steady(time_s, 0.05), Limits())
    missed = made.decide(steady(3600, 0.7), Limits())
    assert "PromptSpreadReset" in missed.reasons
    assert "prompt_spread_factor" not in missed.details


@pytest.mark.parametrize(
    ("prefill", "changes"),
    [
        (PoolState(ready=10, starting=1), {}),  # the window's TTFT is not this pool's alone
        (PoolState(ready=10, draining=1), {}),
        (10, {"decode_waiting": 3.0}),  # requests wait on decode: its back-pressure, not prefill's
        (10, {"decode_kv_usage": 0.99}),
        (10, {"ttft_p90_s": None}),  # no measurement
        (10, {"p90_input_tokens": None}),
    ],
)
def test_windows_whose_ttft_is_not_prefills_to_explain_teach_nothing(
    prefill: int | PoolState, changes: dict[str, float | None]
) -> None:
    made = policy()
    for time_s in np.arange(0, 3600, 15.0):
        decision = made.decide(steady(time_s, 0.05, prefill, **changes), Limits())
    assert "prompt_spread_target" not in decision.details
    assert "prompt_spread_factor" not in decision.details


def test_a_pool_that_changed_within_the_window_teaches_nothing_yet() -> None:
    made = policy()
    first = made.decide(steady(0, 0.05), Limits())
    assert "prompt_spread_target" not in first.details
    inside = made.decide(steady(15, 0.05), Limits())  # the window is 30 s: still the pool's first
    assert "prompt_spread_target" not in inside.details
    after = made.decide(steady(30, 0.05), Limits())
    assert "prompt_spread_target" in after.details


@pytest.mark.parametrize("floor", [0, -0.5, 1.5])
def test_bad_floors_are_rejected(floor: float) -> None:
    with pytest.raises(ValueError, match="spread_floor"):
        policy(spread_floor=floor)
