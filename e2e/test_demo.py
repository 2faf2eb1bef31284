"""End to end: the demo's stack, time-compressed — the controller sizes the pools from what Prometheus
scraped off the live fleet, and the operator converts instances when the mix swings.

Real pieces only: the local cluster, the operator and controller as subprocesses, a real Prometheus
scraping the simulated engines through a file_sd target list that follows the pods.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from e2e.harness.cluster import LocalCluster
from e2e.harness.procs import wait_until
from e2e.stack import PDD_NAME, Demo, DemoSettings, demo_stack
from xpyd_api.names import Role

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
    """The PDDeployment as seen once a second, at fleet time `at_s`."""

    at_s: float
    prefill: int
    decode: int
    ready: tuple[int, int]
    autoscaler: dict[str, Any]


def record(demo: Demo) -> list[Sample]:
    samples = []
    deadline = time.monotonic() + SETTINGS.minutes * 60.0
    while time.monotonic() < deadline:
        body = demo.pdd()
        spec, status = body["spec"], body.get("status") or {}
        ready = tuple((status.get(role) or {}).get("ready", 0) for role in ("prefill", "decode"))
        samples.append(
            Sample(
                demo.fleet.stats().now_s,
                spec["prefill"]["replicas"],
                spec["decode"]["replicas"],
                (ready[0], ready[1]),
                status.get("autoscaler") or {},
            )
        )
        time.sleep(1.0)
    return samples


def second_half(samples: list[Sample], start_s: float, end_s: float) -> list[Sample]:
    """The samples of the second half of the phase [start_s, end_s), when the controller has caught up."""
    middle = (start_s + end_s) / 2
    return [s for s in samples if middle <= s.at_s < end_s]


def fleet_matches_pods(demo: Demo) -> bool:
    """The fleet has one engine per live instance pod, in the pod's role."""
    selector = f"xpyd.dev/pdd={PDD_NAME},xpyd.dev/component=instance"
    pods = json.loads(
        demo.cluster.kubectl("get", "pods", "-n", demo.namespace, "-l", selector, "-o", "json").stdout
    )
    roles = {
        pod["metadata"]["name"]: Role(pod["metadata"]["labels"]["xpyd.dev/role"])
        for pod in pods["items"]
        if not pod["metadata"].get("deletionTimestamp")
    }
    return roles == demo.fleet.roles()


def test_the_controller_follows_the_mix_and_the_operator_converts(
    kube_cluster: LocalCluster, namespace: str, tmp_path: Path
) -> None:
    with demo_stack(kube_cluster, SETTINGS, namespace, tmp_path) as demo:
        samples = record(demo)
        print(
            f"role switches (fleet s, pod, into): {[(round(s.at_s), s.pod, str(s.to)) for s in demo.fleet.switches]}"
        )
        print(
            f"pool sizes (fleet s, prefill, decode): {[(round(s.at_s), s.prefill, s.decode) for s in samples[::5]]}"
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
            switches = demo.fleet.switches
            assert converted and len(switches) >= len(converted) > 0
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

            wait_until(lambda: fleet_matches_pods(demo), 15, "the fleet to follow the instance pods")
            stats = demo.fleet.stats()
            assert stats.arrived == stats.completed + stats.in_system and stats.completed > 0
        except AssertionError:
            print(f"--- samples ---\n{samples}\n--- switches ---\n{demo.fleet.switches}")
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
