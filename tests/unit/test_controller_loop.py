"""The decision loop against in-memory fakes of its ports: what it writes, when, and what it holds."""

from __future__ import annotations

import dataclasses
import json
import math
import threading
from collections.abc import Callable, Mapping
from typing import Any

import pytest

from xpyd_api.models import PDDeployment
from xpyd_api.names import LABEL_ROLE, LABEL_SERVING
from xpyd_controller.control import loop as loop_module
from xpyd_controller.control.loop import Controller, Settings
from xpyd_controller.control.promql import POLICY_SIGNALS, Signal
from xpyd_controller.control.status import DecisionRecord
from xpyd_controller.model.calibration import MIN_SAMPLES
from xpyd_controller.model.presets import GPU_PRESETS, MODEL_PRESETS
from xpyd_controller.model.roofline import decode_step_seconds, prefill_seconds
from xpyd_controller.model.specs import GpuSpec
from xpyd_controller.policy.threshold import ThresholdConfig, ThresholdPolicy
from xpyd_controller.policy.types import Decision

BUSY = {  # 20 req/s of 2000-token prompts and 1500-token outputs: more than one instance per role
    Signal.ARRIVAL_RATE: 20.0,
    Signal.PREFILL_FINISHED_RATE: 20.0,
    Signal.INPUT_TOKENS_RATE: 40_000.0,
    Signal.INPUT_TOKENS_P90: 3000.0,
    Signal.OUTPUT_REQUESTS_RATE: 20.0,
    Signal.OUTPUT_TOKENS_RATE: 30_000.0,
    Signal.OUTPUT_TOKENS_P90: 2000.0,
    Signal.PREFIX_QUERIES_RATE: 40_000.0,
    Signal.PREFIX_HITS_RATE: 0.0,
    Signal.PREFILL_QUEUE: 3.0,
    Signal.DECODE_RUNNING: 100.0,
    Signal.DECODE_WAITING: 0.0,
    Signal.DECODE_KV_USAGE: 0.6,
    Signal.TTFT_P90: 0.3,
    Signal.TPOT_P90: 0.03,
    Signal.PREFILL_TTFT_MEAN: 0.2,
    Signal.TPOT_MEAN: 0.02,
}
IDLE = {signal: 0.0 for signal in Signal} | {
    signal: None
    for signal in (
        Signal.INPUT_TOKENS_P90,
        Signal.OUTPUT_TOKENS_P90,
        Signal.TTFT_P90,
        Signal.TPOT_P90,
        Signal.TPOT_MEAN,
    )
}


def pdd(
    name: str = "web", mode: str = "Auto", prefill: int = 1, decode: int = 1, **extra: Any
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "model": {"name": "m", "preset": "llama-3.1-8b"},
        "engine": {"image": "vllm:1"},
        "router": {"image": "r:1"},
        "prefill": {"replicas": prefill, "minReplicas": 1, "maxReplicas": 16},
        "decode": {"replicas": decode, "minReplicas": 1, "maxReplicas": 16},
        "autoscaling": {"mode": mode, "intervalSeconds": 10, "prometheus": {"url": "http://prom:9090"}},
    }
    for key, value in extra.items():
        spec[key] = {**spec.get(key, {}), **value}
    return {
        "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}", "generation": 3},
        "spec": spec,
    }


def ready_pod(role: str) -> dict[str, Any]:
    return {
        "metadata": {"name": f"p-{role}", "labels": {LABEL_ROLE: role, LABEL_SERVING: "true"}},
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
    }


class FakeCluster:
    def __init__(self, *objects: dict[str, Any]) -> None:
        self.objects = {o["metadata"]["name"]: o for o in objects}
        self.replica_writes: list[tuple[str, int, int]] = []
        self.events: list[tuple[str, str, str, bool]] = []

    def list_pdds(self) -> list[dict[str, Any]]:
        return list(self.objects.values())

    def list_instances(self, namespace: str, pdd: str) -> list[dict[str, Any]]:
        spec = self.objects[pdd]["spec"]
        roles = ["prefill"] * spec["prefill"]["replicas"] + ["decode"] * spec["decode"]["replicas"]
        return [ready_pod(role) for role in roles]

    def patch_replicas(self, namespace: str, name: str, prefill: int, decode: int) -> None:
        self.replica_writes.append((name, prefill, decode))
        spec = self.objects[name]["spec"]
        spec["prefill"]["replicas"], spec["decode"]["replicas"] = prefill, decode

    def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        current = self.objects[name].setdefault("status", {})
        _merge(current, json.loads(json.dumps(status, allow_nan=False)))  # through JSON, as to the server

    def post_event(self, pdd: PDDeployment, reason: str, message: str, warning: bool = False) -> None:
        self.events.append((pdd.name, reason, message, warning))

    def autoscaler(self, name: str) -> dict[str, Any]:
        status: dict[str, Any] = self.objects[name]["status"]["autoscaler"]
        return status


def _merge(target: dict[str, Any], patch: Mapping[str, Any]) -> None:
    """RFC 7386 merge patch, as the API server applies it."""
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, Mapping):
            child = target.get(key)
            if not isinstance(child, dict):
                child = target[key] = {}
            _merge(child, value)
        else:
            target[key] = value


