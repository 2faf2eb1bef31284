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

import json
import math
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kubernetes import watch
from kubernetes.client.exceptions import ApiException

from e2e.harness.cluster import LocalCluster
from e2e.stack import PDD_NAME, Demo, DemoSettings, demo_stack
from xpyd_api.engines import STANDIN_REQUESTS_PATH
from xpyd_api.names import (
    ANNOTATION_TRANSITION,
    COMPONENT_INSTANCE,
    LABEL_COMPONENT,
    LABEL_PDD,
    LABEL_ROLE,
    LABEL_SERVING,
)

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
    replicas=2,
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


POLL_S = 0.5
ENGINE_PORT = 8000


@dataclass
class PodHistory:
    """One pod (by uid: a scaled-in name comes back as a new pod) as the test's pod watch saw it: each
    label state with when the event arrived, the operator's drain/switch records (their epoch stamps are
    the operator's own clock, on this host), when its deletion was first seen."""

    name: str
    pod_ip: str | None = None
    labels: list[tuple[float, str, bool]] = field(default_factory=list)  # (seen, role, serving)
    steps: list[dict[str, Any]] = field(default_factory=list)  # distinct transition records
    deleted_seen: float | None = None


@dataclass
class Observed:
    """What the test saw: the PDDeployment once a second, each pod's history, the router's pools and
    the engines' request logs (by pod uid)."""

    samples: list[Sample] = field(default_factory=list)
    pods: dict[str, PodHistory] = field(default_factory=dict)
    # (time the answer arrived, hosts the router lists): a host absent then was out of its pools by then
    router_pools: list[tuple[float, frozenset[str]]] = field(default_factory=list)
    logs: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def saw(self, pod: Any, at: float) -> None:
        metadata = pod.metadata
        labels, notes = metadata.labels or {}, metadata.annotations or {}
        with self.lock:
            history = self.pods.setdefault(metadata.uid, PodHistory(metadata.name))
            history.pod_ip = history.pod_ip or (pod.status.pod_ip if pod.status else None)
            state = (labels.get(LABEL_ROLE, ""), labels.get(LABEL_SERVING) == "true")
            if not history.labels or history.labels[-1][1:] != state:
                history.labels.append((at, *state))
            if ANNOTATION_TRANSITION in notes:
                step = json.loads(notes[ANNOTATION_TRANSITION])
                if not history.steps or history.steps[-1] != step:
                    history.steps.append(step)
            if metadata.deletion_timestamp and history.deleted_seen is None:
                history.deleted_seen = at


def watch_pods(demo: Demo, observed: Observed, stop: threading.Event) -> None:
    """Every change of the instance pods, as the API server streams it (polling would miss the one-pass
    Switching record)."""
    selector = f"{LABEL_PDD}={PDD_NAME},{LABEL_COMPONENT}={COMPONENT_INSTANCE}"
    version: str | None = None
    while not stop.is_set():
        stream = watch.Watch()
        try:
            for event in stream.stream(
                demo.core.list_namespaced_pod,
                demo.namespace,
                label_selector=selector,
                resource_version=version,
                timeout_seconds=5,
            ):
                observed.saw(event["object"], time.time())
                version = event["object"].metadata.resource_version
                if stop.is_set():
                    stream.stop()
        except ApiException as error:
            if error.status != 410:  # 410: the version expired, start over from a fresh list
                raise
            version = None


def record(demo: Demo) -> Observed:
    observed = Observed()
    stop = threading.Event()
    watcher = threading.Thread(target=watch_pods, args=(demo, observed, stop), daemon=True)
    watcher.start()
    deadline = time.monotonic() + SETTINGS.minutes * 60.0
    next_sample = next_logs = 0.0
    try:
        while (now := time.monotonic()) < deadline:
            pools = router_hosts(demo)
            if pools is not None:
                observed.router_pools.append((time.time(), pools))
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
    finally:
        stop.set()
        watcher.join(timeout=15)
    return observed


def router_hosts(demo: Demo) -> frozenset[str] | None:
    """The pod IPs in the router's pools now (its GET /workers), None when it does not answer."""
    try:
        with urllib.request.urlopen(f"{demo.router_url}/workers", timeout=5) as response:
            workers = json.loads(response.read())["workers"]
    except (urllib.error.URLError, OSError, ValueError):
        return None
    return frozenset(str(urllib.parse.urlsplit(w["url"]).hostname) for w in workers)


def engine_log(url: str) -> list[dict[str, Any]] | None:
    try:
        with urllib.request.urlopen(f"{url}{STANDIN_REQUESTS_PATH}", timeout=5) as response:
            return list(json.loads(response.read())["requests"])
    except (urllib.error.URLError, OSError, ValueError):
        return None


@dataclass(frozen=True)
class Drain:
    """One drain of a pod: serving=false at `off` (the operator's record), drained at `end` (the
    operator's Switching record, or the deletion the test saw), then serving as `to` (None: deleted)."""

    pod: str  # uid
    off: float
    end: float
    to: str | None


def drains(observed: Observed) -> list[Drain]:
    found = []
    for uid, history in observed.pods.items():
        # each step's first record: later ones of the same step add what the drain learnt
        firsts: dict[tuple[float, str], dict[str, Any]] = {}
        for step in history.steps:
            firsts.setdefault((step["started"], step["step"]), step)
        for step in firsts.values():
            if step["step"] == "Draining":
                same = [s for s in history.steps if s["started"] == step["started"]]
                ends = [s["stepStarted"] for s in same if s["step"] == "Switching"]
                # what the drain ended in: a drain for removal the other pool took over ends in a switch
                last = next(s for s in reversed(same) if s["step"] == "Draining")
                if last["kind"] == "Remove" and history.deleted_seen is not None:
                    found.append(Drain(uid, step["stepStarted"], history.deleted_seen, None))
                elif last["kind"] == "Convert" and ends:
                    found.append(Drain(uid, step["stepStarted"], ends[0], last["to"]))
    return found


