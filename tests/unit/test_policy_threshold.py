"""The per-pool HPA-style baseline: its ratio rule, tolerance, missing data and independence."""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

import pytest
from tests.unit.policy_context import CONTEXT

from xpyd_controller.policy.context import PolicyConfigError
from xpyd_controller.policy.registry import make_policy
from xpyd_controller.policy.threshold import ThresholdConfig, ThresholdPolicy
from xpyd_controller.policy.types import Limits, Observation, PoolState

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
    before = ThresholdPolicy(ThresholdConfig())
    before.decide(observe(time_s=-1.0), Limits())  # the window remembers 4 + 4 recommended at -1 s
    policy = ThresholdPolicy(ThresholdConfig())
    assert policy.resume(before.state(), 0.0) == ""
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


def _decided() -> ThresholdPolicy:
    """A policy whose windows, found counts and rate limits all hold something (8 + 4 after a rise)."""
    policy = ThresholdPolicy(ThresholdConfig())
    for time_s, queue in ((0.0, 8.0), (15.0, 40.0), (30.0, 0.0)):
        policy.decide(observe(time_s=time_s, prefill_queue=queue), Limits())
    return policy


NOW = 40.0
GONE = object()  # the part is missing
LATER = [  # a falling load on the 8 + 4 the policy grew to: lost windows hold them for a down window
    observe(time_s=t, prefill=PoolState(ready=8), prefill_queue=0.0, decode_kv_usage=0.1)
    for t in (NOW, NOW + 299, NOW + 300)
]


def _hostile(path: tuple[str | int, ...], value: object) -> object:
    """The kept state (through JSON, as status keeps it) with `value` at `path` (GONE: removed)."""
    state: Any = json.loads(json.dumps(_decided().state()))
    if not path:
        return value
    parent = state
    for key in path[:-1]:
        parent = parent[key]
    if value is GONE:
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    return state


WINDOW = ("layers", "prefill", "window")
HOSTILE = [  # (path, value, how the reason starts: the path named and the value shown)
    ((), "threshold", "state = 'threshold': must be an object"),
    ((), [1, 2], "state = [1, 2]: must be an object"),
    (("policy",), "xpyd", "policy = 'xpyd': must be 'threshold'"),
    (("policy",), GONE, "policy = None"),
    (("version",), 2, "version = 2: must be 1"),
    (("version",), "1", "version = '1'"),
    (("timeS",), NOW + 61, "timeS = 101.0: must be in [-inf, 100]"),  # beyond a minute of clock skew
    (("timeS",), math.nan, "timeS = nan: must be a finite number"),
    (("timeS",), "30", "timeS = '30'"),
    (("timeS",), True, "timeS = True"),
    (("layers",), GONE, "layers = None: must be an object"),
    (("layers",), [], "layers = []: must be an object"),
    (("layers", "decode"), GONE, "decode = None"),
    ((*WINDOW[:2], "rate"), GONE, "rate = None"),
    (WINDOW, "window", "window = 'window'"),
    (("layers", "timeS"), math.inf, "timeS = inf"),
    ((*WINDOW, "history"), "[[0, 4]]", "history = '[[0, 4]]': must be a list"),
    ((*WINDOW, "history"), [[0, 4]] * 1001, "history = [[0, 4], [0, 4]"),  # oversized
    ((*WINDOW, "history", 1), [15], "history[1] = [15]: must be a list of 2 numbers"),
    ((*WINDOW, "history", 1, 0), math.nan, "history[1] = nan: must be a finite number"),
    ((*WINDOW, "history", 1, 0), "15", "history[1] = '15'"),
    ((*WINDOW, "history", 1, 1), "20", "history[1] = '20': must be a whole number"),
    ((*WINDOW, "history", 1, 1), True, "history[1] = True"),
    ((*WINDOW, "history", 1, 1), -1, "history[1] = -1"),
    ((*WINDOW, "history", 1, 1), 2.5, "history[1] = 2.5"),
    ((*WINDOW, "history", 1, 1), 10**7, "history[1] = 10000000"),
    ((*WINDOW, "found", 0, 0), -math.inf, "found[0] = -inf"),
    ((*WINDOW, "found"), None, "found = None"),
    ((*WINDOW, "restarted"), 0, "restarted = 0: must be true or false"),
    ((*WINDOW, "settled"), GONE, "settled = None"),
    (("layers", "decode", "rate", "history", 0, 1), -4, "history[0] = -4"),
    (("layers", "decode", "rate", "history"), {"0": 4}, "history = {'0': 4}"),
]


@pytest.mark.parametrize(("path", "value", "named"), HOSTILE, ids=[case[2] for case in HOSTILE])
def test_a_kept_state_it_cannot_trust_is_ignored_by_name_and_the_policy_acts_as_if_it_were_lost(
    path: tuple[str | int, ...], value: object, named: str
) -> None:
    hostile, lost = ThresholdPolicy(ThresholdConfig()), ThresholdPolicy(ThresholdConfig())
    reason = hostile.resume(_hostile(path, value), NOW)  # type: ignore[arg-type]
    assert reason.startswith(named), reason
    assert lost.resume(None, NOW) == ""
    assert hostile.state() == lost.state()  # nothing of it was applied
    decisions = [hostile.decide(observation, Limits()) for observation in LATER]
    assert decisions == [lost.decide(observation, Limits()) for observation in LATER]
    held, still, shrunk = decisions
    assert (held.prefill, held.decode) == (8, 4) == (still.prefill, still.decode)
    assert "PrefillScaleDownHeldAfterRestart" in held.reasons
    assert (shrunk.prefill, shrunk.decode) == (1, 1)


def test_a_kept_state_resumes_exactly_and_a_little_clock_skew_is_no_reason_to_drop_it() -> None:
    before = _decided()
    kept = json.loads(json.dumps(before.state()))
    after = ThresholdPolicy(ThresholdConfig())
    assert after.resume(kept, 30.0 - 59) == ""  # this controller's clock is 59 s behind the last one's
    assert after.state() == before.state()
    for observation in LATER:
        assert after.decide(observation, Limits()) == before.decide(observation, Limits())