class FakeMetrics:
    def __init__(
        self, answers: Mapping[Signal, float | None], error: str | None = None, resolved: str = "10.0.0.9"
    ) -> None:
        self.answers = dict(answers)
        self.last_error = error
        self.asked: list[Mapping[Signal, str]] = []
        self.resolved = resolved  # where the URL's host name leads

    def addresses(self) -> list[str]:
        return [self.resolved]

    def query_all(self, queries: Mapping[Signal, str]) -> dict[Signal, float | None]:
        self.asked.append(queries)
        return {signal: self.answers.get(signal) for signal in queries}


class FakeTelemetry:
    def __init__(self) -> None:
        self.records: list[tuple[str, DecisionRecord]] = []

        self.forgotten: list[tuple[str, str]] = []

    def record_decision(self, pdd: PDDeployment, record: DecisionRecord) -> None:
        self.records.append((pdd.name, record))

    def forget(self, namespace: str, name: str) -> None:
        self.forgotten.append((namespace, name))


def controller(cluster: FakeCluster, metrics: FakeMetrics) -> tuple[Controller, FakeTelemetry]:
    telemetry = FakeTelemetry()
    urls: list[str] = []

    def source(url: str) -> FakeMetrics:
        urls.append(url)
        return metrics

    return Controller(cluster, source, telemetry, Settings(window_s=30)), telemetry


def test_auto_scales_up_writes_status_and_posts_an_event() -> None:
    cluster, metrics = FakeCluster(pdd()), FakeMetrics(BUSY)
    loop, telemetry = controller(cluster, metrics)
    [record] = loop.run_pass(1000.0)
    prefill, decode = record.desired
    assert prefill > 1 and decode > 1 and record.applied
    assert cluster.replica_writes == [("web", prefill, decode)]
    status = cluster.autoscaler("web")
    assert status["desired"] == {"prefill": prefill, "decode": decode}
    assert status["mode"] == "Auto" and status["policy"] == "xpyd" and status["applied"] is True
    assert status["binding"] == record.decision.binding != ""
    assert "PrefillBelowModelFloor" in status["reasons"] and "DecodeBelowModelFloor" in status["reasons"]
    assert status["predicted"]["ttftSeconds"] > 0 and status["predicted"]["tpotSeconds"] > 0
    assert status["inputs"]["arrivalRate"] == 20.0 and status["inputs"]["meanInputTokens"] == 2000.0
    assert status["inputs"]["prefill"] == {"ready": 1, "starting": 0, "draining": 0}
    assert status["missingData"] == [] and "message" not in status
    [event] = cluster.events
    assert event[1] == "ScaleDecision" and not event[3]
    assert event[2].startswith(f"setting prefill 1→{prefill}, decode 1→{decode}; binding ")
    assert "PrefillBelowModelFloor" in event[2]
    assert telemetry.records == [("web", record)]
    assert '{namespace="ns",pdd="web",role="prefill"}' in metrics.asked[0][Signal.ARRIVAL_RATE]


def test_advisory_writes_status_only() -> None:
    cluster = FakeCluster(pdd(mode="Advisory"))
    loop, _ = controller(cluster, FakeMetrics(BUSY))
    [record] = loop.run_pass(1000.0)
    assert not record.applied and cluster.replica_writes == []
    assert cluster.autoscaler("web")["desired"]["prefill"] > 1
    assert cluster.events[0][2].startswith("advising prefill 1→")


def test_off_is_ignored() -> None:
    cluster = FakeCluster(pdd(mode="Off"))
    loop, telemetry = controller(cluster, FakeMetrics(BUSY))
    assert loop.run_pass(1000.0) == []
    assert "status" not in cluster.objects["web"] and telemetry.records == []


def test_no_metrics_holds_and_says_why_once() -> None:
    cluster = FakeCluster(pdd(prefill=3, decode=5))
    loop, _ = controller(cluster, FakeMetrics({}, error="Prometheus at http://prom:9090 unreachable"))
    for now in (1000.0, 1010.0):
        [record] = loop.run_pass(now)
        assert record.desired == (3, 5) and not record.applied
    assert cluster.replica_writes == []
    status = cluster.autoscaler("web")
    assert status["binding"] == "missing_data" and status["reasons"] == ["NoMetricsHold"]
    assert status["message"] == "Prometheus at http://prom:9090 unreachable"
    assert status["missingData"] == [str(s) for s in POLICY_SIGNALS]
    assert [(e[1], e[3]) for e in cluster.events] == [("MetricsUnavailable", True)]


def test_an_unsupported_bearer_token_is_said_in_status_and_warned_once() -> None:
    prometheus = {"url": "http://prom:9090", "bearerTokenSecretRef": {"name": "prom-token", "key": "token"}}
    cluster = FakeCluster(pdd(autoscaling={"prometheus": prometheus}))
    loop, _ = controller(cluster, FakeMetrics(IDLE))
    for now in (1000.0, 1010.0):
        loop.run_pass(now)
    assert "bearerTokenSecretRef is set but not supported yet" in cluster.autoscaler("web")["message"]
    assert [(e[1], e[3]) for e in cluster.events] == [("UnsupportedField", True)]


def test_no_series_without_error_names_the_labels() -> None:
    cluster = FakeCluster(pdd())
    loop, _ = controller(cluster, FakeMetrics({}))
    loop.run_pass(1000.0)
    assert cluster.autoscaler("web")["message"] == "no engine series matched the PDDeployment's labels"


