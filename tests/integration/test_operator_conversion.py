"""In-place role conversion on the real cluster: same pods, same nodes, new role; exactly once.

The engines are `EngineStub` endpoints; their in-flight counts hold a drain open or let it finish.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from e2e.harness.cluster import LocalCluster
from e2e.harness.pods import PodRunner, running_pods
from e2e.harness.procs import wait_until
from tests.integration.pdd import (
    OperatorFactory,
    apply,
    events,
    instance_pods,
    manifest,
    patch_spec,
    point_at_engines,
    roles,
    wait_ready,
)

from xpyd_api.engines import STANDIN_COMMAND
from xpyd_api.names import ANNOTATION_CONVERSIONS, ANNOTATION_TRANSITION
from xpyd_operator.testing import EngineStub

pytestmark = [pytest.mark.cluster, pytest.mark.usefixtures("pdd_crd")]


def placement(pods: list[dict[str, Any]]) -> dict[str, tuple[str, str]]:
    """Pod name -> (uid, node): unchanged means the very same pod stayed where it was."""
    return {p["metadata"]["name"]: (p["metadata"]["uid"], p["spec"]["nodeName"]) for p in pods}


def conversions(pod: dict[str, Any]) -> int:
    return int((pod["metadata"].get("annotations") or {}).get(ANNOTATION_CONVERSIONS, "0"))


def settled(cluster: LocalCluster, namespace: str, name: str, prefill: int, decode: int) -> bool:
    pods = instance_pods(cluster, namespace, name)
    in_transition = [p for p in pods if ANNOTATION_TRANSITION in (p["metadata"].get("annotations") or {})]
    counts = sorted(roles(pods).values())
    return not in_transition and counts == sorted(["prefill"] * prefill + ["decode"] * decode)


def start_pdd(
    cluster: LocalCluster, namespace: str, name: str, stub: EngineStub, in_flight: int, **spec: Any
) -> dict[str, tuple[str, str]]:
    """A 1 prefill + 2 decode PDDeployment, Ready, its pods pointed at `stub` with `in_flight` each."""
    body = manifest(name, prefill={"replicas": 1}, decode={"replicas": 2}, **spec)
    apply(cluster, namespace, body)
    wait_ready(cluster, namespace, name)
    pods = instance_pods(cluster, namespace, name)
    for pod in pods:
        stub.set_in_flight(pod["metadata"]["name"], in_flight)
    point_at_engines(cluster, namespace, stub, pods)
    return placement(pods)


def test_convert_decode_to_prefill_and_back(
    kube_cluster: LocalCluster, namespace: str, start_operator: OperatorFactory, engines: EngineStub
) -> None:
    """Both ways, with what the drain must wait for behind vllm-router: decode -> prefill only once the
    requests queued at prefill when it left the pool are done (they may still have it as their decode
    side); prefill -> decode only the KV lease after it went idle (decode may still pull)."""
    start_operator()
    lease = 6.0
    before = start_pdd(
        kube_cluster, namespace, "conv", engines, in_flight=0, conversion={"kvLeaseSeconds": lease}
    )
    prefill = next(
        n for n, r in roles(instance_pods(kube_cluster, namespace, "conv")).items() if r == "prefill"
    )
    engines.set_in_flight(prefill, 3)
    engines.set_finished(prefill, 10)

    patch_spec(kube_cluster, namespace, "conv", {"prefill": {"replicas": 2}, "decode": {"replicas": 1}})

    def backlog() -> dict[str, int] | None:
        for pod in instance_pods(kube_cluster, namespace, "conv"):
            record = (pod["metadata"].get("annotations") or {}).get(ANNOTATION_TRANSITION)
            if record and json.loads(record).get("prefillBacklog") is not None:
                return dict(json.loads(record)["prefillBacklog"])
        return None

    wait_until(
        lambda: backlog() is not None, 60, "the draining decode instance to record the prefill backlog"
    )
    assert backlog() == {prefill: 13}
    engines.set_finished(prefill, 12)
    time.sleep(3)
    assert not settled(kube_cluster, namespace, "conv", 2, 1), "switched while prefill held its requests"
    engines.set_finished(prefill, 13)  # the prefill's queued requests are done (it is busy with new ones)
    wait_until(lambda: settled(kube_cluster, namespace, "conv", 2, 1), 60, "decode->prefill conversion")
    pods = instance_pods(kube_cluster, namespace, "conv")
    assert placement(pods) == before, "a conversion must keep the same pods on the same nodes"
    converted = [p for p in pods if conversions(p) == 1]
    assert len(converted) == 1 and converted[0]["metadata"]["labels"]["xpyd.dev/role"] == "prefill"
    assert converted[0]["metadata"]["labels"]["xpyd.dev/serving"] == "true"
    wait_ready(kube_cluster, namespace, "conv")

    engines.set_in_flight(prefill, 0)
    started = time.monotonic()
    patch_spec(kube_cluster, namespace, "conv", {"prefill": {"replicas": 1}, "decode": {"replicas": 2}})
    wait_until(lambda: settled(kube_cluster, namespace, "conv", 1, 2), 60, "prefill->decode conversion")
    assert time.monotonic() - started >= lease, "a prefill instance switched within its KV lease"
    pods = instance_pods(kube_cluster, namespace, "conv")
    assert placement(pods) == before
    assert sum(conversions(p) for p in pods) == 2
    assert len(events(kube_cluster, namespace, "Converted")) == 2
    assert len(events(kube_cluster, namespace, "Created")) == 3, "no instance was created for a conversion"
    assert not events(kube_cluster, namespace, "Deleted")


def test_operator_killed_mid_conversion_resumes_exactly_once(
    kube_cluster: LocalCluster, namespace: str, start_operator: OperatorFactory, engines: EngineStub
) -> None:
    first = start_operator()
    drain = {"drainTimeoutSeconds": 600}
    before = start_pdd(kube_cluster, namespace, "crash", engines, in_flight=3, conversion=drain)

    patch_spec(kube_cluster, namespace, "crash", {"prefill": {"replicas": 2}, "decode": {"replicas": 1}})

    def draining() -> list[str]:
        pods = instance_pods(kube_cluster, namespace, "crash")
        return [
            p["metadata"]["name"]
            for p in pods
            if '"Draining"' in (p["metadata"].get("annotations") or {}).get(ANNOTATION_TRANSITION, "")
        ]

    wait_until(lambda: len(draining()) == 1, 60, "a conversion to start draining")
    victim = draining()[0]
    first.kill()  # SIGKILL: no chance to clean up
    for name in before:
        engines.set_in_flight(name, 0)
    start_operator()

    wait_until(lambda: settled(kube_cluster, namespace, "crash", 2, 1), 60, "the conversion to complete")
    pods = {p["metadata"]["name"]: p for p in instance_pods(kube_cluster, namespace, "crash")}
    assert placement(list(pods.values())) == before
    assert pods[victim]["metadata"]["labels"]["xpyd.dev/role"] == "prefill"
    assert conversions(pods[victim]) == 1
    assert sum(conversions(p) for p in pods.values()) == 1
    converted = events(kube_cluster, namespace, "Converted")
    assert len(converted) == 1 and victim in converted[0], converted


def test_http_switch_is_called_once_and_verified(
    kube_cluster: LocalCluster, namespace: str, start_operator: OperatorFactory, engines: EngineStub
) -> None:
    start_operator()
    spec: dict[str, Any] = {
        "engine": {"image": "sglang:1", "type": "sglang"},
        "router": {"type": "sglang-router"},
    }
    before = start_pdd(kube_cluster, namespace, "sgl", engines, in_flight=0, **spec)
    for name, role in roles(instance_pods(kube_cluster, namespace, "sgl")).items():
        engines.roles[name] = role

    patch_spec(kube_cluster, namespace, "sgl", {"prefill": {"replicas": 2}, "decode": {"replicas": 1}})
    wait_until(lambda: settled(kube_cluster, namespace, "sgl", 2, 1), 60, "HTTP-switched conversion")
    pods = instance_pods(kube_cluster, namespace, "sgl")
    assert placement(pods) == before
    converted = [p["metadata"]["name"] for p in pods if conversions(p) == 1]
    assert engines.switch_calls == [(converted[0], "prefill")]
    args = pods[0]["spec"]["containers"][0]["args"]
    assert args[args.index("--disaggregation-mode") + 1] == "$(XPYD_ROLE)"
    assert json.dumps(args).count("--enable-pd-role-switch") == 1


@pytest.mark.parametrize("took_effect", [True, False], ids=["killed-after-the-call", "call-never-arrived"])
def test_http_switch_is_not_repeated_after_the_operator_is_killed_mid_call(
    took_effect: bool,
    kube_cluster: LocalCluster,
    namespace: str,
    start_operator: OperatorFactory,
    engines: EngineStub,
) -> None:
    """The operator is SIGKILLed while its switch POST is held unanswered in the engine, its intent
    already on the pod. The engine then either switched or never got the call (as when the operator dies
    right after recording the intent). The restarted operator asks the engine first and sends again only
    in the second case: the engine switches exactly once, and the pods are the same ones on the same
    nodes."""
    held = {"XPYD_ENGINE_TIMEOUT_SECONDS": "60"}  # the held POST must not time out before the kill
    first = start_operator(**held)
    spec: dict[str, Any] = {
        "engine": {"image": "sglang:1", "type": "sglang"},
        "router": {"type": "sglang-router"},
    }
    before = start_pdd(kube_cluster, namespace, "held", engines, in_flight=0, **spec)
    for name, role in roles(instance_pods(kube_cluster, namespace, "held")).items():
        engines.roles[name] = role
    engines.hold_switches()

    patch_spec(kube_cluster, namespace, "held", {"prefill": {"replicas": 2}, "decode": {"replicas": 1}})
    assert engines.switch_arrived.wait(90), "no switch POST reached the engine"
    first.kill()  # SIGKILL while the POST waits for its answer
    victim = engines.switch_calls[0][0]
    pod = next(p for p in instance_pods(kube_cluster, namespace, "held") if p["metadata"]["name"] == victim)
    record = json.loads(pod["metadata"]["annotations"][ANNOTATION_TRANSITION])
    assert record["step"] == "Switching" and record.get("switchSent"), record  # intent before the call
    engines.release_switches(took_effect=took_effect)
    start_operator(**held)

    wait_until(lambda: settled(kube_cluster, namespace, "held", 2, 1), 60, "the conversion to complete")
    pods = instance_pods(kube_cluster, namespace, "held")
    assert placement(pods) == before, "a pod was lost, duplicated or moved"
    sent = 1 if took_effect else 2  # the second POST only because the first never arrived
    assert engines.switch_calls == [(victim, "prefill")] * sent
    assert engines.roles[victim] == "prefill"
    assert sum(conversions(p) for p in pods) == 1
    converted = events(kube_cluster, namespace, "Converted")
    assert len(converted) == 1 and victim in converted[0], converted


def test_restart_switch_recreates_the_pod_with_its_name_on_its_node(
    kube_cluster: LocalCluster, namespace: str, start_operator: OperatorFactory, engines: EngineStub
) -> None:
    start_operator()
    spec: dict[str, Any] = {"engine": {"image": "custom:1", "type": "custom", "command": ["serve"]}}
    before = start_pdd(kube_cluster, namespace, "rst", engines, in_flight=0, **spec)

    patch_spec(kube_cluster, namespace, "rst", {"prefill": {"replicas": 2}, "decode": {"replicas": 1}})
    wait_until(lambda: settled(kube_cluster, namespace, "rst", 2, 1), 90, "restart-switched conversion")
    pods = {p["metadata"]["name"]: p for p in instance_pods(kube_cluster, namespace, "rst")}
    after = placement(list(pods.values()))
    assert set(after) == set(before), "the recreated instance keeps its name"
    restarted = [name for name in before if after[name][0] != before[name][0]]
    assert len(restarted) == 1, "exactly one pod was recreated"
    name = restarted[0]
    assert after[name][1] == before[name][1], "on the node it ran on"
    assert pods[name]["metadata"]["labels"]["xpyd.dev/role"] == "prefill"
    assert pods[name]["spec"]["containers"][0]["env"][0]["name"] == "XPYD_ROLE"
    assert conversions(pods[name]) == 1
    assert len(events(kube_cluster, namespace, "Converted")) == 1


def _router_pools(cluster: LocalCluster, namespace: str, name: str) -> dict[str, str]:
    """The router's pools as its `GET /workers` lists them: engine host -> worker type (healthy ones)."""
    router = get_router_pod(cluster, namespace, name)
    if not router or not (router.get("status") or {}).get("podIP"):
        return {}
    try:
        url = f"http://{router['status']['podIP']}:8000/workers"
        with urllib.request.urlopen(url, timeout=5) as response:
            workers = json.loads(response.read())["workers"]
    except (urllib.error.URLError, OSError, ValueError, KeyError):
        return {}
    return {
        w["url"].split("//")[1].rsplit(":", 1)[0]: w["worker_type"]
        for w in workers
        if w.get("is_healthy", True)
    }


