"""Faults of the control plane under the operator, on a small kwok cluster the test owns (its etcd is
paused, so it must not be the session's shared cluster).

etcd is stopped (SIGSTOP) right after a spec change is stored, for longer than the API server's request
timeouts and the control plane's lease renewal; then it resumes and the spec changes once more. The
operator must end up at the newest spec within one resync period plus its retry delay, without losing
or duplicating a pod.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e.harness.cluster import LocalCluster, start_cluster
from e2e.harness.procs import wait_until
from tests.integration.pdd import CRD_PATH, apply, get_json, instance_pods, is_ready, manifest, patch_spec

from xpyd_operator.entry.handlers import TEMPORARY_ERROR_DELAY_SECONDS
from xpyd_operator.testing import OperatorProcess

pytestmark = [pytest.mark.cluster]

RESYNC_SECONDS = 10.0
# Longer than the operator's API read timeout (30 s) and the control plane's lease renewal (10 s).
PAUSE_SECONDS = 35.0
# After etcd answers again: a resync period, a failed pass's retry delay, and a pass of its own.
CONVERGENCE_BOUND = RESYNC_SECONDS + TEMPORARY_ERROR_DELAY_SECONDS + 5.0
NAMESPACE = "faults"


@pytest.fixture
def own_cluster() -> Iterator[LocalCluster]:
    """One node. Its scheduler and controller-manager run without leader election (the harness default),
    so the pause does not make them exit (they would lose their lease after 10 s without etcd)."""
    with start_cluster(nodes=1, name=f"xpyd-faults-{uuid.uuid4().hex[:6]}") as cluster:
        cluster.install_crd(CRD_PATH)
        cluster.kubectl("create", "namespace", NAMESPACE)
        yield cluster


@contextlib.contextmanager
def paused(pid: int) -> Iterator[None]:
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)  # always, even when the test fails inside


def _pods(cluster: LocalCluster) -> dict[str, tuple[str, str]]:
    """uid -> (name, role) of the live instance pods."""
    return {
        p["metadata"]["uid"]: (p["metadata"]["name"], p["metadata"]["labels"]["xpyd.dev/role"])
        for p in instance_pods(cluster, NAMESPACE, "steady")
        if not p["metadata"].get("deletionTimestamp")
    }


def test_after_an_etcd_pause_the_operator_reaches_the_newest_spec_within_a_resync(
    own_cluster: LocalCluster, tmp_path: Path
) -> None:
    cluster = own_cluster
    settings = {"XPYD_RESYNC_SECONDS": str(RESYNC_SECONDS), "XPYD_ACTIVE_POLL_SECONDS": "0.3"}
    with OperatorProcess(cluster.env(), tmp_path / "operator.log", [NAMESPACE], settings):
        apply(cluster, NAMESPACE, manifest("steady", conversion={"enabled": False}))
        wait_until(lambda: is_ready(_pdd(cluster)), 120, "steady Ready")
        before = _pods(cluster)
        assert len(before) == 2

        patch_spec(cluster, NAMESPACE, "steady", {"prefill": {"replicas": 3}})  # stored, then etcd stops
        with paused(cluster.component_pid("etcd")):
            time.sleep(PAUSE_SECONDS)
        resumed = time.monotonic()
        wait_until(lambda: _answers(cluster), 60, "the API server to answer again")
        answering = time.monotonic() - resumed
        patch_spec(cluster, NAMESPACE, "steady", {"decode": {"replicas": 2}})
        changed = time.monotonic()

        seen: set[str] = set(before)

        def converged() -> bool:
            pods = _pods(cluster)
            seen.update(pods)
            roles = sorted(role for _, role in pods.values())
            return roles == ["decode", "decode", "prefill", "prefill", "prefill"] and is_ready(_pdd(cluster))

        wait_until(converged, 60, "3 prefill + 2 decode pods and Ready at the newest generation")
        took = time.monotonic() - changed
        after = _pods(cluster)
        print(
            f"\netcd paused {PAUSE_SECONDS:.0f}s; API answering {answering:.1f}s after SIGCONT; "
            f"newest spec reached {took:.1f}s after its change ({time.monotonic() - resumed:.1f}s "
            f"after SIGCONT); pods created {len(seen) - len(before)}, lost {len(set(before) - set(after))}"
        )
        assert took <= CONVERGENCE_BOUND
        assert set(before) <= set(after)  # nothing lost
        assert len(seen) == len(after) == 5  # nothing created twice or replaced


def _pdd(cluster: LocalCluster) -> dict[str, object]:
    body: dict[str, object] = get_json(cluster, "pdd", "steady", "-n", NAMESPACE)
    return body


def _answers(cluster: LocalCluster) -> bool:
    try:
        return (
            cluster.kubectl("get", "pdd", "steady", "-n", NAMESPACE, check=False, timeout=20).returncode == 0
        )
    except subprocess.TimeoutExpired:
        return False