def test_a_failed_query_among_answers_is_named_in_the_message() -> None:
    cluster = FakeCluster(pdd())
    answers = {**BUSY, Signal.TTFT_P90: None}
    loop, _ = controller(
        cluster, FakeMetrics(answers, error="Prometheus at http://prom:9090 rejected a query")
    )
    [record] = loop.run_pass(1000.0)
    assert record.decision.binding != "missing_data" and record.applied
    status = cluster.autoscaler("web")
    assert status["missingData"] == ["ttft_p90"]
    assert status["message"] == "Prometheus at http://prom:9090 rejected a query"
    assert [e[1] for e in cluster.events] == ["ScaleDecision"]  # no MetricsUnavailable: it had data


def test_zero_traffic_is_data_not_missing() -> None:
    cluster = FakeCluster(pdd(prefill=2, decode=2, autoscaling={"scaleDownWindowSeconds": 0}))
    loop, _ = controller(cluster, FakeMetrics(IDLE))
    [record] = loop.run_pass(1000.0)
    assert record.decision.binding != "missing_data" and "ZeroTraffic" in record.decision.reasons
    assert record.desired[0] < 2 or record.desired[1] < 2  # scales down toward the minimum


def test_decides_at_each_pdds_interval_and_keeps_its_policy() -> None:
    cluster = FakeCluster(pdd())
    loop, _ = controller(cluster, FakeMetrics(BUSY))
    assert len(loop.run_pass(1000.0)) == 1
    policy = loop._tracked["uid-web"].policy
    assert loop.run_pass(1005.0) == []  # intervalSeconds is 10
    assert len(loop.run_pass(1010.0)) == 1
    assert loop._tracked["uid-web"].policy is policy  # replica writes do not reset its windows
    cluster.objects["web"]["spec"]["slo"] = {"ttftSeconds": 1.5}
    loop.run_pass(1020.0)
    assert loop._tracked["uid-web"].policy is not policy  # a new SLO is a new policy


def test_event_only_when_desired_changes() -> None:
    cluster = FakeCluster(pdd())
    loop, _ = controller(cluster, FakeMetrics(BUSY))
    loop.run_pass(1000.0)
    loop.run_pass(1010.0)
    assert [e[1] for e in cluster.events].count("ScaleDecision") == 1


def test_forgets_deleted_and_switched_off_objects() -> None:
    cluster = FakeCluster(pdd("a"), pdd("b"), pdd("c"))
    loop, telemetry = controller(cluster, FakeMetrics(BUSY))
    assert len(loop.run_pass(1000.0)) == 3
    del cluster.objects["a"]
    cluster.objects["c"]["spec"]["autoscaling"]["mode"] = "Off"
    loop.run_pass(1010.0)
    assert set(loop._tracked) == {"uid-b"}
    assert sorted(telemetry.forgotten) == [("ns", "a"), ("ns", "c")]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"model": {"preset": None}}, "spec.model.preset: not given, so spec.model.params"),
        ({"model": {"preset": "gpt-9"}}, "spec.model.preset = 'gpt-9': unknown preset"),
        ({"hardware": {"gpu": "tpu"}}, "spec.hardware.gpu = 'tpu': unknown preset"),
        (
            {"autoscaling": {"gpuBudget": 1}},
            "refused the spec: limits.gpu_budget = 1: must cover the minimum pools",
        ),
    ],
)
def test_unusable_spec_is_reported_in_status_and_one_warning(extra: dict[str, Any], message: str) -> None:
    cluster = FakeCluster(pdd(**extra))
    loop, _ = controller(cluster, FakeMetrics(BUSY))
    assert loop.run_pass(1000.0) == [] and loop.run_pass(1010.0) == []
    status = cluster.autoscaler("web")
    assert status["binding"] == "invalid_setup" and message in status["message"]
    assert [(e[1], e[3]) for e in cluster.events] == [("InvalidAutoscaling", True)]
    assert cluster.replica_writes == []


def test_an_invalid_spec_is_skipped_and_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    broken = pdd("bad")
    broken["spec"]["prefill"]["replicas"] = 99  # above maxReplicas: the operator reports InvalidSpec
    cluster = FakeCluster(broken, pdd("good"))
    loop, _ = controller(cluster, FakeMetrics(BUSY))
    assert [r.decision.binding != "" for r in loop.run_pass(1000.0)] == [True]
    loop.run_pass(1010.0)
    warnings = [r.getMessage() for r in caplog.records if "skipping" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].startswith("skipping ns/bad: ")
    assert "spec.prefill.replicas=99 must be within" in warnings[0]
    assert "status" not in cluster.objects["bad"]


def test_status_replaces_stale_fields() -> None:
    cluster = FakeCluster(pdd())
    cluster.objects["web"]["status"] = {"ready": 1, "autoscaler": {"oldField": 1, "inputs": {"gone": 2}}}
    loop, _ = controller(cluster, FakeMetrics(BUSY))
    loop.run_pass(1000.0)
    status = cluster.objects["web"]["status"]
    assert status["ready"] == 1  # the operator's fields are untouched
    assert "oldField" not in status["autoscaler"] and "gone" not in status["autoscaler"]["inputs"]


SHRINKING = {"autoscaling": {"scaleDownWindowSeconds": 0}}


def test_idle_traffic_shrinks_the_pools() -> None:  # the control case of the test below
    cluster = FakeCluster(pdd(prefill=6, decode=6, **SHRINKING))
    loop, _ = controller(cluster, FakeMetrics(IDLE))
    [record] = loop.run_pass(1000.0)
    assert record.desired[0] < 6 and record.desired[1] < 6


