"""status.autoscaler rendering, and the merge patch that replaces the previous one whole."""

from __future__ import annotations

import dataclasses
import json
import logging
import math
from collections.abc import Mapping
from typing import Any

import pytest

from xpyd_controller.control.status import (
    MAX_STATE_BYTES,
    DecisionRecord,
    policy_state,
    render_autoscaler,
    replacing_patch,
)
from xpyd_controller.policy.threshold import ThresholdConfig, ThresholdPolicy
from xpyd_controller.policy.types import Decision, Limits, Observation, PoolState

OBS = Observation(
    time_s=1_700_000_000.0,
    window_s=60.0,
    prefill=PoolState(2, 1, 0),
    decode=PoolState(3, 0, 1),
    arrival_rate=4.0,
    mean_input_tokens=2000.0,
    mean_output_tokens=None,
    ttft_p90_s=0.41234567,
)
DECISION = Decision(
    3,
    4,
    binding="prefill_ttft+decode_kv_capacity",
    reasons=("PrefillBelowModelFloor", "DecodeWithinTolerance"),
    details={"predicted_ttft_seconds": 0.35, "predicted_tpot_seconds": 0.04, "concurrency": 31.5},
)


def record(**changes: Any) -> DecisionRecord:
    base: dict[str, Any] = dict(
        observation=OBS,
        decision=DECISION,
        desired=(3, 4),
        missing=["output_tokens_rate"],
        applied=True,
        mode="Auto",
        policy="xpyd",
        generation=7,
    )
    return DecisionRecord(**{**base, **changes})


def test_render() -> None:
    status = render_autoscaler(record())
    assert status["observedGeneration"] == 7
    assert status["lastDecisionTime"] == "2023-11-14T22:13:20Z"
    assert (status["mode"], status["policy"], status["applied"]) == ("Auto", "xpyd", True)
    assert status["desired"] == {"prefill": 3, "decode": 4}
    assert status["binding"] == "prefill_ttft+decode_kv_capacity"
    assert status["reasons"] == ["PrefillBelowModelFloor", "DecodeWithinTolerance"]
    assert status["predicted"] == {"ttftSeconds": 0.35, "tpotSeconds": 0.04}
    assert status["missingData"] == ["output_tokens_rate"]
    assert status["message"] is None
    inputs = status["inputs"]
    assert inputs["arrivalRate"] == 4.0 and inputs["meanOutputTokens"] is None
    assert inputs["ttftP90Seconds"] == 0.412346
    assert inputs["prefill"] == {"ready": 2, "starting": 1, "draining": 0}
    assert inputs["decode"] == {"ready": 3, "starting": 0, "draining": 1}
    assert status["details"] == {
        "concurrency": 31.5,
        "predicted_tpot_seconds": 0.04,
        "predicted_ttft_seconds": 0.35,
    }


def test_held_decision_says_why() -> None:
    held = Decision(None, None, binding="missing_data", reasons=("NoMetricsHold",))
    status = render_autoscaler(
        record(decision=held, note="Prometheus at http://p unreachable", applied=False)
    )
    assert status["binding"] == "missing_data"
    assert status["message"] == "Prometheus at http://p unreachable"
    assert status["predicted"] == {"ttftSeconds": None, "tpotSeconds": None}


@pytest.mark.parametrize(
    ("current", "new", "patch"),
    [
        (None, {"a": 1}, {"a": 1}),
        ({"a": 1, "b": 2}, {"a": 3}, {"a": 3, "b": None}),
        ({"d": {"x": 1, "y": 2}}, {"d": {"x": 5}}, {"d": {"x": 5, "y": None}}),
        ({"d": 1}, {"d": {"x": 5}}, {"d": {"x": 5}}),
        ({"d": {"x": 1}}, {"d": [1]}, {"d": [1]}),
    ],
)
def test_replacing_patch(current: dict[str, Any] | None, new: dict[str, Any], patch: dict[str, Any]) -> None:
    assert replacing_patch(current, new) == patch


def _merged(target: Any, patch: Mapping[str, Any]) -> Any:
    """RFC 7386: what the API server makes of `target` and a merge patch (null removes a key)."""
    result = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        elif isinstance(value, Mapping):
            result[key] = _merged(result.get(key), value)
        else:
            result[key] = value
    return result


def _decided(steps: list[tuple[float, float]]) -> ThresholdPolicy:
    policy = ThresholdPolicy(ThresholdConfig())
    for time_s, queue in steps:
        observation = dataclasses.replace(OBS, time_s=time_s, prefill_queue=queue, decode_kv_usage=0.7)
        policy.decide(observation, Limits())
    return policy


def test_the_policy_state_round_trips_through_status() -> None:
    """Written whole on every decision and replacing the last one's; read back (through JSON and the
    merge patch, whose nulls remove keys) it resumes a new policy to exactly the same state."""
    t = OBS.time_s
    older = _decided([(t - 300, 8.0)])
    newer = _decided([(t - 30, 0.0), (t - 15, 9.0), (t, 40.0)])
    stored: dict[str, Any] = {}
    for policy in (older, newer):
        status = render_autoscaler(record(policy_state=policy_state(policy)))
        stored = _merged(stored, json.loads(json.dumps(replacing_patch(stored, status), allow_nan=False)))
    kept = stored["policyState"]
    assert (kept["policy"], kept["version"], kept["timeS"]) == ("threshold", 1, t)
    assert kept["layers"]["prefill"]["window"]["history"] == [[t - 30, 0], [t - 15, 5], [t, 20]]
    resumed = ThresholdPolicy(ThresholdConfig())
    assert resumed.resume(kept, t + 15) == ""
    assert resumed.state() == newer.state()  # nothing of the older state survived the replacement


def test_a_policy_without_state_keeps_none() -> None:
    assert policy_state(object()) is None
    assert render_autoscaler(record())["policyState"] is None


class _Stated:
    """A Resumable whose state is whatever the test says."""

    def __init__(self, state: Any) -> None:
        self._state = state

    def state(self) -> Any:
        if isinstance(self._state, Exception):
            raise self._state
        return self._state

    def resume(self, state: object, now_s: float) -> str:
        return ""


@pytest.mark.parametrize(
    ("state", "logged"),
    [
        ({"policy": "x", "rows": ["1234567"] * (MAX_STATE_BYTES // 10)}, "bytes of JSON, above 65536"),
        ({"policy": "x", "level": math.nan}, "not JSON"),
        ({"policy": "x", "when": object()}, "not JSON"),
        (["policy", "x"], "no JSON object"),
        (RuntimeError("a bug"), "not JSON"),
    ],
)
def test_a_state_too_large_or_not_json_is_not_kept_and_said_in_the_log(
    state: object, logged: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        assert policy_state(_Stated(state), "ns/web") is None
    assert any(r.getMessage().startswith("ns/web: ") and logged in r.getMessage() for r in caplog.records)


def test_a_kept_state_is_a_json_copy() -> None:
    inner = [(1.0, 2)]
    kept = policy_state(_Stated({"policy": "x", "rows": inner, "none": None}))
    assert kept == {"policy": "x", "rows": [[1.0, 2]], "none": None}
    assert kept is not None and kept["rows"] is not inner
