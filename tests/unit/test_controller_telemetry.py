"""The controller's own metrics: what one decision adds to its registry, and what forgetting removes."""

from __future__ import annotations

from xpyd_api.models import parse_pdd
from xpyd_controller.adapters.telemetry import PrometheusTelemetry
from xpyd_controller.control.status import DecisionRecord
from xpyd_controller.policy.types import Decision, Observation, PoolState

PDD = parse_pdd(
    {
        "metadata": {"name": "web", "namespace": "ns", "uid": "u"},
        "spec": {"model": {"name": "m"}, "engine": {"image": "i"}, "router": {"image": "r"}},
    }
)
LABELS = {"namespace": "ns", "pdd": "web"}


def record(binding: str, details: dict[str, float], missing: list[str]) -> DecisionRecord:
    observation = Observation(0.0, 60.0, PoolState(1), PoolState(1), 1.0, 100.0, 10.0)
    return DecisionRecord(
        observation, Decision(3, 4, binding, (), details), (3, 4), missing, True, "Auto", "xpyd", 1
    )


def test_decisions_desired_predictions_and_missing_data() -> None:
    telemetry = PrometheusTelemetry()
    value = telemetry.registry.get_sample_value
    predictions = {"predicted_ttft_seconds": 0.4, "decode_session_seconds": 20.0}
    telemetry.record_decision(PDD, record("prefill_ttft", predictions, ["tpot_p90"]))
    telemetry.record_decision(PDD, record("missing_data", {}, ["tpot_p90", "ttft_p90"]))
    assert value("xpyd_controller_desired_replicas", {**LABELS, "role": "prefill"}) == 3
    assert value("xpyd_controller_desired_replicas", {**LABELS, "role": "decode"}) == 4
    assert value("xpyd_controller_decisions_total", {**LABELS, "binding": "prefill_ttft"}) == 1
    assert value("xpyd_controller_decisions_total", {**LABELS, "binding": "missing_data"}) == 1
    assert value("xpyd_controller_missing_data_total", {**LABELS, "signal": "tpot_p90"}) == 2
    assert value("xpyd_controller_missing_data_total", {**LABELS, "signal": "ttft_p90"}) == 1
    assert value("xpyd_controller_predicted_ttft_seconds", LABELS) == 0.4
    assert value("xpyd_controller_predicted_tpot_seconds", LABELS) is None  # the policy predicted none
    assert value("xpyd_controller_decode_session_seconds", LABELS) == 20.0

    telemetry.forget("ns", "web")
    assert value("xpyd_controller_desired_replicas", {**LABELS, "role": "prefill"}) is None
    assert value("xpyd_controller_predicted_ttft_seconds", LABELS) is None
    assert value("xpyd_controller_decode_session_seconds", LABELS) is None
    assert value("xpyd_controller_decisions_total", {**LABELS, "binding": "prefill_ttft"}) == 1


def test_loop_duration_and_leader() -> None:
    telemetry = PrometheusTelemetry()
    telemetry.record_pass(0.25)
    telemetry.set_leader(True)
    assert telemetry.registry.get_sample_value("xpyd_controller_loop_duration_seconds_count") == 1
    assert telemetry.registry.get_sample_value("xpyd_controller_leader") == 1
