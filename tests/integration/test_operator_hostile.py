"""Hostile PDDeployments on the real local cluster: what one tenant's object can do to the operator that
serves everybody. Huge counts are refused (and the allowed maximum is paced, memory flat, deletable); an
object the API server refuses degrades only its PDDeployment; pods carry no token and pass the
restricted Pod Security profile.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from e2e.harness.cluster import LocalCluster
from e2e.harness.procs import wait_until
from tests.integration.pdd import (
    FAST_SETTINGS,
    OperatorFactory,
    apply,
    events,
    get_json,
    instance_pods,
    manifest,
    wait_ready,
)

pytestmark = [pytest.mark.cluster, pytest.mark.usefixtures("pdd_crd")]

MIB = 1024 * 1024
RSS_BUDGET = 20 * MIB
PASS_SLACK_SECONDS = 4.0


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


def _condition(cluster: LocalCluster, namespace: str, name: str, kind: str) -> dict[str, object]:
    pdd = get_json(cluster, "pdd", name, "-n", namespace)
    conditions = (pdd.get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == kind), {})


def test_huge_counts_are_refused_and_the_maximum_is_paced_flat_and_deletable(
    kube_cluster: LocalCluster, namespace: str, start_operator: OperatorFactory
) -> None:
    huge = manifest("huge", prefill={"replicas": 2147483647, "maxReplicas": 2147483647})
    refused = kube_cluster.kubectl(
        "create", "-n", namespace, "-f", "-", "--dry-run=server", check=False, input=json.dumps(huge)
    )
    assert refused.returncode != 0 and "spec.prefill.maxReplicas" in refused.stderr, refused.stderr

    operator = start_operator()
    assert operator.process is not None
    apply(kube_cluster, namespace, manifest("calm"))
    wait_ready(kube_cluster, namespace, "calm")
    before = _rss(operator.process.pid)
    # The largest pools the CRD admits, on a node label no node has: every pod stays Pending.
    nowhere = {"nodeSelector": {"xpyd.dev/nowhere": "true"}}
    pools = {"replicas": 512, "maxReplicas": 512, **nowhere}
    apply(kube_cluster, namespace, manifest("widest", prefill=pools, decode=pools))
    peak, started = before, time.monotonic()
    counts = []
    while time.monotonic() - started < 20:
        peak = max(peak, _rss(operator.process.pid))
        counts.append(len(instance_pods(kube_cluster, namespace, "widest")))
        time.sleep(1.0)
    print(f"\noperator RSS {before / MIB:.1f} MiB -> peak {(peak) / MIB:.1f} MiB; pods per second {counts}")
    assert peak - before <= RSS_BUDGET
    assert counts[0] < counts[-1] < 1024  # created pass by pass, never all at once

    started = time.monotonic()
    kube_cluster.kubectl(
        "delete", "pdd", "widest", "-n", namespace, "--wait=true", "--timeout=60s", timeout=90
    )
    print(f"deleted in {time.monotonic() - started:.1f}s")
    assert "widest" not in kube_cluster.kubectl("get", "pdd", "-n", namespace, "-o", "name").stdout


def test_a_refused_pod_degrades_its_pdd_with_one_event_while_siblings_heal(
    kube_cluster: LocalCluster, namespace: str, start_operator: OperatorFactory
) -> None:
    """A LimitRange makes the API server refuse (403) every decode pod of `greedy`: its prefill pod is
    still made, its status says Degraded/ObjectRejected with the server's message, one Warning Event
    is posted, it is never Ready; `modest` beside it is Ready and heals a deleted pod."""
    limit = {
        "apiVersion": "v1",
        "kind": "LimitRange",
        "metadata": {"name": "cap"},
        "spec": {"limits": [{"type": "Container", "max": {"memory": "1Gi"}}]},
    }
    apply(kube_cluster, namespace, limit)
    start_operator()
    apply(kube_cluster, namespace, manifest("modest"))
    wait_ready(kube_cluster, namespace, "modest")  # the operator is up: what follows is counted in passes
    greedy = manifest(
        "greedy",
        conversion={"enabled": False},
        prefill={"resources": {"limits": {"memory": "512Mi"}}},
        decode={"resources": {"limits": {"memory": "2Gi"}}},
    )
    applied = time.monotonic()
    apply(kube_cluster, namespace, greedy)
    wait_until(
        lambda: _condition(kube_cluster, namespace, "greedy", "Degraded").get("reason") == "ObjectRejected",
        30,
        "greedy Degraded/ObjectRejected",
    )
    shown = time.monotonic() - applied
    # A new object's first pass starts at once and the next one a resync later: two passes, plus the
    # time the passes and kubectl take on a loaded 2-core machine.
    assert shown <= 2 * float(FAST_SETTINGS["XPYD_RESYNC_SECONDS"]) + PASS_SLACK_SECONDS
    degraded = _condition(kube_cluster, namespace, "greedy", "Degraded")
    assert "greedy-1" in str(degraded["message"]) and "memory" in str(degraded["message"])
    ready = _condition(kube_cluster, namespace, "greedy", "Ready")
    generation = get_json(kube_cluster, "pdd", "greedy", "-n", namespace)["metadata"]["generation"]
    assert ready["status"] == "False" and ready["observedGeneration"] == generation
    assert [p["metadata"]["name"] for p in instance_pods(kube_cluster, namespace, "greedy")] == ["greedy-0"]

    victim = instance_pods(kube_cluster, namespace, "modest")[0]["metadata"]
    kube_cluster.kubectl("delete", "pod", victim["name"], "-n", namespace, "--wait=false")

    def healed() -> bool:
        pods = instance_pods(kube_cluster, namespace, "modest")
        fresh = [
            p
            for p in pods
            if p["metadata"]["uid"] != victim["uid"] and not p["metadata"].get("deletionTimestamp")
        ]
        return len(fresh) == 2

    wait_until(healed, 30, "modest to replace its deleted pod")
    time.sleep(3)  # several more passes of greedy: still one Warning
    print(f"\nDegraded shown {shown:.1f}s after apply")
    assert len([m for m in events(kube_cluster, namespace, "ObjectRejected") if "greedy-1" in m]) == 1


def test_pods_carry_no_token_pass_restricted_pod_security_and_never_borrow_an_account(
    kube_cluster: LocalCluster, namespace: str, start_operator: OperatorFactory
) -> None:
    kube_cluster.kubectl("label", "namespace", namespace, "pod-security.kubernetes.io/enforce=restricted")
    start_operator()
    apply(kube_cluster, namespace, manifest("locked"))
    wait_ready(kube_cluster, namespace, "locked")
    for pod in instance_pods(kube_cluster, namespace, "locked"):
        spec = pod["spec"]
        assert spec["automountServiceAccountToken"] is False
        assert not [v for v in spec.get("volumes") or [] if v["name"].startswith("kube-api-access")]
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["containers"][0]["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    selector = "xpyd.dev/pdd=locked,xpyd.dev/component=router"
    routers = get_json(kube_cluster, "pods", "-n", namespace, "-l", selector)["items"]
    assert routers, "the restricted namespace admitted no router pod"
    assert routers[0]["spec"]["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}

    # A tenant naming a service account of the namespace that the operator's allow-list lacks (none here).
    kube_cluster.kubectl("create", "serviceaccount", "powerful", "-n", namespace)
    apply(kube_cluster, namespace, manifest("borrower", router={"serviceAccountName": "powerful"}))
    wait_until(
        lambda: _condition(kube_cluster, namespace, "borrower", "Degraded").get("reason") == "ObjectRejected",
        30,
        "borrower Degraded/ObjectRejected",
    )
    assert "spec.router.serviceAccountName='powerful'" in str(
        _condition(kube_cluster, namespace, "borrower", "Degraded")["message"]
    )
    deployments = get_json(kube_cluster, "deployments", "-n", namespace)["items"]
    assert [d["metadata"]["name"] for d in deployments] == ["locked-router"]  # none for borrower
    wait_until(lambda: len(instance_pods(kube_cluster, namespace, "borrower")) == 2, 30, "borrower's pods")
    pods = get_json(kube_cluster, "pods", "-n", namespace)["items"]
    assert not [p["metadata"]["name"] for p in pods if p["spec"].get("serviceAccountName") == "powerful"]
    assert all(
        p["spec"]["automountServiceAccountToken"] is False
        for p in instance_pods(kube_cluster, namespace, "borrower")
    )
