"""The operator on the real local cluster: create, scale, rolling update, garbage collection.

Each test runs its own operator subprocess watching only its namespace (the namespaced mode), stopped in
teardown whatever happens. Engines are `EngineStub` endpoints on 127.0.0.1, reached through pod
annotations; the operator never talks to pod IPs (XPYD_PROBE_POD_IP=false).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e.harness.cluster import LocalCluster
from e2e.harness.procs import wait_until
from tests.integration.test_crd_validation import manifest, pdd_crd

from xpyd_api.models import parse_pdd
from xpyd_api.names import ANNOTATION_ENGINE_URL, Role
from xpyd_operator import render
from xpyd_operator.testing import EngineStub, OperatorProcess

pytestmark = [pytest.mark.cluster, pytest.mark.usefixtures("pdd_crd")]
__all__ = ["pdd_crd"]  # re-exported fixture

FAST_SETTINGS = {"XPYD_RESYNC_SECONDS": "2", "XPYD_ACTIVE_POLL_SECONDS": "0.3"}
OperatorFactory = Callable[[], OperatorProcess]


@pytest.fixture
def start_operator(
    kube_cluster: LocalCluster, namespace: str, tmp_path: Path
) -> Iterator[Callable[[], OperatorProcess]]:
    """Starts operator processes for this test's namespace; every one is stopped at teardown."""
    started: list[OperatorProcess] = []

    def start() -> OperatorProcess:
        process = OperatorProcess(kube_cluster.env(), tmp_path / "operator.log", [namespace], FAST_SETTINGS)
        process.start()
        started.append(process)
        return process

    yield start
    for process in started:
        process.kill()
    if started:
        print(f"--- operator log ---\n{started[-1].log_tail(120)}")


@pytest.fixture
def engines() -> Iterator[EngineStub]:
    with EngineStub() as stub:
        yield stub


def apply(cluster: LocalCluster, namespace: str, body: dict[str, Any]) -> None:
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(body))


def patch_spec(cluster: LocalCluster, namespace: str, name: str, spec: dict[str, Any]) -> None:
    cluster.kubectl("patch", "pdd", name, "-n", namespace, "--type=merge", "-p", json.dumps({"spec": spec}))


def get_json(cluster: LocalCluster, *args: str) -> Any:
    return json.loads(cluster.kubectl("get", *args, "-o", "json").stdout)


def instance_pods(cluster: LocalCluster, namespace: str, name: str) -> list[dict[str, Any]]:
    selector = f"xpyd.dev/pdd={name},xpyd.dev/component=instance"
    pods: list[dict[str, Any]] = get_json(cluster, "pods", "-n", namespace, "-l", selector)["items"]
    return pods


def is_ready(pdd: dict[str, Any]) -> bool:
    conditions = (pdd.get("status") or {}).get("conditions") or []
    generation = pdd["metadata"]["generation"]
    return (pdd.get("status") or {}).get("observedGeneration") == generation and any(
        c["type"] == "Ready" and c["status"] == "True" for c in conditions
    )


def wait_ready(cluster: LocalCluster, namespace: str, name: str, timeout: float = 90) -> dict[str, Any]:
    wait_until(lambda: is_ready(get_json(cluster, "pdd", name, "-n", namespace)), timeout, f"{name} Ready")
    pdd: dict[str, Any] = get_json(cluster, "pdd", name, "-n", namespace)
    return pdd


def roles(pods: list[dict[str, Any]]) -> dict[str, str]:
    return {p["metadata"]["name"]: p["metadata"]["labels"]["xpyd.dev/role"] for p in pods}


def point_at_engines(
    cluster: LocalCluster, namespace: str, stub: EngineStub, pods: list[dict[str, Any]]
) -> None:
    for pod in pods:
        pod_name = pod["metadata"]["name"]
        annotation = f"{ANNOTATION_ENGINE_URL}={stub.url(pod_name)}"
        cluster.kubectl("annotate", "pod", pod_name, "-n", namespace, "--overwrite", annotation)