LIGHT = BUSY | {  # 1 req/s of the same requests: one instance per role is plenty
    Signal.ARRIVAL_RATE: 1.0,
    Signal.PREFILL_FINISHED_RATE: 1.0,
    Signal.INPUT_TOKENS_RATE: 2000.0,
    Signal.OUTPUT_REQUESTS_RATE: 1.0,
    Signal.OUTPUT_TOKENS_RATE: 1500.0,
    Signal.PREFIX_QUERIES_RATE: 2000.0,
    Signal.PREFILL_QUEUE: 0.0,
    Signal.DECODE_RUNNING: 5.0,
    Signal.DECODE_KV_USAGE: 0.05,
}


def test_a_new_pdddeployment_holds_the_replicas_it_finds_for_a_down_window_as_the_hpa_does() -> None:
    cluster = FakeCluster(pdd(prefill=6, decode=6))
    loop, _ = controller(cluster, FakeMetrics(LIGHT))
    [first] = loop.run_pass(1000.0)
    assert first.desired == (6, 6) and "DecodeScaleDownHeldWhileInputsSettle" in first.decision.reasons
    [held] = loop.run_pass(1290.0)  # the spec's 300 s down window
    assert held.desired == (6, 6)
    [settled] = loop.run_pass(1310.0)
    assert settled.desired[0] < 6 and settled.desired[1] < 6


def _grown_then_restarted(keep_state: bool) -> tuple[Controller, tuple[int, int]]:
    """One controller grows a PDDeployment under load; a second one starts on it as the load goes."""
    cluster = FakeCluster(pdd())
    first, _ = controller(cluster, FakeMetrics(BUSY))
    [grown] = first.run_pass(1000.0)
    assert grown.desired[0] > 1 and grown.desired[1] > 1
    kept = cluster.autoscaler("web")["policyState"]
    assert (kept["policy"], kept["version"]) == ("xpyd", 1)
    if not keep_state:
        del cluster.autoscaler("web")["policyState"]
    second, _ = controller(cluster, FakeMetrics(IDLE))
    return second, grown.desired


def test_a_restarted_controller_continues_the_window_kept_in_status() -> None:
    restarted, grown = _grown_then_restarted(keep_state=True)
    [held] = restarted.run_pass(1290.0)  # 1000 s's recommendation is still in the 300 s window
    assert held.desired == grown and "PrefillScaleDownStabilized" in held.decision.reasons
    [shrunk] = restarted.run_pass(1301.0)  # it has left the window: the idle recommendations rule
    assert shrunk.desired[0] < grown[0] and shrunk.desired[1] < grown[1]


def test_a_restarted_controller_without_the_window_holds_what_it_finds_for_a_window() -> None:
    restarted, grown = _grown_then_restarted(keep_state=False)
    [held] = restarted.run_pass(1290.0)
    assert held.desired == grown and "PrefillScaleDownHeldAfterRestart" in held.decision.reasons
    [still] = restarted.run_pass(1580.0)  # 290 s after its own first decision
    assert still.desired == grown
    [shrunk] = restarted.run_pass(1590.0)  # a full window after it
    assert shrunk.desired[0] < grown[0] and shrunk.desired[1] < grown[1]


def test_a_controller_taking_over_continues_the_window_of_the_one_before() -> None:
    cluster = FakeCluster(pdd())

    def named(identity: str, answers: Mapping[Signal, float | None]) -> Controller:
        metrics = FakeMetrics(answers)
        return Controller(
            cluster, lambda url: metrics, FakeTelemetry(), Settings(window_s=30, identity=identity)
        )

    later = named("b", IDLE)
    later.run_pass(0.0)  # b decided once, long ago: its own window has nothing left in it
    [grown] = named("a", BUSY).run_pass(1000.0)
    [held] = later.run_pass(1100.0)  # a is gone; b decides again, inside a's window
    assert held.desired == grown.desired and "PrefillScaleDownStabilized" in held.decision.reasons


def _load(
    rate: float, prompt: float, output: float, queue: float, kv: float | None
) -> dict[Signal, float | None]:
    """One window of a load: `rate` req/s of `prompt`-token prompts and `output`-token outputs, with
    `queue` requests waiting for prefill and `kv` of the decode KV in use. No calibration readings: the
    online calibration is the loop's, not the policy's state (a restarted controller fits it again)."""
    return {
        Signal.ARRIVAL_RATE: rate,
        Signal.PREFILL_FINISHED_RATE: rate,
        Signal.INPUT_TOKENS_RATE: rate * prompt,
        Signal.INPUT_TOKENS_P90: prompt * 1.5,
        Signal.OUTPUT_REQUESTS_RATE: rate,
        Signal.OUTPUT_TOKENS_RATE: rate * output,
        Signal.OUTPUT_TOKENS_P90: output * 1.3,
        Signal.PREFIX_QUERIES_RATE: rate * prompt,
        Signal.PREFIX_HITS_RATE: 0.0,
        Signal.PREFILL_QUEUE: queue,
        Signal.DECODE_RUNNING: rate * output * 0.02,  # 20 ms a token
        Signal.DECODE_WAITING: 0.0,
        Signal.DECODE_KV_USAGE: kv,
        Signal.TTFT_P90: 0.3 + queue * 0.05,
        Signal.TPOT_P90: 0.03,
        Signal.PREFILL_TTFT_MEAN: None,
        Signal.TPOT_MEAN: None,
    }