def router_dropped(observed: Observed, host: str | None, off: float, end: float) -> float | None:
    """When the test first saw the router without `host` in its pools for good (until `end`), after
    `off`; None if the router never listed it. A router still adding the pod (vllm-router adds one at a
    time, each after its health answers) lists it only later, so an absence before that is no drop."""
    polls = [(t, host in hosts) for t, hosts in observed.router_pools if t <= end]
    last_listed = max((t for t, listed in polls if listed), default=None)
    if last_listed is None:
        return None
    return next((t for t, listed in polls if t > last_listed and t >= off and not listed), None)


Growth = tuple[float, dict[str, Any], dict[str, Any], list[str]]


def growth_decisions(samples: list[Sample]) -> list[Growth]:
    """Each applied decision that grew a pool: (traffic s, desired, the pools it saw, its reasons). A
    conversion needs the other pool to shrink in the same decision or to be draining an instance for
    removal then (the operator converts that one instead, xpyd_api.resize); the reasons name the
    policy's rule that held the other pool (e.g. <Role>HeldInFlight, <Role>KeepsConvertedInstances)."""
    found: list[Growth] = []
    last, seen = None, None
    for sample in samples:
        status = sample.autoscaler
        stamp, desired = status.get("lastDecisionTime"), status.get("desired")
        if not desired or stamp == seen:
            continue
        seen = stamp
        if last is not None and status.get("applied") and any(desired[r] > last[r] for r in desired):
            pools = {r: status.get("inputs", {}).get(r) for r in ("prefill", "decode")}
            found.append((round(sample.at_s), desired, pools, list(status.get("reasons", []))))
        last = desired
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
        found = drains(observed)
        seen = [(observed.pods[d.pod].name, d.to, round(d.end - d.off, 1)) for d in found]
        print(f"drains seen (pod, to (None: deleted), seconds out of service): {seen}")
        print(f"failed requests: {len(demo.traffic.failures)} {demo.traffic.failures[:3]}")
        print(
            f"pool sizes (traffic s, prefill, decode): {[(round(s.at_s), s.prefill, s.decode) for s in samples[::5]]}"
        )
        try:
            informed = [s for s in samples if s.autoscaler.get("binding") not in (None, "missing_data")]
            assert informed, "the controller never decided from Prometheus data"
            inputs = informed[-1].autoscaler["inputs"]
            assert informed[-1].autoscaler["missingData"] == []
            # Poisson arrivals counted over the controller's window: 4 standard deviations of the count
            # (rel 0.35 was 2.7 of them at 4 req/s over 15 s; one run read 5.42 through the router)
            expected = SETTINGS.rate * SETTINGS.rate_window_s
            assert inputs["arrivalRate"] == pytest.approx(SETTINGS.rate, rel=4 / math.sqrt(expected))
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
            conversions = [d for d in found if d.to is not None]
            assert converted and conversions, (
                f"no conversion: events {converted}, seen {found}; the decisions that grew a pool, with "
                f"the other pool's state and the rules that held it: {growth_decisions(samples)}"
            )
            # Engine-side, by the engines' own request logs. A request counts as routed when the client
            # sent it (its `user` tag): the router picks both instances then, and sends the decode part
            # only after the prefill answered. Once the router no longer lists an instance (its GET
            # /workers, polled here), nothing may be routed to it until it is back in service; once the
            # operator decided it drained, nothing of its old role may arrive (the drain waited for the
            # decode parts the router had assigned to it); after a switch it serves its new role.
            routed = demo.traffic.sent_at
            strangers = {r["user"] for log in observed.logs.values() for r in log} - set(routed)
            assert not strangers, f"engines got requests the client never sent: {sorted(strangers)[:3]}"
            served_after, follow = 0, []
            for drain in found:
                history = observed.pods[drain.pod]
                log = [{**r, "routed": routed[r["user"]]} for r in observed.logs.get(drain.pod, [])]
                dropped = router_dropped(observed, history.pod_ip, drain.off, drain.end)
                follow.append(None if dropped is None else round(dropped - drain.off, 1))
                if dropped is not None and dropped < drain.end:
                    quiet = [r for r in log if dropped <= r["routed"] <= drain.end]
                    assert quiet == [], (
                        f"{drain}: routed to it after the router dropped it at {dropped}: {quiet[:3]}"
                    )
                later = [d.off for d in found if d.pod == drain.pod and d.off > drain.end]
                after = [r for r in log if drain.end <= r["at"] < min(later or [math.inf])]
                wrong = [r for r in after if r["kind"] != drain.to]
                assert wrong == [], f"{drain}: requests of another role after it drained: {wrong[:3]}"
                served_after += len(after) if drain.to else 0
            assert served_after > 0, "no converted instance served its new role"
            taken_over = [m for m in demo.event_messages("Draining") if "instead of removal" in m]
            print(f"conversions: {len(conversions)}, of them drains for removal taken over: {taken_over}")
            print(
                f"requests converted instances served after their switch, all of the new role: {served_after}"
            )
            print(f"seconds from serving=false until the test saw the router without it, per drain: {follow}")

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
            print(f"--- samples ---\n{samples}\n--- pods ---\n{observed.pods}")
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