def events(cluster: LocalCluster, namespace: str, reason: str) -> list[str]:
    items = get_json(cluster, "events", "-n", namespace, "--field-selector", f"reason={reason}")["items"]
    return [item["message"] for item in items]


def test_create_runs_instances_router_and_reports_status(
    kube_cluster: LocalCluster, namespace: str, start_operator: OperatorFactory
) -> None:
    start_operator()
    body = manifest("web", prefill={"replicas": 1}, decode={"replicas": 2})
    apply(kube_cluster, namespace, body)
    pdd = wait_ready(kube_cluster, namespace, "web")

    pods = instance_pods(kube_cluster, namespace, "web")
    assert sorted(roles(pods).values()) == ["decode", "decode", "prefill"]
    parsed = parse_pdd(pdd)
    for pod in pods:
        labels = pod["metadata"]["labels"]
        assert pod["status"]["phase"] == "Running"
        assert pod["spec"]["nodeName"] in kube_cluster.nodes
        assert labels["xpyd.dev/serving"] == "true"
        assert labels["xpyd.dev/template-hash"] == render.template_hash(
            parsed.spec, Role(labels["xpyd.dev/role"])
        )
        assert pod["metadata"]["ownerReferences"][0]["uid"] == pdd["metadata"]["uid"]
        args = pod["spec"]["containers"][0]["args"]
        kv_config = json.loads(args[args.index("--kv-transfer-config") + 1])
        assert kv_config == {"kv_connector": "NixlConnector", "kv_role": "kv_both"}

    for role in ("prefill", "decode"):
        service = get_json(kube_cluster, "service", f"web-{role}", "-n", namespace)
        assert service["spec"]["clusterIP"] == "None"
        assert service["spec"]["selector"]["xpyd.dev/role"] == role
    router = get_json(kube_cluster, "deployment", "web-router", "-n", namespace)
    assert "--service-discovery" in router["spec"]["template"]["spec"]["containers"][0]["args"]
    assert pdd["status"]["router"]["readyReplicas"] == 1

    table = kube_cluster.kubectl("get", "pdd", "web", "-n", namespace).stdout
    header, row = table.splitlines()[:2]
    assert header.split()[:5] == ["NAME", "PREFILL", "DECODE", "MODE", "CONVERTING"]
    assert row.split()[:5] == ["web", "1/1", "2/2", "Off", "0"]
    assert len(events(kube_cluster, namespace, "Created")) == 3


def test_scale_up_then_down_keeps_the_busiest(
    kube_cluster: LocalCluster, namespace: str, start_operator: OperatorFactory, engines: EngineStub
) -> None:
    start_operator()
    apply(kube_cluster, namespace, manifest("scale", conversion={"drainTimeoutSeconds": 30}))
    wait_ready(kube_cluster, namespace, "scale")
    patch_spec(kube_cluster, namespace, "scale", {"prefill": {"replicas": 3}})
    pdd = wait_ready(kube_cluster, namespace, "scale")
    assert pdd["status"]["prefill"]["summary"] == "3/3"

    pods = instance_pods(kube_cluster, namespace, "scale")
    prefill = sorted(name for name, role in roles(pods).items() if role == "prefill")
    busiest = prefill[1]
    for name in prefill:
        engines.set_in_flight(name, 9 if name == busiest else 0)
    point_at_engines(kube_cluster, namespace, engines, pods)
    patch_spec(kube_cluster, namespace, "scale", {"prefill": {"replicas": 1}})
    wait_until(
        lambda: (
            sorted(roles(instance_pods(kube_cluster, namespace, "scale")).values()) == ["decode", "prefill"]
        ),
        60,
        "scale-in to one prefill instance",
    )
    remaining = [
        n for n, r in roles(instance_pods(kube_cluster, namespace, "scale")).items() if r == "prefill"
    ]
    assert remaining == [busiest]
    deleted = events(kube_cluster, namespace, "Deleted")
    assert sorted(m.split()[3] for m in deleted) == sorted(set(prefill) - {busiest})
    assert all("drained (idle)" in m for m in deleted)


