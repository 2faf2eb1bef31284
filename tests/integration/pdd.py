"""PDDeployment manifests for the cluster tests."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from e2e.harness.cluster import LocalCluster
from e2e.harness.procs import wait_until

from xpyd_api.names import ANNOTATION_ENGINE_URL
from xpyd_operator.testing import EngineStub, OperatorProcess

ROOT = Path(__file__).resolve().parents[2]
CRD_PATH = ROOT / "crds" / "pddeployments.xpyd.dev.yaml"


def spec_schema() -> dict[str, Any]:
    """The CRD's OpenAPI schema of `spec`."""
    crd = yaml.safe_load(CRD_PATH.read_text())
    schema: dict[str, Any] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return dict(schema["properties"]["spec"])


def manifest(name: str = "v", **spec: Any) -> dict[str, Any]:
    """A valid PDDeployment, with spec sections merged over the minimal one."""
    base: dict[str, Any] = {
        "model": {"name": "m"},
        "engine": {"image": "vllm:0.32.0"},
        "router": {"image": "router:1"},
    }
    for key, value in spec.items():
        base[key] = {**base.get(key, {}), **value} if isinstance(value, dict) else value
    return {
        "apiVersion": "xpyd.dev/v1alpha1",
        "kind": "PDDeployment",
        "metadata": {"name": name},
        "spec": base,
    }


FAST_SETTINGS = {"XPYD_RESYNC_SECONDS": "2", "XPYD_ACTIVE_POLL_SECONDS": "0.3"}
OperatorFactory = Callable[..., OperatorProcess]  # keyword XPYD_* settings over FAST_SETTINGS


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
    """The PDDeployment as read when it was Ready (a second read could already hold the next pass's
    status: a CI run read Ready, then decode 1/2 of the pass that saw a pod deleted)."""
    seen: list[dict[str, Any]] = []

    def ready() -> bool:
        seen[:] = [get_json(cluster, "pdd", name, "-n", namespace)]
        return is_ready(seen[0])

    wait_until(ready, timeout, f"{name} Ready")
    return seen[0]


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
