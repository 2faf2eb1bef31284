"""The controller against a real Prometheus and the real local cluster, run as a real subprocess.

Loopback exporters serve vLLM-named metrics at known rates; Prometheus scrapes them with the namespace,
pdd and role labels a PodMonitor's relabelling would attach. The operator runs too, so the replicas the
controller writes become instance pods that the controller then counts.
"""

from __future__ import annotations

import itertools
import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from e2e.harness import PrometheusServer
from e2e.harness.cluster import LocalCluster
from e2e.harness.procs import free_port, kill_pid, wait_until
from tests.integration.controller import (
    Traffic,
    engine_exporter,
    labelled_scrape_config,
    scrape,
)
from tests.integration.pdd import OperatorFactory, apply, events, get_json, manifest, wait_ready

from xpyd_api.models import parse_pdd
from xpyd_api.testing import ProgramProcess
from xpyd_controller.control.promql import POLICY_SIGNALS
from xpyd_controller.control.setup import policy_context
from xpyd_controller.model.calibration import mbu_from_decode_step
from xpyd_controller.model.presets import GPU_PRESETS, MODEL_PRESETS
from xpyd_controller.policy.registry import make_policy
from xpyd_controller.policy.types import Resumable
from xpyd_controller.testing import ControllerProcess

pytestmark = [pytest.mark.cluster, pytest.mark.prometheus, pytest.mark.usefixtures("pdd_crd")]

ControllerFactory = Callable[..., ControllerProcess]
XPYD = (sys.executable, "-m", "xpyd_controller.cli")  # the `xpyd` console script


@pytest.fixture
def start_controller(
    kube_cluster: LocalCluster, namespace: str, tmp_path: Path, started_processes: list[ProgramProcess]
) -> ControllerFactory:
    """Starts controller processes for this test's namespace; every one is stopped at teardown."""

    def start(*extra: str, name: str = "controller") -> ControllerProcess:
        args = [
            "--namespace",
            namespace,
            "--tick",
            "0.5",
            "--rate-window",
            "10",
            "--log-level",
            "DEBUG",
            # the tests read the decisions' series on loopback, as plain HTTP
            *("--metrics-auth", "none", "--metrics-address", "127.0.0.1"),
            *extra,
        ]
        process = ControllerProcess(kube_cluster.env(), tmp_path / f"{name}.log", args)
        process.start()
        started_processes.append(process)
        return process

    return start


def autoscaled(name: str, prometheus_url: str, mode: str = "Auto") -> dict[str, Any]:
    return manifest(
        name,
        model={"name": "m", "preset": "llama-3.1-8b"},
        prefill={"replicas": 1, "minReplicas": 1, "maxReplicas": 8},
        decode={"replicas": 1, "minReplicas": 1, "maxReplicas": 8},
        autoscaling={"mode": mode, "intervalSeconds": 1, "prometheus": {"url": prometheus_url}},
    )


def pdd_now(cluster: LocalCluster, namespace: str, name: str) -> dict[str, Any]:
    body: dict[str, Any] = get_json(cluster, "pdd", name, "-n", namespace)
    return body


def autoscaler(cluster: LocalCluster, namespace: str, name: str) -> dict[str, Any]:
    status: dict[str, Any] = (pdd_now(cluster, namespace, name).get("status") or {}).get("autoscaler") or {}
    return status


def scraped(
    prometheus_factory: Callable[[dict[str, Any]], PrometheusServer],
    namespace: str,
    name: str,
    exporters: tuple[str, str],
) -> PrometheusServer:
    """A real Prometheus scraping the (prefill, decode) exporters with the labels a PodMonitor's
    relabelling gives PDDeployment `name`'s pods, once it scrapes both."""
    labels = {"namespace": namespace, "pdd": name}
    prefill, decode = exporters
    prom = prometheus_factory(
        labelled_scrape_config({prefill: {**labels, "role": "prefill"}, decode: {**labels, "role": "decode"}})
    )
    wait_until(lambda: prom.targets_up() == 2, 60, "Prometheus scraping both exporters")
    return prom


