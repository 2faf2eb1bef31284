"""The harness's cluster is real Kubernetes: controllers, scheduler, kwok nodes and API validation work."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from e2e.harness import LocalCluster

pytestmark = pytest.mark.cluster

CEL_CRD = """apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.smoke.xpyd.dev
spec:
  group: smoke.xpyd.dev
  scope: Namespaced
  names: {plural: widgets, singular: widget, kind: Widget}
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            required: [min, max]
            x-kubernetes-validations:
            - rule: "self.min <= self.max"
              message: "spec.min must be less than or equal to spec.max"
            properties:
              min: {type: integer, minimum: 0}
              max: {type: integer}
"""


def _widget(name: str, low: int, high: int) -> str:
    return json.dumps(
        {
            "apiVersion": "smoke.xpyd.dev/v1",
            "kind": "Widget",
            "metadata": {"name": name},
            "spec": {"min": low, "max": high},
        }
    )


def test_apiserver_reports_the_pinned_version(kube_cluster: LocalCluster) -> None:
    version = json.loads(kube_cluster.kubectl("get", "--raw", "/version").stdout)
    assert version["gitVersion"].startswith("v1.36.")
    assert version["major"] == "1" and version["minor"] == "36"


def test_fake_nodes_are_ready_with_loopback_addresses(kube_cluster: LocalCluster) -> None:
    nodes = json.loads(kube_cluster.kubectl("get", "nodes", "-o", "json").stdout)["items"]
    assert len(nodes) == len(kube_cluster.nodes) >= 1
    for node in nodes:
        ready = {c["type"]: c["status"] for c in node["status"]["conditions"]}["Ready"]
        assert ready == "True"
        assert {a["address"] for a in node["status"]["addresses"] if a["type"] == "InternalIP"} == {
            "127.0.0.1"
        }


def test_deployment_pods_become_running_on_kwok_nodes(kube_cluster: LocalCluster, namespace: str) -> None:
    kube_cluster.kubectl(
        "-n", namespace, "create", "deployment", "smoke", "--image=registry.invalid/none:1", "--replicas=3"
    )
    kube_cluster.kubectl(
        "-n", namespace, "rollout", "status", "deployment/smoke", "--timeout=120s", timeout=150
    )
    pods = json.loads(
        kube_cluster.kubectl("-n", namespace, "get", "pods", "-l", "app=smoke", "-o", "json").stdout
    )["items"]
    assert len(pods) == 3
    for pod in pods:
        assert pod["status"]["phase"] == "Running"
        assert pod["spec"]["nodeName"] in kube_cluster.nodes


def test_crd_with_cel_rule_rejects_invalid_objects(
    kube_cluster: LocalCluster, namespace: str, tmp_path: Path
) -> None:
    crd = tmp_path / "widgets.yaml"
    crd.write_text(CEL_CRD)
    assert kube_cluster.install_crd(crd) == "widgets.smoke.xpyd.dev"
    try:
        # Established can precede the REST mapping in discovery by a moment; retry the valid create briefly.
        for _ in range(50):
            ok = kube_cluster.kubectl(
                "-n", namespace, "create", "-f", "-", input=_widget("good", 1, 2), check=False
            )
            if ok.returncode == 0:
                break
            time.sleep(0.2)
        assert ok.returncode == 0, ok.stderr

        cel = kube_cluster.kubectl(
            "-n", namespace, "create", "-f", "-", input=_widget("bad", 5, 2), check=False
        )
        assert cel.returncode != 0
        assert "spec.min must be less than or equal to spec.max" in cel.stderr

        schema = kube_cluster.kubectl(
            "-n", namespace, "create", "-f", "-", input=_widget("neg", -1, 2), check=False
        )
        assert schema.returncode != 0
        assert "spec.min" in schema.stderr and "should be greater than or equal to 0" in schema.stderr

        names = kube_cluster.kubectl("-n", namespace, "get", "widgets", "-o", "name").stdout.split()
        assert names == ["widget.smoke.xpyd.dev/good"]
    finally:
        kube_cluster.kubectl("delete", "crd", "widgets.smoke.xpyd.dev", "--wait=false", check=False)


@pytest.mark.parametrize("component", ["kube-controller-manager", "kube-scheduler"])
def test_single_replica_components_run_without_leader_election(
    kube_cluster: LocalCluster, component: str
) -> None:
    """A starved component that misses its lease renewal exits under leader election (seen when the
    real-vLLM group loaded both cores: no default ServiceAccount in new namespaces afterwards)."""
    if kube_cluster.pids_dir is None:
        pytest.skip(f"{kube_cluster.provider}: its components are not local processes")
    pid = kube_cluster.component_pid(component)
    args = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    elections = [arg for arg in args if arg.startswith("--leader-elect=")]
    assert elections and elections[-1] == "--leader-elect=false", elections
