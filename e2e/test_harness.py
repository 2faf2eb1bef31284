"""The harness cleans up after itself: no component outlives its context, even on Ctrl-C or failure."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from e2e.harness import ClusterError, LocalCluster, cluster_provider, start_cluster, start_prometheus
from e2e.harness.cluster import KWOK_CREATE_ATTEMPTS, _create_kwok_cluster, _existing_cluster
from e2e.harness.procs import kill_pid, pid_alive, pids_in, wait_until
from e2e.harness.prometheus import pod_monitor_scrape_config, scrape_config


@pytest.mark.cluster
def test_interrupted_cluster_is_torn_down_completely() -> None:
    seen: dict[str, object] = {}
    with pytest.raises(KeyboardInterrupt), start_cluster(nodes=1) as cluster:
        assert cluster.logs_dir is not None
        workdir = cluster.logs_dir.parents[2]
        seen.update(pids=pids_in(workdir), workdir=workdir)
        assert cluster.kubectl("get", "nodes", "-o", "name").stdout.split() == ["node/kwok-node-0"]
        raise KeyboardInterrupt  # what Ctrl-C does in the middle of a test run
    pids = seen["pids"]
    assert isinstance(pids, list) and len(pids) >= 5  # etcd, apiserver, controller-manager, scheduler, kwok
    assert [pid for pid in pids if pid_alive(pid)] == []
    assert not Path(str(seen["workdir"])).exists()


@pytest.mark.prometheus
def test_prometheus_is_stopped_on_exit() -> None:
    with start_prometheus(scrape_config([])) as prom:
        pid = prom.pid
        assert pid_alive(pid)
    assert not pid_alive(pid)


def test_unknown_provider_is_rejected_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XPYD_CLUSTER", "minikube")
    with pytest.raises(ClusterError, match=r"XPYD_CLUSTER='minikube' is not one of kwok, kind, existing"):
        cluster_provider()


@pytest.mark.cluster
def test_existing_provider_refuses_a_context_that_does_not_look_like_a_test_cluster(
    kube_cluster: LocalCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(kube_cluster.kubeconfig.read_text())
    env = {**kube_cluster.env(), "KUBECONFIG": str(kubeconfig)}
    kubectl = str(kube_cluster.bin_dir / "kubectl")
    current = subprocess.run(
        [kubectl, "config", "current-context"], env=env, capture_output=True, text=True, check=True
    )
    subprocess.run(
        [kubectl, "config", "rename-context", current.stdout.strip(), "prod-eu-1"], env=env, check=True
    )
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    with pytest.raises(ClusterError, match="refuses context 'prod-eu-1'"):
        _existing_cluster()


def _fake_kwokctl(bin_dir: Path, failures: int) -> Path:
    """A kwokctl that fails `create` the first `failures` times (as a port taken by another cluster does)
    and logs each call's verb."""
    calls = bin_dir / "calls"
    script = bin_dir / "kwokctl"
    script.write_text(
        "#!/bin/sh\n"
        f'echo "$1 $3" >> {calls}\n'
        f'if [ "$3" = create ] && [ "$(grep -c "^--config create" {calls})" -le {failures} ]; then\n'
        '  echo "bind: address already in use" >&2; exit 1\n'
        "fi\n"
    )
    script.chmod(0o755)
    return calls


@pytest.mark.parametrize(
    ("failures", "creates", "deletes", "fails"),
    [(0, 1, 0, False), (1, 2, 1, False), (KWOK_CREATE_ATTEMPTS, KWOK_CREATE_ATTEMPTS, 1, True)],
)
def test_kwok_create_retries_once_from_a_clean_slate(
    tmp_path: Path, failures: int, creates: int, deletes: int, fails: bool
) -> None:
    calls = _fake_kwokctl(tmp_path, failures)
    workdir = tmp_path / "work"
    workdir.mkdir()
    if fails:
        with pytest.raises(ClusterError, match="address already in use"):
            _create_kwok_cluster("c", workdir, dict(os.environ), tmp_path, {})
    else:
        _create_kwok_cluster("c", workdir, dict(os.environ), tmp_path, {})
    log = calls.read_text().splitlines()
    assert log.count("--config create") == creates
    assert log.count("delete --name") == deletes  # a failed start is cleaned up first


