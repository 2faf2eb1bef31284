"""The per-pool HPA-style baseline: its ratio rule, tolerance, missing data and independence."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from tests.unit.policy_context import CONTEXT

from xpyd_controller.policy.context import PolicyConfigError
from xpyd_controller.policy.registry import make_policy
from xpyd_controller.policy.threshold import ThresholdConfig, ThresholdPolicy
from xpyd_controller.policy.types import Limits, Observation, PoolState, Recommended

BASE = Observation(
    time_s=0.0,
    window_s=30.0,
    prefill=PoolState(ready=4),
    decode=PoolState(ready=4),
    arrival_rate=5.0,
    mean_input_tokens=2000.0,
    mean_output_tokens=200.0,
    prefill_queue=8.0,  # 2 per instance: exactly on target
    decode_kv_usage=0.7,  # exactly on target
    decode_running=40.0,
)


def observe(**changes: Any) -> Observation:
    return dataclasses.replace(BASE, **changes)


@pytest.mark.parametrize(
    ("observation", "expected", "reason"),
    [
        (BASE, (4, 4), "PrefillWithinTolerance"),
        (observe(prefill_queue=8.7), (4, 4), "PrefillWithinTolerance"),  # +9 %: inside ±10 %
        (observe(prefill_queue=16.0), (8, 4), "PrefillAboveTarget"),
        (observe(decode_kv_usage=0.875), (4, 5), "DecodeAboveTarget"),
        (observe(prefill_queue=None), (4, 4), "PrefillMetricMissing"),
        (observe(decode_kv_usage=None), (4, 4), "DecodeMetricMissing"),
        # zero traffic with no samples is zero demand: both pools scale in
        (observe(arrival_rate=0.0, prefill_queue=None, decode_kv_usage=None), (1, 1), "PrefillBelowTarget"),
        (observe(prefill=PoolState(ready=0, starting=1), prefill_queue=3.0), (2, 4), "PrefillAboveTarget"),
    ],
)
def test_first_decision(observation: Observation, expected: tuple[int, int], reason: str) -> None:
    policy = ThresholdPolicy(ThresholdConfig(down_window_s=0.0))
    decision = policy.decide(observation, Limits())
    assert (decision.prefill, decision.decode) == expected
    assert reason in decision.reasons
    assert decision.allow_conversion is False


def test_missing_data_never_scales_down_even_after_a_low_reading() -> None:
    policy = ThresholdPolicy(ThresholdConfig(down_window_s=0.0))
    low = policy.decide(observe(prefill_queue=0.0), Limits())
    assert low.prefill == 1
    held = policy.decide(observe(time_s=15.0, prefill=PoolState(ready=1), prefill_queue=None), Limits())
    assert held.prefill == 1 and "PrefillMetricMissing" in held.reasons


def test_scale_down_waits_for_the_down_window() -> None:
    policy = ThresholdPolicy(ThresholdConfig())
    policy.resume([Recommended(-1.0, 4, 4)])  # the window remembers 4 + 4 recommended at -1 s
    decisions = [
        policy.decide(observe(time_s=t, prefill_queue=0.0), Limits()).prefill for t in (0, 150, 299, 300)
    ]
    assert decisions == [4, 4, 4, 1]


def test_pools_scale_independently_and_can_break_the_budget_balance() -> None:
    policy = ThresholdPolicy(ThresholdConfig())
    decision = policy.decide(observe(prefill_queue=40.0, decode_kv_usage=1.0), Limits(gpu_budget=12))
    assert decision.prefill is not None and decision.decode is not None
    assert decision.prefill + decision.decode <= 12
    assert "LimitedByGpuBudget" in decision.reasons
    assert decision.binding == "gpu_budget"


def test_running_target_replaces_kv_target() -> None:
    policy = ThresholdPolicy(ThresholdConfig(decode_running_target=5.0))
    decision = policy.decide(observe(decode_running=40.0, decode_kv_usage=None), Limits())
    assert decision.decode == 8
    assert decision.details["decode_usage_ratio"] == 2.0


def test_factory_applies_knobs_and_rejects_unknown_ones() -> None:
    context = dataclasses.replace(CONTEXT, knobs={"prefill_queue_target": 4, "down_window_s": 60})
    policy = make_policy("threshold", context)
    assert isinstance(policy, ThresholdPolicy)
    assert policy.config.prefill_queue_target == 4.0
    with pytest.raises(
        PolicyConfigError, match=r"policy 'threshold': queue = 1: unknown knob; known: .*tolerance"
    ):
        make_policy("threshold", dataclasses.replace(context, knobs={"queue": 1}))
    with pytest.raises(PolicyConfigError, match=r"policy 'threshold': tolerance = 1\.5: must be in"):
        make_policy("threshold", dataclasses.replace(context, knobs={"tolerance": 1.5}))
    with pytest.raises(PolicyConfigError, match=r"up_instances = 1\.5: must be a whole number"):
        make_policy("threshold", dataclasses.replace(context, knobs={"up_instances": 1.5}))