def get_router_pod(cluster: LocalCluster, namespace: str, name: str) -> dict[str, Any] | None:
    selector = f"xpyd.dev/pdd={name},xpyd.dev/component=router"
    pods = json.loads(cluster.kubectl("get", "pods", "-n", namespace, "-l", selector, "-o", "json").stdout)
    return pods["items"][0] if pods["items"] else None


def _pools_by_pod(cluster: LocalCluster, namespace: str, name: str) -> dict[str, str]:
    pools = _router_pools(cluster, namespace, name)
    pods = instance_pods(cluster, namespace, name)
    return {p["metadata"]["name"]: pools.get((p.get("status") or {}).get("podIP") or "", "") for p in pods}


def _process_role(runner: PodRunner, pod: str) -> tuple[int, str | None] | None:
    started = runner.process_of(pod)
    return None if started is None else (started.process.pid, started.role)


def test_in_place_switch_restarts_the_engine_in_its_pod_behind_the_real_router(
    kube_cluster: LocalCluster, namespace: str, start_operator: OperatorFactory, tmp_path: Path
) -> None:
    """switchMethod InPlace on engine stand-ins run as a kubelet would (e2e/harness/pods.py restarts a
    container whose role label changed, with env from the new labels): a decode instance becomes prefill
    in the same pod (uid, node, IP), its engine process restarted once with XPYD_ROLE prefill and
    kv_role kv_producer, and the real vllm-router moves it to the prefill pool."""
    start_operator(XPYD_PROBE_POD_IP="true")
    with running_pods(kube_cluster, namespace, tmp_path / "pods") as runner:
        body = manifest(
            "inplace",
            engine={"image": "xpyd-standin:dev", "command": list(STANDIN_COMMAND), "port": 8100},
            router={"image": "vllm-router:test", "port": 8000, "args": ["--policy", "round_robin"]},
            prefill={"replicas": 1},
            decode={"replicas": 2},
            conversion={"switchMethod": "InPlace", "kvLeaseSeconds": 1, "drainTimeoutSeconds": 60},
        )
        apply(kube_cluster, namespace, body)
        wait_ready(kube_cluster, namespace, "inplace", timeout=120)
        serving = {"inplace-0": "prefill", "inplace-1": "decode", "inplace-2": "decode"}
        roles_now = roles(instance_pods(kube_cluster, namespace, "inplace"))
        wait_until(
            lambda: _pools_by_pod(kube_cluster, namespace, "inplace") == roles_now,
            120,
            "the router lists every instance in its pool",
        )
        assert sorted(roles_now.values()) == sorted(serving.values())
        pods = instance_pods(kube_cluster, namespace, "inplace")
        before = {
            p["metadata"]["name"]: (p["metadata"]["uid"], p["spec"]["nodeName"], p["status"]["podIP"])
            for p in pods
        }
        processes = {name: _process_role(runner, name) for name in before}

        patch_spec(
            kube_cluster, namespace, "inplace", {"prefill": {"replicas": 2}, "decode": {"replicas": 1}}
        )
        wait_until(lambda: settled(kube_cluster, namespace, "inplace", 2, 1), 120, "one decode -> prefill")
        pods = instance_pods(kube_cluster, namespace, "inplace")
        after = {
            p["metadata"]["name"]: (p["metadata"]["uid"], p["spec"]["nodeName"], p["status"]["podIP"])
            for p in pods
        }
        assert after == before  # the same pods, where they were: nothing deleted or created
        converted = next(p for p in pods if conversions(p) == 1)
        name = converted["metadata"]["name"]
        assert roles_now[name] == "decode"
        labels = converted["metadata"]["labels"]
        assert (labels["xpyd.dev/role"], labels["xpyd.dev/kv-role"]) == ("prefill", "kv_producer")
        assert converted["status"]["containerStatuses"][0]["restartCount"] == 1
        wait_until(lambda: _process_role(runner, name) is not None, 30, f"{name}'s new process")
        pid, role = _process_role(runner, name) or (0, None)
        assert pid != (processes[name] or (0, None))[0] and role == "prefill"
        started = runner.process_of(name)
        assert started is not None
        kv_config = json.loads(started.argv[started.argv.index("--kv-transfer-config") + 1])
        assert kv_config["kv_role"] == "kv_producer"
        for other in set(before) - {name}:  # the others kept their processes
            assert _process_role(runner, other) == processes[other]
        final = roles(pods)
        wait_until(
            lambda: _pools_by_pod(kube_cluster, namespace, "inplace") == final,
            60,
            "the router lists the converted instance in the prefill pool",
        )
        assert any(name in message for message in events(kube_cluster, namespace, "Converted"))