# Every 10 s: a light load (held while the inputs settle), a steep rise (the up window and the scale-up rate limit hold it back), a fall
# inside the down window, a pass without any data, a change of mix (long prompts and short outputs,
# then the opposite), a signal missing, and idle traffic to the minimum.
CHANGING = [
    *[_load(4.0, 2000, 1000, 1.0, 0.3)] * 3,
    *[_load(30.0, 2000, 1000, 60.0, 0.98)] * 4,
    *[_load(10.0, 2000, 1000, 2.0, 0.4)] * 4,
    dict.fromkeys(Signal),
    *[_load(10.0, 2000, 1000, 2.0, 0.4)] * 2,
    *[_load(20.0, 8000, 150, 50.0, 0.2)] * 4,
    *[_load(20.0, 300, 3000, 0.0, 1.0)] * 4,
    _load(20.0, 300, 3000, 0.0, None),
    *[IDLE] * 9,
]
RESUMABLE_POLICIES = ["threshold", "xpyd"]  # the policies whose state status keeps (Resumable)


def _decide_through(policy: str, takeovers: Mapping[int, str]) -> list[tuple[Any, ...]]:
    """The decisions over CHANGING, one pass every 10 s. A controller is `b`; before each pass named in
    `takeovers` it is killed and a new one (new policy objects, nothing kept but the PDDeployment's
    status) with that identity takes over. Each decision: desired sizes, reasons, binding and the
    policy state status keeps."""
    spec = pdd(
        prefill=2,
        decode=2,
        autoscaling={
            "scaleUpWindowSeconds": 20,
            "scaleDownWindowSeconds": 60,
            "scaleDownPeriodSeconds": 30,
        },
    )
    cluster, metrics = FakeCluster(spec), FakeMetrics({})

    def started(identity: str) -> Controller:
        return Controller(
            cluster,
            lambda url: metrics,
            FakeTelemetry(),
            Settings(policy=policy, window_s=30, identity=identity),
        )

    loop = started("b")
    decisions = []
    for index, answers in enumerate(CHANGING):
        if index in takeovers:
            loop = started(takeovers[index])
        metrics.answers = dict(answers)
        [record] = loop.run_pass(1000.0 + 10 * index)
        status = cluster.autoscaler("web")
        decision = record.decision
        decisions.append((record.desired, decision.reasons, decision.binding, status["policyState"]))
    return decisions


@pytest.mark.parametrize("policy", RESUMABLE_POLICIES)
@pytest.mark.parametrize(
    "takeovers",
    [
        {1: "b", 4: "b", 9: "b", 12: "b", 16: "b", 25: "b"},  # restarts: inside every window and hold
        {5: "a", 13: "a", 22: "a"},  # leader hand-overs (a sorts first, so it never defers to b)
        {index: "b" for index in range(1, len(CHANGING))},  # a new controller every pass
    ],
    ids=["restarts", "hand-overs", "every-pass"],
)
def test_a_controller_restarted_or_replaced_mid_run_decides_exactly_as_one_that_ran_through(
    policy: str, takeovers: Mapping[int, str]
) -> None:
    """Restart equivalence: the policy state kept in status (through JSON and merge patches, as through
    the API server) is all the next decision depends on, so a new controller continues exactly."""
    through = _decide_through(policy, {})
    moved = [desired for desired, *_ in through]
    assert len(set(moved)) > 4, moved  # the load moved the fleet
    reasons = {reason for _, decided, *_ in through for reason in decided}
    if policy == "threshold":  # the windows, the rate limit and the hold all acted
        assert {
            "PrefillScaleDownHeldWhileInputsSettle",
            "PrefillScaleUpStabilized",
            "PrefillScaleUpRateLimited",
            "DecodeScaleDownStabilized",
            "NoMetricsHold",
        } <= reasons, reasons
    replaced = _decide_through(policy, takeovers)
    for index, (one, other) in enumerate(zip(through, replaced, strict=True)):
        assert one == other, f"pass {index} at {1000 + 10 * index} s differs"


RISING = _load(30.0, 2000, 1000, 60.0, 0.98)


def _grown_by_threshold() -> FakeCluster:
    """Controller `b` (threshold) grew a PDDeployment from 2 + 2 under a steep rise at 1000 s."""
    cluster = FakeCluster(pdd(prefill=2, decode=2))
    [grown] = _threshold(cluster, "b", RISING).run_pass(1000.0)
    assert grown.desired == (6, 3)
    return cluster


def _threshold(
    cluster: FakeCluster, identity: str, answers: Mapping[Signal, float | None] = IDLE
) -> Controller:
    metrics = FakeMetrics(answers)
    return Controller(
        cluster,
        lambda url: metrics,
        FakeTelemetry(),
        Settings(policy="threshold", window_s=30, identity=identity),
    )


def _ignored(cluster: FakeCluster) -> list[str]:
    return [message for _, reason, message, warning in cluster.events if reason == "PolicyStateIgnored"]


