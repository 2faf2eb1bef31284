"""End to end: the demo's stack, time-compressed — traffic through the real vllm-router, the controller
sizing the pools from what Prometheus scraped off the engines, the operator converting instances when
the mix swings; and the engines' own request logs show that a converting instance got no new request
while out of service, that everything it got after the switch was of its new role (the drain also waited
for the decode parts vllm-router had assigned to it but not yet sent, docs/operator.md), and that no
request failed, scale-in deletions included.

Real pieces where they run here: the local cluster, the operator and controller as subprocesses, the
real router binary started from its rendered Deployment, a real Prometheus discovering the pods through
the API server (the chart's PodMonitor relabelling); the engines are stand-ins speaking vLLM's API.
"""

from __future__ import annotations

import itertools
import json
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from e2e.harness.cluster import LocalCluster
from e2e.stack import PDD_NAME, Demo, DemoSettings, demo_stack
from xpyd_api.names import LABEL_ROLE, LABEL_SERVING
from xpyd_operator.plan.scaling import ROUTER_FOLLOW_SECONDS

pytestmark = [pytest.mark.cluster, pytest.mark.prometheus]

# Long outputs for 45 s, long prompts for 45 s, long outputs again for 90 s (`swings=2`: without the
# limit the mix swung back to long prompts at 135 s, in the very half the test reads). Each phase
# outlasts the controller's 15 s window plus a few 3 s decision intervals. Every trial run converted
# instances (the first within ~30 s: the initial 2+2 is wrong for long outputs), but whether one falls
# right after a swing depends on the policy's layers and the GPU budget (under long prompts the
# smoothed output length keeps the model's decode floor up for a while); what the swing back to long
# outputs must move is both pools' sizes, so that is asserted.
SETTINGS = DemoSettings(
    minutes=3.0,
    rate=4.0,
    swing_s=45.0,
    swings=2,
    rate_window_s=15.0,
    interval_s=3.0,
    scale_down_window_s=6.0,
    scale_down_period_s=6.0,
    seed=3,
)


@dataclass(frozen=True)
class Sample:
    """The PDDeployment as seen once a second, at traffic time `at_s`."""

    at_s: float
    prefill: int
    decode: int
    ready: tuple[int, int]
    autoscaler: dict[str, Any]


# Seconds after a label change by which the router has acted: what the operator's drain allows for
# (0.3-0.9 s measured lightly loaded, up to 3.5 s under this test's load).
ROUTER_SLACK_S = ROUTER_FOLLOW_SECONDS
POLL_S = 0.5
ENGINE_PORT = 8000


@dataclass
class Observed:
    """What the test saw: the PDDeployment once a second, each pod's labels over time, engine logs.

    Pods are keyed by uid: a scaled-in name comes back as a new pod (often in the other role).
    """

    samples: list[Sample] = field(default_factory=list)
    labels: dict[str, list[tuple[float, str, bool]]] = field(
        default_factory=dict
    )  # pod uid: (time, role, serving)
    names: dict[str, str] = field(default_factory=dict)  # pod uid: pod name
    logs: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # pod uid: its engine's request log


def record(demo: Demo) -> Observed:
    observed = Observed()
    deadline = time.monotonic() + SETTINGS.minutes * 60.0
    next_sample = next_logs = 0.0
    while (now := time.monotonic()) < deadline:
        pods = demo.instance_pods()
        for pod in pods:
            labels = pod.metadata.labels or {}
            state = (labels.get(LABEL_ROLE, ""), labels.get(LABEL_SERVING) == "true")
            history = observed.labels.setdefault(pod.metadata.uid, [])
            observed.names[pod.metadata.uid] = pod.metadata.name
            if not history or history[-1][1:] != state:
                history.append((time.time(), *state))
        if now >= next_logs:
            next_logs = now + 3.0
            # By the process the pod runner keeps for each pod uid (terminating ones too: they still
            # serve their last requests; a new pod on the same IP starts only after they exit).
            for uid, process in demo.pods.processes().items():
                log = engine_log(f"http://{process.pod_ip}:{ENGINE_PORT}")
                if log is not None and not process.pod.startswith(f"{PDD_NAME}-router"):
                    observed.logs[uid] = log
        if now >= next_sample:
            next_sample = now + 1.0
            body = demo.pdd()
            spec, status = body["spec"], body.get("status") or {}
            ready = tuple((status.get(role) or {}).get("ready", 0) for role in ("prefill", "decode"))
            observed.samples.append(
                Sample(
                    demo.traffic.now_s,
                    spec["prefill"]["replicas"],
                    spec["decode"]["replicas"],
                    (ready[0], ready[1]),
                    status.get("autoscaler") or {},
                )
            )
        time.sleep(POLL_S)
    return observed


def engine_log(url: str) -> list[dict[str, Any]] | None:
    try:
        with urllib.request.urlopen(f"{url}/xpyd/requests", timeout=5) as response:
            return list(json.loads(response.read())["requests"])
    except (urllib.error.URLError, OSError, ValueError):
        return None


@dataclass(frozen=True)
class Conversion:
    """One role change of a pod as the test saw it: out of service at `off`, back as `to` at `on`."""

    pod: str  # uid
    off: float
    on: float
    to: str


def conversions(labels: dict[str, list[tuple[float, str, bool]]]) -> list[Conversion]:
    found = []
    for pod, history in labels.items():
        for (_, role, _), (at, new_role, serving) in itertools.pairwise(history):
            if new_role != role and serving:
                off = max((t for t, r, s in history if t < at and r == role and not s), default=at)
                found.append(Conversion(pod, off, at, new_role))
    return found


