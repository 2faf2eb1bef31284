"""status.autoscaler rendering, and the merge patch that replaces the previous one whole."""

from __future__ import annotations

from typing import Any

import pytest

from xpyd_controller.control.status import DecisionRecord, render_autoscaler, replacing_patch
from xpyd_controller.policy.types import Decision, Observation, PoolState

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