@pytest.mark.parametrize(
    ("corrupt", "named"),
    [
        (lambda state: "garbage", "state = 'garbage': must be an object"),
        (lambda state: {**state, "policy": "xpyd"}, "policy = 'xpyd': must be 'threshold'"),
        (lambda state: {**state, "version": 0}, "version = 0: must be 1"),
        (lambda state: {**state, "timeS": 1e12}, "timeS = 1000000000000.0: must be in [-inf, 1070]"),
        (
            lambda state: {**state, "layers": {**state["layers"], "decode": 3}},
            "decode = 3: must be an object",
        ),
    ],
    ids=["not-an-object", "another-policy", "another-version", "from-the-future", "a-broken-part"],
)
def test_a_kept_state_the_policy_cannot_trust_is_ignored_said_once_and_held_as_if_lost(
    corrupt: Callable[[Any], Any], named: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Status is evidence, not truth: a policy state anyone may have written is checked by the policy,
    and one it rejects is never half-applied: the decision is the one made without a state, the reason
    is named in status, in the log and (once) in a Warning Event."""
    lost, hostile = _grown_by_threshold(), _grown_by_threshold()
    del lost.autoscaler("web")["policyState"]
    hostile.autoscaler("web")["policyState"] = corrupt(hostile.autoscaler("web")["policyState"])
    lost_controller, hostile_controller = _threshold(lost, "a"), _threshold(hostile, "a")
    [expected] = lost_controller.run_pass(1010.0)
    [ignored] = hostile_controller.run_pass(1010.0)
    assert expected.desired == ignored.desired == (6, 3)  # the fleet it found, held for a down window
    assert "PrefillScaleDownHeldAfterRestart" in expected.decision.reasons
    assert ignored.decision.reasons == (*expected.decision.reasons, "PolicyStateIgnored")
    assert hostile.autoscaler("web")["reasons"][-1] == "PolicyStateIgnored"
    assert hostile.autoscaler("web")["policyState"] == lost.autoscaler("web")["policyState"]
    [message] = _ignored(hostile)
    assert message.startswith(f"status.autoscaler.policyState ignored ({named}")
    assert any(record.getMessage() == f"ns/web: {message}" for record in caplog.records)
    assert next(e for e in hostile.events if e[1] == "PolicyStateIgnored")[3]  # a Warning
    assert _ignored(lost) == []
    [after] = hostile_controller.run_pass(1020.0)  # its own state now: nothing to ignore any more
    assert "PolicyStateIgnored" not in after.decision.reasons and len(_ignored(hostile)) == 1


def test_a_deferring_controller_warns_once_about_a_state_it_keeps_ignoring() -> None:
    cluster = _grown_by_threshold()
    cluster.autoscaler("web")["decider"] = "a"  # a, which sorts first, decides: c defers to it
    cluster.autoscaler("web")["policyState"] = {"policy": "xpyd", "version": 1}
    deferring = _threshold(cluster, "c")
    for now in (1005.0, 1015.0, 1025.0):
        assert deferring.run_pass(now) == []
    assert len(_ignored(cluster)) == 1


def test_a_state_kept_longer_ago_than_the_down_window_counts_as_lost_without_a_warning() -> None:
    """No controller decided for a whole down window (300 s): the fleet went unwatched, and a new one
    holds what it finds for a window, as after a loss (the kept window would have let it go at once)."""
    continued, unwatched = _grown_by_threshold(), _grown_by_threshold()
    [held] = _threshold(continued, "b").run_pass(1300.0)  # 1000 s's recommendation is in the window
    assert held.desired == (6, 3) and "PrefillScaleDownStabilized" in held.decision.reasons
    [lost] = _threshold(unwatched, "b").run_pass(1301.0)
    assert lost.desired == (6, 3) and "PrefillScaleDownHeldAfterRestart" in lost.decision.reasons
    assert _ignored(continued) == _ignored(unwatched) == []


class _Unreadable(ThresholdPolicy):
    """A policy whose reader has a bug: it fails on any state with something other than a StateError."""

    def restore_parts(self, parts: Mapping[str, Any], latest_s: float) -> None:
        self._layers.forget()  # half-way through
        raise KeyError("prefill")


def test_a_policy_that_fails_to_read_its_state_is_rebuilt_and_the_decision_still_made(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cluster = _grown_by_threshold()
    built: list[ThresholdPolicy] = []

    def make(name: str, context: Any) -> ThresholdPolicy:
        built.append(_Unreadable(ThresholdConfig()))
        return built[-1]

    monkeypatch.setattr(loop_module, "make_policy", make)
    restarted = _threshold(cluster, "a")
    [record] = restarted.run_pass(1010.0)
    assert len(built) == 2 and restarted._tracked["uid-web"].policy is built[1]  # the first is dropped
    assert record.desired == (6, 3) and "PrefillScaleDownHeldAfterRestart" in record.decision.reasons
    assert record.decision.reasons[-1] == "PolicyStateIgnored"
    [message] = _ignored(cluster)
    assert "(unreadable: KeyError: 'prefill')" in message


class _Hoarding(ThresholdPolicy):
    def state(self) -> dict[str, Any]:
        return {**super().state(), "hoard": ["x" * 1000] * 100}


def test_a_state_too_large_for_status_is_not_kept_and_never_blocks_the_decision(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    cluster = FakeCluster(pdd(prefill=2, decode=2))
    cluster.objects["web"]["status"] = {"autoscaler": {"policyState": {"policy": "threshold"}}}
    monkeypatch.setattr(loop_module, "make_policy", lambda name, context: _Hoarding(ThresholdConfig()))
    [record] = _threshold(cluster, "b", RISING).run_pass(1000.0)
    assert record.desired == (6, 3) and record.policy_state is None and cluster.replica_writes
    assert "policyState" not in cluster.autoscaler("web")  # null: the last one's is removed
    assert any("above 65536; not kept in status" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("corrupt", [1e308, math.inf, -math.inf, math.nan, -5.0])
def test_an_implausible_value_never_shrinks_a_pool_nor_reaches_the_status(corrupt: float) -> None:
    cluster = FakeCluster(pdd(prefill=6, decode=6, **SHRINKING))
    # idle traffic alone would shrink both pools; a corrupt KV usage beside it must hold them
    loop, _ = controller(cluster, FakeMetrics({**IDLE, Signal.DECODE_KV_USAGE: corrupt}))
    [record] = loop.run_pass(1000.0)
    assert cluster.replica_writes == [] and record.desired == (6, 6)
    status = cluster.autoscaler("web")
    assert "decode_kv_usage" in status["missingData"]
    assert "implausible values treated as missing: decode_kv_usage" in status["message"]
    assert "ImplausibleInputsNoScaleDown" in status["reasons"]
    json.dumps(status, allow_nan=False)  # nothing non-finite anywhere in the patch


def test_a_policy_answer_that_is_not_a_whole_number_in_range_is_held() -> None:
    class Wild:
        name = "wild"

        def decide(self, observation: Any, limits: Any) -> Decision:
            return Decision(2**62, math.nan, binding="x", details={"predicted_ttft_seconds": math.inf})  # type: ignore[arg-type]

    cluster = FakeCluster(pdd(prefill=3, decode=3))
    loop, _ = controller(cluster, FakeMetrics(BUSY))
    tracked_policy = Wild()
    loop._policy = lambda pdd, body, tracked, now: tracked_policy  # type: ignore[method-assign]
    [record] = loop.run_pass(1000.0)
    assert record.desired == (3, 3) and cluster.replica_writes == []
    status = cluster.autoscaler("web")
    assert "PolicyAnswerRejected" in status["reasons"] and "ttftSeconds" not in status["predicted"]
    json.dumps(status, allow_nan=False)


def test_a_tenant_whose_prometheus_hangs_never_holds_up_the_others() -> None:
    release = threading.Event()

    class Hanging(FakeMetrics):
        def query_all(self, queries: Mapping[Signal, str]) -> dict[Signal, float | None]:
            release.wait(10)
            return dict.fromkeys(queries)

    cluster = FakeCluster(pdd("healthy"), *(pdd(f"hostile{i}") for i in range(6)))
    for i in range(6):
        cluster.objects[f"hostile{i}"]["spec"]["autoscaling"]["prometheus"]["url"] = "http://hang:9090"
    healthy, hanging = FakeMetrics(BUSY), Hanging({})
    loop = Controller(
        cluster, lambda url: hanging if "hang" in url else healthy, FakeTelemetry(), Settings(window_s=30)
    )
    decided = []
    for second in range(5):
        decided += [r.generation for r in loop.run_pass(1000.0 + 10 * second, wait_s=1.0)]
    assert len(decided) == 5  # one decision of the healthy tenant per interval, none lost to the others
    release.set()
    assert len(loop.run_pass(1100.0, wait_s=None)) == 7  # the hung ones finish (holding) once answered


def test_a_refused_prometheus_url_is_never_called_and_said_once() -> None:
    cluster = FakeCluster(pdd())
    cluster.objects["web"]["spec"]["autoscaling"]["prometheus"]["url"] = "http://169.254.169.254/"
    metrics = FakeMetrics(BUSY)
    loop, _ = controller(cluster, metrics)
    assert loop.run_pass(1000.0) == [] and loop.run_pass(1010.0) == []
    assert metrics.asked == []
    assert cluster.autoscaler("web")["binding"] == "invalid_setup"
    assert "cloud metadata" in cluster.autoscaler("web")["message"]
    assert [e[1] for e in cluster.events] == ["InvalidAutoscaling"]


@pytest.mark.parametrize(
    "resolved", ["169.254.169.254", "fe80::1", "::ffff:169.254.169.254", "fd00:ec2::254"]
)
def test_a_name_resolving_to_a_refused_address_is_never_queried_and_said_naming_the_host(
    resolved: str,
) -> None:
    cluster = FakeCluster(pdd())
    metrics = FakeMetrics(BUSY, resolved=resolved)
    loop, _ = controller(cluster, metrics)
    assert loop.run_pass(1000.0) == [] and loop.run_pass(1010.0) == []
    assert metrics.asked == []
    status = cluster.autoscaler("web")
    assert status["binding"] == "invalid_setup"
    assert "spec.autoscaling.prometheus.url: 'http://prom:9090': host prom resolves to" in status["message"]
    assert [(e[1], "host prom resolves to" in e[2]) for e in cluster.events] == [("InvalidAutoscaling", True)]
    assert cluster.replica_writes == []


def test_a_second_decider_without_a_lease_defers_to_the_first_and_both_say_so() -> None:
    """Two controllers without a Lease: the one whose identity sorts first decides, the other defers
    (no replicas, no decision) while the first one's decisions are recent, and takes over when they stop."""
    cluster = FakeCluster(pdd())
    one = Controller(
        cluster, lambda url: FakeMetrics(BUSY), FakeTelemetry(), Settings(window_s=30, identity="a")
    )
    two = Controller(
        cluster, lambda url: FakeMetrics(BUSY), FakeTelemetry(), Settings(window_s=30, identity="b")
    )
    two.run_pass(1000.0)  # b started first and decided alone
    assert cluster.autoscaler("web")["decider"] == "b"
    one.run_pass(1005.0)  # a sees b's decision, decides anyway (it sorts first) and says so
    status = cluster.autoscaler("web")
    assert status["decider"] == "a" and "another controller (b) decided" in status["message"]
    for second in range(1, 4):
        writes = len(cluster.replica_writes)
        assert two.run_pass(1000.0 + 10 * second) == []  # b defers: no decision,
        assert len(cluster.replica_writes) == writes  # and no replicas written
        one.run_pass(1005.0 + 10 * second)
    status = cluster.autoscaler("web")
    assert status["decider"] == "a" and status["deferringDecider"]["decider"] == "b"
    assert "another controller (b) runs without a Lease and defers" in status["message"]
    warnings = [e for e in cluster.events if e[1] == "ConcurrentDeciders"]
    assert len(warnings) == 2 and all(e[3] for e in warnings)
    assert "b defers to it" in warnings[1][2]
    assert two.run_pass(1035.0 + 31) != []  # a stopped: three intervals after its last decision b takes over
    status = cluster.autoscaler("web")
    assert status["decider"] == "b" and "deferringDecider" not in status


def _measured_on(gpu: GpuSpec, prefill_ready: int, decode_ready: int) -> dict[Signal, float | None]:
    """BUSY's load as engines on `gpu` would report it: nothing waiting, the roofline's own times."""
    model = MODEL_PRESETS["llama-3.1-8b"]
    batch, context = BUSY[Signal.DECODE_RUNNING] / decode_ready, 2000.0 + 1500.0 / 2  # type: ignore[operator]
    return {
        **BUSY,
        Signal.PREFILL_QUEUE: 0.0,
        Signal.PREFILL_TTFT_MEAN: float(prefill_seconds(model, gpu, 2000.0)),
        Signal.TPOT_MEAN: float(decode_step_seconds(model, gpu, batch, context)),
    }


def test_online_calibration_reports_in_status_and_sizes_once_confident() -> None:
    true_gpu = dataclasses.replace(GPU_PRESETS["h100-sxm"], mfu=0.3, mbu=0.4)  # slower than the preset
    cluster = FakeCluster(pdd(mode="Advisory", prefill=2, decode=2))  # Advisory: the pods stay 2 + 2
    loop, telemetry = controller(cluster, FakeMetrics(_measured_on(true_gpu, 2, 2)))
    for i in range(MIN_SAMPLES):
        loop.run_pass(1000.0 + 10 * i)
        calibration = cluster.autoscaler("web")["calibration"]
        if i < MIN_SAMPLES - 1:
            assert calibration["mbu"]["source"] == "preset" and not calibration["mbu"]["confident"]
            assert calibration["mbu"]["inUse"] == GPU_PRESETS["h100-sxm"].mbu
    assert calibration["mfu"] == {
        "inUse": 0.3,
        "source": "calibrated",
        "fitted": 0.3,
        "samples": MIN_SAMPLES,
        "spread": 0.0,
        "confident": True,
    }
    assert calibration["mbu"]["inUse"] == 0.4 and calibration["mbu"]["source"] == "calibrated"
    first, last = telemetry.records[0][1], telemetry.records[-1][1]

    # slower prefills and decode steps than the preset's: the same load is more prefill work and more
    # concurrent decode sessions (decode's own growth is rate-limited here), and more prefill instances
    def load(record: DecisionRecord) -> float:  # without the correction learned from measured TTFT
        return record.decision.details["prefill_load"] / record.decision.details["prefill_correction"]

    assert load(last) == pytest.approx(load(first) * 0.48 / 0.3)
    assert last.decision.details["concurrency"] > first.decision.details["concurrency"]
    assert last.desired[0] > first.desired[0]


def test_the_specs_own_efficiencies_are_not_replaced_by_the_calibration() -> None:
    true_gpu = dataclasses.replace(GPU_PRESETS["h100-sxm"], mfu=0.3, mbu=0.4)
    spec = pdd(mode="Advisory", prefill=2, decode=2)
    spec["spec"]["hardware"] = {"gpu": "h100-sxm", "mbu": 0.9}
    cluster = FakeCluster(spec)
    loop, _ = controller(cluster, FakeMetrics(_measured_on(true_gpu, 2, 2)))
    for i in range(MIN_SAMPLES):
        loop.run_pass(1000.0 + 10 * i)
    mbu = cluster.autoscaler("web")["calibration"]["mbu"]
    assert (mbu["inUse"], mbu["source"], mbu["confident"]) == (0.9, "spec", True)
    assert mbu["fitted"] == pytest.approx(0.4, rel=0.01)  # reported, so a wrong spec shows


def test_a_bug_inside_decide_is_not_reported_as_a_refused_spec() -> None:
    """The loop catches its own error types (InputError while configuring, LimitsError from decide): a
    bare ValueError from a policy is a bug, logged, and neither blames the spec nor resets the windows."""
    cluster = FakeCluster(pdd())
    loop, _ = controller(cluster, FakeMetrics(BUSY))
    assert loop.run_pass(1000.0)
    tracked = next(iter(loop._tracked.values()))
    policy = tracked.policy
    assert policy is not None

    def broken(*_: object) -> Decision:
        raise ValueError("a bug, not the user's spec")

    object.__setattr__(policy, "decide", broken)
    assert loop.run_pass(1010.0) == []
    assert cluster.autoscaler("web")["binding"] != "invalid_setup"
    assert not [e for e in cluster.events if e[1] == "InvalidAutoscaling"]
    assert tracked.policy is policy  # its windows survive
