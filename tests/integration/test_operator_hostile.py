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
RSS_BUDGET = 20 * MIB  # memory stays flat: within 20 MiB over every round
MAX_REPLICAS = 512  # the CRD's maximum pool size
PACE = 64  # instance pods per pass in the huge-counts test (the default is 8)
WARM_UP_PODS = 2 * PACE  # two passes of the widest PDDeployment
FILL_TIMEOUT_SECONDS = 420.0
SETTLE_SECONDS = 10.0  # passes over the full pools after the last pod was created
PASS_SLACK_SECONDS = 4.0


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


def _pod_count(cluster: LocalCluster, namespace: str, name: str) -> int:
    """Counted from the server's table view: listing 1024 whole pods each second would load the machine."""
    selector = f"xpyd.dev/pdd={name},xpyd.dev/component=instance"
    listed = cluster.kubectl("get", "pods", "-n", namespace, "-l", selector, "--no-headers")
    return len([line for line in listed.stdout.splitlines() if line.strip()])


def _condition(cluster: LocalCluster, namespace: str, name: str, kind: str) -> dict[str, object]:
    pdd = get_json(cluster, "pdd", name, "-n", namespace)
    conditions = (pdd.get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == kind), {})


def test_huge_counts_are_refused_and_the_maximum_is_paced_flat_and_deletable(
    kube_cluster: LocalCluster, namespace: str, start_operator: OperatorFactory
) -> None:
    """The largest pools the CRD admits (2 x 512 pods) are created pass by pass, and the operator's RSS
    stays within RSS_BUDGET of what it was after the first passes while all 1024 pods exist and are
    reconciled: nothing it holds grows with the pool beyond the small parsed view of each pod."""
    huge = manifest("huge", prefill={"replicas": 2147483647, "maxReplicas": 2147483647})
    refused = kube_cluster.kubectl(
        "create", "-n", namespace, "-f", "-", "--dry-run=server", check=False, input=json.dumps(huge)
    )
    assert refused.returncode != 0 and "spec.prefill.maxReplicas" in refused.stderr, refused.stderr

    # A faster pace than the default, so the whole maximum exists within the test's time.
    operator = start_operator(XPYD_MAX_CREATES_PER_PASS=str(PACE))
    assert operator.process is not None
    pid = operator.process.pid
    apply(kube_cluster, namespace, manifest("calm"))
    wait_ready(kube_cluster, namespace, "calm")
    before = _rss(pid)
    # On a node label no node has: every pod stays Pending.
    nowhere = {"nodeSelector": {"xpyd.dev/nowhere": "true"}}
    pools = {"replicas": MAX_REPLICAS, "maxReplicas": MAX_REPLICAS, **nowhere}
    apply(kube_cluster, namespace, manifest("widest", prefill=pools, decode=pools))
    started = time.monotonic()
    counts: list[int] = []
    warm = peak = full_at = 0.0
    while time.monotonic() - started < FILL_TIMEOUT_SECONDS:
        counts.append(_pod_count(kube_cluster, namespace, "widest"))
        for _ in range(5):
            rss = _rss(pid)
            if not warm and counts[-1] >= WARM_UP_PODS:
                warm = rss  # both daemons, their threads and connections are in use by now
            peak = max(peak, rss) if warm else peak
            time.sleep(0.1)
        if counts[-1] >= 2 * MAX_REPLICAS and not full_at:
            full_at = time.monotonic()
        if full_at and time.monotonic() - full_at > SETTLE_SECONDS:
            break
    end = _rss(pid)

    def counted_by_the_operator() -> bool:  # its own paged view of the pools, in status
        status = get_json(kube_cluster, "pdd", "widest", "-n", namespace).get("status") or {}
        return all((status.get(role) or {}).get("current") == MAX_REPLICAS for role in ("prefill", "decode"))

    summary = (
        f"operator RSS before {before / MIB:.1f} MiB, after warm-up ({WARM_UP_PODS} pods) {warm / MIB:.1f}, "
        f"peak {peak / MIB:.1f}, end {end / MIB:.1f}; pods {counts[0]}..{counts[-1]} in "
        f"{time.monotonic() - started:.0f}s over {len(counts)} samples"
    )
    print(f"\n{summary}")
    assert counts[-1] == 2 * MAX_REPLICAS, summary  # all of them, none twice
    assert len({c for c in counts if c < 2 * MAX_REPLICAS}) >= 3, summary  # pass by pass, not at once
    assert peak - warm <= RSS_BUDGET, summary
    wait_until(counted_by_the_operator, 30, "widest's status to count every pod")

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
