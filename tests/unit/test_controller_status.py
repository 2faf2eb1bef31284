"""status.autoscaler rendering, and the merge patch that replaces the previous one whole."""

from __future__ import annotations

from typing import Any

import pytest

from xpyd_controller.control.status import (
    DecisionRecord,
    kept_recommendations,
    render_autoscaler,
    replacing_patch,
)
from xpyd_controller.policy.types import Decision, Observation, PoolState, Recommended

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


NOW = 1_700_000_000.0  # 2023-11-14T22:13:20Z


def kept(time: object = "2023-11-14T22:12:20Z", prefill: object = 3, decode: object = 4) -> dict[str, Any]:
    return {"time": time, "prefill": prefill, "decode": decode}


def test_the_stabilisation_window_round_trips_through_status() -> None:
    window = (Recommended(NOW - 60, 3, 4), Recommended(NOW, 2, 5))
    status = render_autoscaler(record(recent=window))
    assert status["recentRecommendations"] == [kept(), kept("2023-11-14T22:13:20Z", 2, 5)]
    assert kept_recommendations(status, NOW + 10, 300.0) == list(window)


@pytest.mark.parametrize(
    ("entries", "expected"),
    [
        ([kept("2023-11-14T22:13:20Z", 2, 5), kept()], [(NOW - 60, 3, 4), (NOW, 2, 5)]),  # sorted
        ([kept("2023-11-14T22:00:00Z"), kept()], [(NOW - 60, 3, 4)]),  # older than the window: dropped
        ([kept("2023-11-14T22:00:00Z")], None),  # all of it older: the window is lost
        ([], None),
        ("3,4", None),
        ([kept("2023-11-14T22:20:00Z")], None),  # ahead of now by more than clock skew
        ([kept("yesterday")], None),
        ([kept(prefill=-1)], None),
        ([kept(decode=2.5)], None),
        ([kept(prefill=True)], None),
        ([kept(), "3"], None),  # one malformed entry discards the lot
        ([kept()] * 1001, None),
    ],
)
def test_a_kept_window_is_used_only_when_it_is_whole_and_recent(
    entries: object, expected: list[tuple[float, int, int]] | None
) -> None:
    found = kept_recommendations({"recentRecommendations": entries}, NOW, 300.0)
    assert found == (expected if expected is None else [Recommended(*e) for e in expected])


def test_no_autoscaler_status_keeps_no_window() -> None:
    assert kept_recommendations(None, NOW, 300.0) is None
    assert kept_recommendations({"lastDecisionTime": "2023-11-14T22:13:20Z"}, NOW, 300.0) is None
