"""The operator on the real local cluster: create, scale, rolling update, garbage collection.

Each test runs its own operator subprocess watching only its namespace (the namespaced mode), stopped in
teardown whatever happens. Engines are `EngineStub` endpoints on 127.0.0.1, reached through pod
annotations; the operator never talks to pod IPs (XPYD_PROBE_POD_IP=false).
"""

from __future__ import annotations

import json
import time

import pytest
from e2e.harness.cluster import LocalCluster
from e2e.harness.procs import wait_until
from tests.integration.pdd import (
    OperatorFactory,
    apply,
    events,
    get_json,
    instance_pods,
    manifest,
    patch_spec,
    point_at_engines,
    roles,
    wait_ready,
)

from xpyd_api.models import parse_pdd
from xpyd_api.names import Role
from xpyd_operator.core import render
from xpyd_operator.testing import EngineStub

pytestmark = [pytest.mark.cluster, pytest.mark.usefixtures("pdd_crd")]


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
        assert kv_config == {
            "kv_connector": "NixlConnector",
            "kv_role": "kv_both",
            "kv_connector_extra_config": {"kv_lease_duration": 30},
        }

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
    # a 1 s KV lease: the busiest-kept rule is the subject here (the lease: test_operator_conversion)
    conversion = {"drainTimeoutSeconds": 30, "kvLeaseSeconds": 1}
    apply(kube_cluster, namespace, manifest("scale", conversion=conversion))
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