def apply_with_full_window(
    cluster: LocalCluster, namespace: str, body: dict[str, Any], prom: PrometheusServer, traffic: Traffic
) -> None:
    """Apply the PDDeployment, wait until it is Ready and Prometheus holds a full rate window."""
    apply(cluster, namespace, body)
    wait_ready(cluster, namespace, body["metadata"]["name"])
    wait_until(lambda: window_filled(prom, traffic.rate), 30, "a full rate window of samples")


def test_auto_scales_from_prometheus_and_holds_when_it_goes_away(
    kube_cluster: LocalCluster,
    namespace: str,
    prometheus_factory: Callable[[dict[str, Any]], PrometheusServer],
    start_operator: OperatorFactory,
    start_controller: ControllerFactory,
) -> None:
    traffic = Traffic()
    with engine_exporter("prefill", traffic) as prefill, engine_exporter("decode", traffic) as decode:
        prom = scraped(prometheus_factory, namespace, "web", (prefill, decode))
        start_operator()
        apply_with_full_window(kube_cluster, namespace, autoscaled("web", prom.url), prom, traffic)
        port = free_port()
        start_controller("--no-leader-elect", "--metrics-port", str(port))

        def scaled() -> bool:
            spec = pdd_now(kube_cluster, namespace, "web")["spec"]
            return bool(spec["prefill"]["replicas"] > 1)

        wait_until(scaled, 60, "the controller to grow the prefill pool")
        wait_until(  # its watch saw its own replica write (which bumped the generation) and decided again
            lambda: (
                autoscaler(kube_cluster, namespace, "web").get("observedGeneration")
                == pdd_now(kube_cluster, namespace, "web")["metadata"]["generation"]
            ),
            30,
            "a decision on the object as the watch last delivered it",
        )
        status = autoscaler(kube_cluster, namespace, "web")
        spec = pdd_now(kube_cluster, namespace, "web")["spec"]
        assert status["mode"] == "Auto" and status["policy"] == "xpyd"
        assert status["binding"].startswith("prefill_") and status["reasons"]
        assert status["desired"]["prefill"] == spec["prefill"]["replicas"]
        assert status["inputs"]["arrivalRate"] == pytest.approx(traffic.rate, rel=0.15)
        assert status["inputs"]["meanInputTokens"] == pytest.approx(traffic.prompt_tokens, rel=0.01)
        assert status["inputs"]["meanOutputTokens"] == pytest.approx(traffic.output_tokens, rel=0.01)
        assert status["inputs"]["decodeKvUsage"] == pytest.approx(traffic.kv_usage)
        assert status["predicted"]["ttftSeconds"] > 0 and status["predicted"]["tpotSeconds"] > 0
        # the policy's whole state, kept for a restarted controller: as the API server stored it (a merge
        # patch drops its nulls), a new policy takes it up as its own
        kept = status["policyState"]
        assert (kept["policy"], kept["version"]) == ("xpyd", 1)
        successor = make_policy(
            "xpyd", policy_context(parse_pdd(pdd_now(kube_cluster, namespace, "web")).spec)
        )
        assert isinstance(successor, Resumable) and successor.resume(kept, time.time()) == ""
        # the online calibration read decode's mean step (the 30 ms between tokens, through Prometheus's
        # sum/count) as 100 running requests on 1 to 8 decode instances; prefill always had a queue
        mbu, mfu = status["calibration"]["mbu"], status["calibration"]["mfu"]
        assert mbu["samples"] >= 1 and mfu["samples"] == 0 and mbu["source"] == "preset"
        bounds = [
            float(mbu_from_decode_step(MODEL_PRESETS["llama-3.1-8b"], GPU_PRESETS["h100-sxm"], b, 2750, 0.03))
            for b in (traffic.running / 8, traffic.running)
        ]
        assert bounds[0] * 0.99 <= mbu["fitted"] <= bounds[1] * 1.01
        assert (pdd_now(kube_cluster, namespace, "web").get("status") or {}).get(
            "conditions"
        )  # operator's kept
        scale_events = events(kube_cluster, namespace, "ScaleDecision")
        assert scale_events and scale_events[0].startswith("setting prefill 1→")
        assert "PrefillBelowModelFloor" in scale_events[0]
        exported = scrape(port)
        desired = spec["prefill"]["replicas"]
        assert (
            f'xpyd_controller_desired_replicas{{namespace="{namespace}",pdd="web",role="prefill"}} {desired:.1f}'
            in exported
        )
        assert "xpyd_controller_loop_duration_seconds_count" in exported

        wait_until(
            lambda: autoscaler(kube_cluster, namespace, "web")["inputs"]["prefill"]["ready"] == desired,
            60,
            "the operator's new prefill instances to be counted ready",
        )
        kill_pid(prom.pid)
        wait_until(
            lambda: autoscaler(kube_cluster, namespace, "web")["binding"] == "missing_data",
            30,
            "the controller to notice Prometheus is gone",
        )
        held = (spec["prefill"]["replicas"], spec["decode"]["replicas"])
        time.sleep(3)
        spec = pdd_now(kube_cluster, namespace, "web")["spec"]
        assert (spec["prefill"]["replicas"], spec["decode"]["replicas"]) == held
        status = autoscaler(kube_cluster, namespace, "web")
        assert "unreachable" in status["message"] and status["reasons"] == ["NoMetricsHold"]
        assert status["missingData"] == [str(signal) for signal in POLICY_SIGNALS]  # all, in order
        assert any(
            "holding the pool sizes" in m for m in events(kube_cluster, namespace, "MetricsUnavailable")
        )
        assert 'binding="missing_data"' in scrape(port)