def test_deleted_instance_is_replaced(
    kube_cluster: LocalCluster, namespace: str, start_operator: OperatorFactory
) -> None:
    start_operator()
    apply(kube_cluster, namespace, manifest("heal", decode={"replicas": 2}))
    wait_ready(kube_cluster, namespace, "heal")
    victim = next(
        p for p in instance_pods(kube_cluster, namespace, "heal") if "decode" in roles([p]).values()
    )
    kube_cluster.kubectl("delete", "pod", victim["metadata"]["name"], "-n", namespace, "--wait=false")

    def replaced() -> bool:
        pods = instance_pods(kube_cluster, namespace, "heal")
        uids = {p["metadata"]["uid"] for p in pods if not p["metadata"].get("deletionTimestamp")}
        return victim["metadata"]["uid"] not in uids and sorted(roles(pods).values()) == [
            "decode",
            "decode",
            "prefill",
        ]

    wait_until(replaced, 60, "a replacement decode instance")
    assert wait_ready(kube_cluster, namespace, "heal")["status"]["decode"]["summary"] == "2/2"


def test_template_change_rolls_every_instance(
    kube_cluster: LocalCluster, namespace: str, start_operator: OperatorFactory
) -> None:
    start_operator()
    body = manifest("roll", prefill={"replicas": 2}, conversion={"drainTimeoutSeconds": 1})
    apply(kube_cluster, namespace, body)
    wait_ready(kube_cluster, namespace, "roll")
    before = {p["metadata"]["uid"] for p in instance_pods(kube_cluster, namespace, "roll")}

    patch_spec(kube_cluster, namespace, "roll", {"engine": {"args": ["--max-model-len", "8192"]}})
    pdd = wait_ready(kube_cluster, namespace, "roll", timeout=120)
    wanted = render.template_hash(parse_pdd(pdd).spec, Role.PREFILL)

    def rolled() -> bool:
        pods = instance_pods(kube_cluster, namespace, "roll")
        live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
        return len(live) == 3 and all(
            p["metadata"]["labels"]["xpyd.dev/template-hash"] == wanted for p in live
        )

    wait_until(rolled, 120, "every instance on the new template")
    after = instance_pods(kube_cluster, namespace, "roll")
    assert not before & {p["metadata"]["uid"] for p in after}, "every old instance was replaced"
    assert all("--max-model-len" in p["spec"]["containers"][0]["args"] for p in after)
    status = get_json(kube_cluster, "pdd", "roll", "-n", namespace)["status"]
    assert status["prefill"]["updated"] == 2 and status["decode"]["updated"] == 1


def test_delete_garbage_collects_everything(
    kube_cluster: LocalCluster, namespace: str, start_operator: OperatorFactory
) -> None:
    start_operator()
    apply(kube_cluster, namespace, manifest("gone"))
    wait_ready(kube_cluster, namespace, "gone")
    kube_cluster.kubectl("delete", "pdd", "gone", "-n", namespace, "--timeout=60s")

    def nothing_left() -> bool:
        owned = get_json(
            kube_cluster, "pods,services,deployments", "-n", namespace, "-l", "xpyd.dev/pdd=gone"
        )
        return not owned["items"]

    wait_until(nothing_left, 90, "owned pods, services and the router to be garbage-collected")


def test_namespaced_operator_leaves_other_namespaces_alone(
    kube_cluster: LocalCluster, namespace: str, start_operator: OperatorFactory
) -> None:
    start_operator()  # watches `namespace` only
    other = f"{namespace}-other"
    kube_cluster.kubectl("create", "namespace", other)
    try:
        apply(kube_cluster, other, manifest("elsewhere"))
        apply(kube_cluster, namespace, manifest("here"))
        wait_ready(kube_cluster, namespace, "here")
        time.sleep(3)  # several reconcile periods of the operator (XPYD_RESYNC_SECONDS=2)
        assert not instance_pods(kube_cluster, other, "elsewhere")
        assert "status" not in get_json(kube_cluster, "pdd", "elsewhere", "-n", other)
    finally:
        kube_cluster.kubectl("delete", "namespace", other, "--wait=false", check=False)
