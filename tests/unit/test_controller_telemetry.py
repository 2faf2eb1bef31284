"""The controller's own metrics: what one decision adds to its registry, and what forgetting removes."""

from __future__ import annotations

import urllib.request
from typing import Any

import pytest
from tests.integration.controller import read_metrics

from xpyd_api.models import parse_pdd
from xpyd_controller.adapters.k8s import MetricsAccess
from xpyd_controller.adapters.telemetry import PrometheusTelemetry, tls_context
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


def test_metrics_are_served_over_tls_only_to_what_authorize_accepts() -> None:
    answers = {"Bearer reader": 200, "Bearer stranger": 403}
    seen: list[str | None] = []

    def authorize(header: str | None) -> int:
        seen.append(header)
        return answers.get(header or "", 401)

    telemetry = PrometheusTelemetry()
    telemetry.set_leader(True)
    server = telemetry.serve(0, "127.0.0.1", authorize, tls_context(None, "127.0.0.1"))
    url = f"https://127.0.0.1:{server.server_address[1]}/metrics"
    try:
        assert read_metrics(url) == (401, "")
        assert read_metrics(url, "stranger") == (403, "")
        status, text = read_metrics(url, "reader")
        assert status == 200 and "xpyd_controller_leader 1.0" in text
        assert read_metrics(url.replace("/metrics", "/other"), "reader")[0] == 404
        with pytest.raises(OSError):  # no plain HTTP on the TLS port
            urllib.request.urlopen(url.replace("https", "http"), timeout=5)
    finally:
        server.shutdown()
    assert seen == [None, "Bearer stranger", "Bearer reader"]


class Reviews:
    """The TokenReview and SubjectAccessReview answers of a cluster with two known tokens."""

    def __init__(self) -> None:
        self.calls = 0

    def review_token(self, token: str) -> dict[str, Any] | None:
        self.calls += 1
        return {
            "reader": {"username": "system:serviceaccount:mon:prometheus"},
            "other": {"username": "x"},
        }.get(token)

    def may_get(self, user: dict[str, Any], path: str) -> bool:
        return path == "/metrics" and user["username"].endswith(":prometheus")


def test_metrics_access_reviews_each_token_and_remembers_the_answer_for_a_while() -> None:
    now = [0.0]
    reviews = Reviews()
    access = MetricsAccess(reviews, clock=lambda: now[0])
    assert access.status(None) == 401 and access.status("Basic dTpw") == 401 and reviews.calls == 0
    assert [access.status(f"Bearer {t}") for t in ("reader", "other", "forged")] == [200, 403, 401]
    assert access.status("Bearer reader") == 200 and reviews.calls == 3  # remembered
    now[0] = 11.0
    assert access.status("Bearer reader") == 200 and reviews.calls == 4  # reviewed again