def test_only_the_leader_writes_and_a_successor_takes_over(
    kube_cluster: LocalCluster, namespace: str, start_controller: ControllerFactory
) -> None:
    dead_prometheus = f"http://127.0.0.1:{free_port()}"
    apply(kube_cluster, namespace, autoscaled("lead", dead_prometheus, mode="Advisory"))
    once = subprocess.run(  # `xpyd controller --once`: one pass without a Lease, decisions on stdout
        [*XPYD, "controller", "--namespace", namespace, "--once", "--no-leader-elect", "--metrics-port", "0"],
        env=kube_cluster.env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert once.returncode == 0, once.stderr
    assert (
        once.stdout.strip() == "prefill=1 decode=1 applied=False binding=missing_data reasons=NoMetricsHold"
    )
    ports = {name: free_port() for name in "abc"}

    def start(name: str, lease_seconds: int) -> ControllerProcess:
        args = ["--leader-elect", "--lease-namespace", namespace, "--lease-duration", str(lease_seconds)]
        return start_controller(*args, "--identity", name, "--metrics-port", str(ports[name]), name=name)

    def decided(name: str) -> bool:
        return "xpyd_controller_decisions_total{" in scrape(ports[name])

    first = start("a", 60)  # a long lease: only a release lets b in before a minute is up
    wait_until(lambda: holder(kube_cluster, namespace) == "a", 30, "controller a to take the lease")
    second = start("b", 3)
    wait_until(lambda: bool(autoscaler(kube_cluster, namespace, "lead")), 30, "the leader's first status")
    wait_until(
        lambda: "xpyd_controller_leader 0.0" in scrape(ports["b"]), 30, "b to serve /metrics as follower"
    )
    time.sleep(2)
    assert holder(kube_cluster, namespace) == "a"
    assert "xpyd_controller_leader 1.0" in scrape(ports["a"]) and decided("a")
    assert not decided("b")  # the follower decided nothing, so it wrote nothing

    first.kill(signal.SIGTERM)  # a clean shutdown releases the lease: b takes it long before it expires
    wait_until(lambda: holder(kube_cluster, namespace) == "b", 20, "b to take over the released lease")
    wait_until(lambda: decided("b"), 30, "b's first decision")

    start("c", 3)
    wait_until(
        lambda: "xpyd_controller_leader 0.0" in scrape(ports["c"]), 30, "c to serve /metrics as follower"
    )
    second.kill(signal.SIGKILL)  # a crash: the lease is not released, c must wait for it to expire
    wait_until(lambda: holder(kube_cluster, namespace) == "c", 30, "c to take over the expired lease")
    before = autoscaler(kube_cluster, namespace, "lead")["lastDecisionTime"]
    wait_until(
        lambda: autoscaler(kube_cluster, namespace, "lead")["lastDecisionTime"] != before,
        30,
        "c to write status",
    )
    assert decided("c")
    # each successor took up the policy state the one before kept in status (as the API server stored it)
    assert events(kube_cluster, namespace, "PolicyStateIgnored") == []


def window_filled(prom: PrometheusServer, rate: float) -> bool:
    """True once the 10 s rate the controller reads is no longer cut short by the exporters' start."""
    answer = prom.query("sum(rate(vllm:request_prompt_tokens_count[10s]))")
    return bool(answer) and abs(float(answer[0]["value"][1]) - rate) < 0.05 * rate


def holder(cluster: LocalCluster, namespace: str) -> str:
    result = cluster.kubectl("get", "lease", "xpyd-controller", "-n", namespace, "-o", "json", check=False)
    if result.returncode != 0:
        return ""
    return str(json.loads(result.stdout)["spec"].get("holderIdentity") or "")


def test_two_controllers_without_a_lease_say_so_and_only_one_decides(
    kube_cluster: LocalCluster,
    namespace: str,
    prometheus_factory: Callable[[dict[str, Any]], PrometheusServer],
    start_operator: OperatorFactory,
    start_controller: ControllerFactory,
) -> None:
    """Two controllers on one PDDeployment without a Lease, with different policies (they may disagree):
    the one whose identity sorts first decides, the other defers; each posts one ConcurrentDeciders
    Warning, the status names both, only the first one's decisions are written (without the rule each
    would write its own every interval), and the other takes over when the first one is gone."""
    traffic = Traffic()
    with engine_exporter("prefill", traffic) as prefill, engine_exporter("decode", traffic) as decode:
        prom = scraped(prometheus_factory, namespace, "twice", (prefill, decode))
        start_operator()
        apply_with_full_window(kube_cluster, namespace, autoscaled("twice", prom.url), prom, traffic)

        def start(identity: str, policy: str) -> ControllerProcess:
            args = ["--no-leader-elect", "--identity", identity, "--policy", policy, "--metrics-port", "0"]
            return start_controller(*args, name=identity)

        start("b", "threshold")  # b decides alone first: the worse order, a must take over from it
        wait_until(
            lambda: autoscaler(kube_cluster, namespace, "twice").get("decider") == "b", 30, "b deciding"
        )
        first = start("a", "xpyd")
        started = time.monotonic()

        def both_reported() -> bool:
            status = autoscaler(kube_cluster, namespace, "twice")
            warnings = events(kube_cluster, namespace, "ConcurrentDeciders")
            return (
                status.get("decider") == "a"
                and (status.get("deferringDecider") or {}).get("decider") == "b"
                and "(b) runs without a Lease and defers" in (status.get("message") or "")
                and any("b defers to it" in m for m in warnings)
            )

        wait_until(both_reported, 30, "a deciding, b deferring, both saying so")
        reported = time.monotonic() - started
        # a's xpyd took over from b's threshold: another policy's state, ignored as lost and said so
        ignored = events(kube_cluster, namespace, "PolicyStateIgnored")
        assert any("(policy = 'threshold': must be 'xpyd'" in m for m in ignored), ignored
        sizes, deciders = [], set()
        observe_until = time.monotonic() + 8  # eight of the PDDeployment's 1 s intervals
        while time.monotonic() < observe_until:
            body = pdd_now(kube_cluster, namespace, "twice")
            sizes.append((body["spec"]["prefill"]["replicas"], body["spec"]["decode"]["replicas"]))
            deciders.add(((body.get("status") or {}).get("autoscaler") or {}).get("decider"))
            time.sleep(0.25)
        changes = [(old, new) for old, new in itertools.pairwise(sizes) if old != new]
        desired_a = autoscaler(kube_cluster, namespace, "twice")["desired"]
        warnings = events(kube_cluster, namespace, "ConcurrentDeciders")
        print(f"\nboth reported {reported:.1f}s after a started; replica changes over 8 s: {changes}")
        assert deciders == {"a"}
        assert len(changes) <= 1, changes  # a's own growth at most; a flap would go back and forth
        assert len(warnings) == 2, warnings  # one from each controller

        first.kill(signal.SIGKILL)
        stopped = time.monotonic()
        wait_until(
            lambda: autoscaler(kube_cluster, namespace, "twice").get("decider") == "b",
            15,
            "b to take over three intervals after a's last decision",
        )
        status = autoscaler(kube_cluster, namespace, "twice")
        print(
            f"b took over {time.monotonic() - stopped:.1f}s after a was killed; "
            f"a (xpyd) wanted {desired_a}, b (threshold) wants {status['desired']}"
        )
        assert "deferringDecider" not in status


def test_absurd_and_non_finite_metrics_never_shrink_a_pool_nor_break_its_status(
    kube_cluster: LocalCluster,
    namespace: str,
    prometheus_factory: Callable[[dict[str, Any]], PrometheusServer],
    start_operator: OperatorFactory,
    start_controller: ControllerFactory,
) -> None:
    """The probe's 1e308 scaled prefill down and then every status patch carried NaN (refused by the API
    server). Pools larger than the traffic needs, gauges of 1e308, +Inf and NaN through a real
    Prometheus: no replica moves, every decision reaches the status; the control: once the values are
    sane again the same controller shrinks the pools."""
    traffic = Traffic()
    prefill_garbage = {"vllm:num_requests_waiting": "1e308"}
    decode_garbage = {"vllm:num_requests_running": "+Inf", "vllm:kv_cache_usage_perc": "NaN"}
    with (
        engine_exporter("prefill", traffic, prefill_garbage) as prefill,
        engine_exporter("decode", traffic, decode_garbage) as decode,
    ):
        prom = scraped(prometheus_factory, namespace, "garbled", (prefill, decode))
        start_operator()
        body = autoscaled("garbled", prom.url)
        body["spec"]["prefill"]["replicas"], body["spec"]["decode"]["replicas"] = 6, 8
        body["spec"]["autoscaling"]["scaleDownWindowSeconds"] = 0
        apply_with_full_window(kube_cluster, namespace, body, prom, traffic)
        start_controller("--no-leader-elect", "--metrics-port", "0")
        wait_until(
            lambda: bool(autoscaler(kube_cluster, namespace, "garbled").get("lastDecisionTime")),
            30,
            "the first decision in status",
        )
        sizes, decided, notes = set(), set(), set()
        observe_until = time.monotonic() + 8  # eight of the PDDeployment's 1 s intervals
        while time.monotonic() < observe_until:
            now = pdd_now(kube_cluster, namespace, "garbled")
            sizes.add((now["spec"]["prefill"]["replicas"], now["spec"]["decode"]["replicas"]))
            status = (now.get("status") or {}).get("autoscaler") or {}
            decided.add(status["lastDecisionTime"])
            notes.add(status.get("message") or "")
            time.sleep(0.25)
        status = autoscaler(kube_cluster, namespace, "garbled")
        print(f"\nsizes {sizes}; {len(decided)} decisions in status; reasons {status['reasons']}; {notes}")
        assert sizes == {(6, 8)}
        assert len(decided) >= 5  # the status patches went through, second after second
        assert all("implausible values treated as missing" in note for note in notes)
        assert "prefill_queue" in status["message"]  # 1e308: answered, implausible
        assert {"decode_running", "decode_kv_usage"} <= set(status["missingData"])  # ±Inf, NaN: no answer
        assert "nan" not in json.dumps(status).lower() and "inf" not in json.dumps(status["inputs"]).lower()

        prefill_garbage.clear()  # the control: sane values, the same pools are too large
        decode_garbage.clear()
        cleaned = time.monotonic()
        wait_until(
            lambda: pdd_now(kube_cluster, namespace, "garbled")["spec"]["prefill"]["replicas"] < 6,
            60,
            "the controller to shrink prefill once the values are sane",
        )
        print(f"sane values: prefill shrunk {time.monotonic() - cleaned:.1f}s later")