def second_half(samples: list[Sample], start_s: float, end_s: float) -> list[Sample]:
    """The samples of the second half of the phase [start_s, end_s), when the controller has caught up."""
    middle = (start_s + end_s) / 2
    return [s for s in samples if middle <= s.at_s < end_s]


def test_the_controller_follows_the_mix_and_the_operator_converts(
    kube_cluster: LocalCluster, namespace: str, tmp_path: Path
) -> None:
    with demo_stack(kube_cluster, SETTINGS, namespace, tmp_path) as demo:
        observed = record(demo)
        samples = observed.samples
        found = conversions(observed.labels)
        seen = [(observed.names[c.pod], c.to, round(c.on - c.off, 1)) for c in found]
        print(f"conversions seen (pod, to, out of service s): {seen}")
        print(f"failed requests: {len(demo.traffic.failures)} {demo.traffic.failures[:3]}")
        print(
            f"pool sizes (traffic s, prefill, decode): {[(round(s.at_s), s.prefill, s.decode) for s in samples[::5]]}"
        )
        try:
            informed = [s for s in samples if s.autoscaler.get("binding") not in (None, "missing_data")]
            assert informed, "the controller never decided from Prometheus data"
            inputs = informed[-1].autoscaler["inputs"]
            assert informed[-1].autoscaler["missingData"] == []
            assert inputs["arrivalRate"] == pytest.approx(SETTINGS.rate, rel=0.35)
            assert inputs["meanInputTokens"] > 0 and inputs["meanOutputTokens"] > 0

            decisions = demo.event_messages("ScaleDecision")
            assert decisions, "the controller never wrote replicas"
            sizes = [(s.prefill, s.decode) for s in samples]
            assert len(set(sizes)) > 1, f"the pools never changed: {sizes}"
            changed = sizes.index(next(size for size in sizes if size != sizes[0]))
            assert any(s.ready == (s.prefill, s.decode) for s in samples[changed:]), (
                "the operator never caught up"
            )

            converted = demo.event_messages("Converted")
            assert converted and found, f"no conversion: events {converted}, seen {found}"
            # Engine-side: out of service means no new request (the router dropped it), and after the switch
            # the instance serves its new role (vllm-router sends a prefill do_remote_decode, a decode the rest).
            # A request counts from when the client sent it (its `user` tag): the router picks both instances
            # then, and the decode part reaches its instance only after the prefill answered.
            routed = demo.traffic.sent_at
            strangers = {r["user"] for log in observed.logs.values() for r in log} - set(routed)
            assert not strangers, f"engines got requests the client never sent: {sorted(strangers)[:3]}"
            served_after = 0
            for conversion in found:
                log = [{**r, "routed": routed[r["user"]]} for r in observed.logs.get(conversion.pod, [])]
                quiet = [r for r in log if conversion.off + ROUTER_SLACK_S <= r["routed"] < conversion.on]
                assert quiet == [], f"{conversion}: requests routed to it while out of service: {quiet[:3]}"
                until = min(
                    [c.off for c in found if c.pod == conversion.pod and c.off > conversion.on] or [1e18]
                )
                # Every request that reached it after the switch, whenever the client sent it.
                after = [r for r in log if conversion.on <= r["at"] < until]
                wrong = [r for r in after if r["kind"] != conversion.to]
                assert wrong == [], f"{conversion}: old-role requests after the switch: {wrong[:3]}"
                served_after += len(after)
            assert served_after > 0, "no converted instance served its new role"
            print(
                f"requests converted instances served after their switch, all of the new role: {served_after}"
            )

            # At the swing back to long outputs the pools move apart: in the second half of that phase
            # decode reaches above and prefill below what they were in the second half of the
            # long-prompt phase (its extremes, not its last sample: a conversion may land just before
            # the swing, and a pool already at its minimum cannot shrink further).
            swing_back = 2 * SETTINGS.swing_s
            prompts = second_half(samples, SETTINGS.swing_s, swing_back)
            late = second_half(samples, swing_back, SETTINGS.minutes * 60.0)
            assert max(s.decode for s in late) > min(s.decode for s in prompts), (
                f"decode never grew: {prompts}, {late}"
            )
            assert min(s.prefill for s in late) < max(s.prefill for s in prompts), (
                f"prefill never shrank: {prompts}, {late}"
            )

            stats = demo.traffic.stats()
            assert demo.traffic.failures == [], demo.traffic.failures[:5]
            assert stats.completed > 0
        except AssertionError:
            print(f"--- samples ---\n{samples}\n--- labels ---\n{observed.labels}")
            print(f"--- controller ---\n{demo.controller.log_tail(80)}")
            print(f"--- operator ---\n{demo.operator.log_tail(80)}")
            # Where pods stand (a Pending pod names its scheduling failure) and the object's conditions.
            pods = kube_cluster.kubectl("get", "pods", "-A", "-o", "wide", check=False)
            print(f"--- pods ---\n{pods.stdout}{pods.stderr}")
            conditions = kube_cluster.kubectl(
                "get", "pdd", "-n", namespace, "-o", "jsonpath={.items[*].status.conditions}", check=False
            )
            print(f"--- conditions ---\n{conditions.stdout}{conditions.stderr}")
            events = kube_cluster.kubectl("get", "events", "-n", namespace, check=False)
            print(f"--- events ---\n{events.stdout[-4000:]}{events.stderr}")
            raise
