"""The Dynamo-style throughput planner baseline: interval, mean forecast, profile, and its known gaps."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest
from tests.unit.policy_context import CONTEXT

from xpyd_controller.model.roofline import prefill_seconds
from xpyd_controller.policy.context import PolicyConfigError
from xpyd_controller.policy.registry import make_policy
from xpyd_controller.policy.throughput_planner import EngineProfile, ThroughputPlanner
from xpyd_controller.policy.types import Limits, Observation, PoolState


def observe(time_s: float, **changes: Any) -> Observation:
    fields: dict[str, Any] = {
        "arrival_rate": 20.0,
        "mean_input_tokens": 6000.0,
        "mean_output_tokens": 300.0,
        "prefill": PoolState(ready=2),
        "decode": PoolState(ready=2),
    }
    fields.update(changes)
    return Observation(time_s=time_s, window_s=15.0, **fields)


def planner(**knobs: float) -> ThroughputPlanner:
    made = make_policy("throughput-planner", dataclasses.replace(CONTEXT, knobs=knobs))
    assert isinstance(made, ThroughputPlanner)
    return made


def test_profile_matches_the_roofline_and_shrinks_decode_with_context() -> None:
    profile = EngineProfile.from_model(CONTEXT)
    expected = 6000 / float(prefill_seconds(CONTEXT.model, CONTEXT.gpu, 6000.0))
    assert profile.prefill_at(6000.0) == pytest.approx(expected, rel=1e-3)
    assert profile.decode_at(500.0) > profile.decode_at(6000.0) > profile.decode_at(50_000.0) > 0


def test_adjusts_only_every_interval_on_the_mean_of_the_interval() -> None:
    dynamo = planner()
    held = [
        dynamo.decide(observe(t, arrival_rate=rate), Limits())
        for t, rate in ((0, 10.0), (60, 20.0), (120, 30.0))
    ]
    assert all(d.prefill is None and d.reasons == ("BetweenAdjustments",) for d in held)
    adjusted = dynamo.decide(observe(180, arrival_rate=40.0), Limits())
    assert adjusted.details["forecast_rate"] == pytest.approx(25.0)  # mean of 10, 20, 30, 40
    profile = dynamo.profile
    assert adjusted.prefill == math.ceil(25.0 * 6000 / profile.prefill_at(6000.0))
    assert adjusted.decode == math.ceil(25.0 * 300 / profile.decode_at(6150.0))
    assert adjusted.allow_conversion is False
    assert dynamo.decide(observe(200), Limits()).prefill is None


def test_forecast_averages_several_intervals_when_asked() -> None:
    dynamo = planner(forecast_intervals=2, adjustment_interval_s=60)
    dynamo.decide(observe(0, arrival_rate=10.0), Limits())
    dynamo.decide(observe(60, arrival_rate=10.0), Limits())
    dynamo.decide(observe(90, arrival_rate=30.0), Limits())
    decision = dynamo.decide(observe(120, arrival_rate=30.0), Limits())
    assert decision.details["forecast_rate"] == pytest.approx(20.0)


def test_zero_traffic_skips_the_tick_like_dynamo_does() -> None:
    dynamo = planner()
    dynamo.decide(observe(0, arrival_rate=0.0, mean_input_tokens=None), Limits())
    decision = dynamo.decide(observe(180, arrival_rate=0.0, mean_input_tokens=None), Limits())
    assert (decision.prefill, decision.decode, decision.reasons) == (None, None, ("NoValidMetrics",))


def test_waits_while_scaling_is_in_progress() -> None:
    dynamo = planner()
    dynamo.decide(observe(0), Limits())
    decision = dynamo.decide(observe(180, decode=PoolState(ready=1, starting=1)), Limits())
    assert decision.reasons == ("ScalingInProgress",)


def test_budget_and_limits_apply() -> None:
    dynamo = planner()
    dynamo.decide(observe(0, arrival_rate=100.0), Limits(gpu_budget=6))
    decision = dynamo.decide(observe(180, arrival_rate=100.0), Limits(gpu_budget=6))
    assert decision.prefill is not None and decision.decode is not None
    assert decision.prefill + decision.decode <= 6
    assert decision.binding == "gpu_budget"


@pytest.mark.parametrize(
    ("knobs", "message"),
    [
        ({"adjustment_interval_s": 0}, "adjustment_interval_s = 0.0: must be > 0"),
        ({"forecast_intervals": 0}, "forecast_intervals = 0: must be >= 1"),
    ],
)
def test_bad_knobs(knobs: dict[str, float], message: str) -> None:
    with pytest.raises(PolicyConfigError, match=message):
        planner(**knobs)
