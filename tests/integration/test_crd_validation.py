"""The PDDeployment CRD on a real API server: installs, defaults, and rejects bad objects by field."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from e2e.harness.cluster import LocalCluster
from tests.integration.pdd import ROOT, manifest

SAMPLES = sorted((ROOT / "crds" / "samples").glob("*.yaml"))

pytestmark = [pytest.mark.cluster, pytest.mark.usefixtures("pdd_crd")]


def server_create(cluster: LocalCluster, namespace: str, body: dict[str, Any], dry_run: bool = True) -> Any:
    args = ["create", "-n", namespace, "-f", "-", "-o", "json"]
    return cluster.kubectl(
        *args, *(["--dry-run=server"] if dry_run else []), check=False, input=json.dumps(body)
    )


def test_crd_is_established_with_short_name_and_columns(kube_cluster: LocalCluster, pdd_crd: str) -> None:
    resources = kube_cluster.kubectl("api-resources", "--api-group=xpyd.dev", "-o", "wide").stdout
    assert "pdd" in resources and "PDDeployment" in resources
    crd = json.loads(kube_cluster.kubectl("get", "crd", pdd_crd, "-o", "json").stdout)
    columns = [c["name"] for c in crd["spec"]["versions"][0]["additionalPrinterColumns"]]
    assert columns == ["Prefill", "Decode", "Mode", "Converting", "Age"]


@pytest.mark.parametrize("sample", SAMPLES, ids=lambda p: p.stem)
def test_samples_are_accepted(kube_cluster: LocalCluster, namespace: str, sample: Path) -> None:
    result = server_create(kube_cluster, namespace, yaml.safe_load(sample.read_text()))
    assert result.returncode == 0, result.stderr


def test_api_server_applies_defaults(kube_cluster: LocalCluster, namespace: str) -> None:
    result = server_create(kube_cluster, namespace, manifest())
    assert result.returncode == 0, result.stderr
    spec = json.loads(result.stdout)["spec"]
    assert spec["prefill"]["replicas"] == 1 and spec["decode"]["maxReplicas"] == 64
    assert spec["engine"]["type"] == "vllm" and spec["engine"]["port"] == 8000
    assert spec["conversion"] == {
        "enabled": True,
        "drainTimeoutSeconds": 60,
        "kvLeaseSeconds": 30,
        "switchMethod": "Auto",
        "switchPath": "/pd_role_switch",
    }
    assert spec["autoscaling"]["mode"] == "Off" and spec["slo"]["ttftSeconds"] == 0.6
    assert spec["rollout"] == {"maxSurge": 1, "maxUnavailable": 0}


INVALID: list[tuple[str, dict[str, Any], str]] = [
    (
        "replicas above max",
        manifest(prefill={"replicas": 5, "maxReplicas": 4}),
        "spec.prefill.replicas: Invalid value: replicas must be less than or equal to maxReplicas",
    ),
    (
        "replicas below min",
        manifest(decode={"replicas": 1, "minReplicas": 2}),
        "spec.decode.replicas: Invalid value: replicas must be greater than or equal to minReplicas",
    ),
    ("ttft not positive", manifest(slo={"ttftSeconds": 0}), "spec.slo.ttftSeconds must be greater than 0"),
    ("tpot negative", manifest(slo={"tpotSeconds": -0.1}), "spec.slo.tpotSeconds must be greater than 0"),
    ("attainment above 1", manifest(slo={"attainment": 1.5}), "spec.slo.attainment must be in (0, 1]"),
    (
        "conversion between incompatible roles",
        manifest(prefill={"gpusPerInstance": 2}),
        "spec.conversion.enabled requires scheduling-compatible roles",
    ),
    (
        "routing switch on sglang",
        manifest(engine={"image": "s:1", "type": "sglang"}, conversion={"switchMethod": "Routing"}),
        "spec.conversion.switchMethod Routing needs instances that serve both roles",
    ),
    (
        "routing switch on vllm with a connector that acts on kv_role",
        manifest(
            engine={"image": "v:1", "kvConnector": "MooncakeConnector"},
            conversion={"switchMethod": "Routing"},
        ),
        "needs instances that serve both roles: vLLM with kvConnector NixlConnector",
    ),
    (
        "vllm connector that vllm-router does not speak",
        manifest(engine={"image": "v:1", "kvConnector": "LMCacheConnectorV1"}),
        "spec.engine.kvConnector: Invalid value: spec.engine.kvConnector: vllm-router speaks only NixlConnector",
    ),
    (
        "router without image",
        {**manifest(), "spec": {**manifest()["spec"], "router": {"type": "sglang-router"}}},
        "spec.router.image is required",
    ),
    (
        "rollout that can never progress",
        manifest(rollout={"maxSurge": 0, "maxUnavailable": 0}),
        "spec.rollout.maxSurge and spec.rollout.maxUnavailable cannot both be 0",
    ),
    (
        "autoscaling without prometheus",
        manifest(autoscaling={"mode": "Auto"}),
        "spec.autoscaling.prometheus is required when spec.autoscaling.mode is Advisory or Auto",
    ),
    (
        "unknown engine",
        manifest(engine={"image": "x", "type": "tgi"}),
        'spec.engine.type: Unsupported value: "tgi": supported values: "vllm", "sglang", "custom"',
    ),
    ("missing model", {**manifest(), "spec": {"engine": {"image": "x"}}}, "spec.model: Required value"),
    (
        "zero GPUs per instance",
        manifest(prefill={"gpusPerInstance": 0}, decode={"gpusPerInstance": 0}),
        "spec.prefill.gpusPerInstance: Invalid value: 0: spec.prefill.gpusPerInstance in body should be "
        "greater than or equal to 1",
    ),
    (
        "custom engine without command",
        manifest(engine={"image": "x", "type": "custom"}),
        "spec.engine.command is required when spec.engine.type is custom",
    ),
    (
        "MLA dimension alone",
        manifest(model={"name": "m", "kvLatentDim": 512}),
        "spec.model.kvLatentDim and spec.model.ropeDim must be set together",
    ),
    (
        "prometheus URL without scheme",
        manifest(autoscaling={"mode": "Advisory", "prometheus": {"url": "prom:9090"}}),
        "spec.autoscaling.prometheus.url in body should match '^https?://",
    ),
    (
        "name too long for pod names",
        manifest(name="x" * 51),
        "metadata.name must be at most 50 characters",
    ),
    # Inputs the operator could not run, which the CRD refuses (each error names the field):
    (
        "huge replicas",
        manifest(prefill={"replicas": 2147483647, "maxReplicas": 2147483647}),
        "spec.prefill.maxReplicas",
    ),
    ("name with dots (a Service name)", manifest(name="a.b"), "metadata.name must be a DNS-1035 label"),
    (
        "env name with space",
        manifest(engine={"image": "x", "env": [{"name": "1 BAD="}]}),
        "spec.engine.env[0].name",
    ),
    (
        "memory not a quantity",
        manifest(prefill={"resources": {"limits": {"memory": "lots"}}}),
        "spec.prefill.resources.limits.memory",
    ),
    (
        "negative cpu",
        manifest(prefill={"resources": {"requests": {"cpu": "-1"}}}),
        "spec.prefill.resources.requests.cpu",
    ),
    (
        "request above limit",
        manifest(decode={"resources": {"requests": {"memory": "2Gi"}, "limits": {"memory": "1Gi"}}}),
        "a resource request must not exceed its limit",
    ),
    (
        "node selector key with space",
        manifest(prefill={"nodeSelector": {"bad key!": "x"}}),
        "nodeSelector keys must be label keys",
    ),
    (
        "affinity of the wrong shape",
        manifest(
            affinity={
                "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": []}}
            }
        ),
        "nodeSelectorTerms",
    ),
    ("empty router image", manifest(router={"image": ""}), "spec.router.image"),
    (
        "router account not a name",
        manifest(router={"image": "r", "serviceAccountName": "Admin!"}),
        "spec.router.serviceAccountName",
    ),
    (
        "switch path with a host",
        manifest(conversion={"switchPath": "@evil.example/x"}),
        "spec.conversion.switchPath",
    ),
    (
        "prometheus URL with user info",
        manifest(autoscaling={"prometheus": {"url": "http://a@b:9090"}}),
        "spec.autoscaling.prometheus.url",
    ),
]


@pytest.mark.parametrize(("title", "body", "message"), INVALID, ids=[case[0] for case in INVALID])
def test_invalid_manifest_is_rejected_naming_the_field(
    kube_cluster: LocalCluster, namespace: str, title: str, body: dict[str, Any], message: str
) -> None:
    result = server_create(kube_cluster, namespace, body)
    assert result.returncode != 0, f"{title}: accepted"
    assert message in result.stderr, result.stderr


def test_engine_type_is_immutable(kube_cluster: LocalCluster, namespace: str) -> None:
    created = server_create(kube_cluster, namespace, manifest(name="immutable"), dry_run=False)
    assert created.returncode == 0, created.stderr
    changed = copy.deepcopy(manifest(name="immutable", engine={"image": "x", "type": "sglang"}))
    changed["spec"]["conversion"] = {"switchMethod": "HTTP"}
    result = kube_cluster.kubectl("apply", "-n", namespace, "-f", "-", check=False, input=json.dumps(changed))
    assert result.returncode != 0
    assert "spec.engine.type is immutable" in result.stderr, result.stderr