def test_kwok_create_retries_a_cluster_that_came_up_unusable(tmp_path: Path) -> None:
    """kwokctl's create succeeded but its kwok controller lost a port race: the nodes never become
    Ready, so the attempt counts as failed and the next one starts from a clean slate."""
    calls = _fake_kwokctl(tmp_path, failures=0)
    workdir = tmp_path / "work"
    workdir.mkdir()
    checks: list[int] = []

    def usable() -> None:
        checks.append(1)
        if len(checks) == 1:
            raise ClusterError("timed out waiting for the condition on nodes/kwok-node-0")

    _create_kwok_cluster("c", workdir, dict(os.environ), tmp_path, {}, usable=usable)
    log = calls.read_text().splitlines()
    assert (log.count("--config create"), log.count("delete --name"), len(checks)) == (2, 1, 2)


def test_wait_until_names_what_it_waited_for() -> None:
    with pytest.raises(TimeoutError, match="timed out after 0s waiting for the moon"):
        wait_until(lambda: False, 0.2, "the moon", interval=0.05)


def test_kill_pid_escalates_to_sigkill_for_a_process_ignoring_sigterm() -> None:
    stubborn = subprocess.Popen(["bash", "-c", "trap '' TERM; sleep 30"])
    time.sleep(0.2)  # let bash install the trap
    started = time.monotonic()
    kill_pid(stubborn.pid, grace=0.5)
    assert stubborn.wait(timeout=5) == -9
    assert time.monotonic() - started < 5


@pytest.mark.parametrize(("forbid", "exit_code"), [("1", 1), ("0", 0)])
def test_a_skipped_test_fails_the_run_only_when_skips_are_forbidden(
    tmp_path: Path, forbid: str, exit_code: int
) -> None:
    (tmp_path / "test_skips.py").write_text(
        "import pytest\n\n\ndef test_later() -> None:\n    pytest.skip('no GPU')\n"
    )
    repo = Path(__file__).resolve().parents[1]
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "e2e.harness.fixtures",
            str(tmp_path),
        ],
        env={**os.environ, "XPYD_FORBID_SKIPS": forbid, "PYTHONPATH": str(repo)},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == exit_code, result.stdout
    assert ("skipped tests fail CI" in result.stdout) == (forbid == "1")


def test_a_pod_monitor_becomes_the_scrape_job_prometheus_operator_makes_of_it() -> None:
    monitor = {
        "metadata": {"name": "m"},
        "spec": {
            "selector": {"matchLabels": {"xpyd.dev/component": "instance"}},
            "podMetricsEndpoints": [
                {
                    "port": "http",
                    "path": "/metrics",
                    "relabelings": [
                        {"sourceLabels": ["__meta_kubernetes_pod_label_xpyd_dev_role"], "targetLabel": "role"}
                    ],
                }
            ],
        },
    }
    (job,) = pod_monitor_scrape_config([monitor], Path("/k/config"), "ns")["scrape_configs"]
    assert job["job_name"] == "podMonitor/ns/m/0"
    assert job["kubernetes_sd_configs"] == [
        {"role": "pod", "kubeconfig_file": "/k/config", "namespaces": {"names": ["ns"]}}
    ]
    rules = job["relabel_configs"]
    assert rules[:3] == [
        {"source_labels": ["__meta_kubernetes_pod_phase"], "regex": "(Failed|Succeeded)", "action": "drop"},
        {
            "source_labels": [
                "__meta_kubernetes_pod_label_xpyd_dev_component",
                "__meta_kubernetes_pod_labelpresent_xpyd_dev_component",
            ],
            "regex": "(instance);true",
            "action": "keep",
        },
        {"source_labels": ["__meta_kubernetes_pod_container_port_name"], "regex": "http", "action": "keep"},
    ]
    assert rules[-1] == {
        "source_labels": ["__meta_kubernetes_pod_label_xpyd_dev_role"],
        "target_label": "role",
    }
