"""The PDDeployment CRD on a real API server: installs, defaults, and rejects bad objects by field."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from e2e.harness.cluster import LocalCluster
from tests.integration.pdd import ROOT, manifest, spec_schema

from xpyd_api.errors import InputError
from xpyd_api.models import SwitchMethod, parse_pdd
from xpyd_controller.control.endpoints import METADATA_ADDRESSES, METADATA_NAMES

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
    ("ttft zero", manifest(slo={"ttftSeconds": 0}), "spec.slo.ttftSeconds must be at least 0.001 (1 ms)"),
    (
        "tpot negative",
        manifest(slo={"tpotSeconds": -0.1}),
        "spec.slo.tpotSeconds in body should be greater than or equal to 0.001",
    ),
    (
        "attainment above 1",
        manifest(slo={"attainment": 1.5}),
        "spec.slo.attainment in body should be less than or equal to 1",
    ),
    (
        "a drain that skips every drain",
        manifest(conversion={"drainTimeoutSeconds": 1e-300}),
        "spec.conversion.drainTimeoutSeconds: Invalid value: 1e-300: spec.conversion.drainTimeoutSeconds in "
        "body should be greater than or equal to 1",
    ),
    (
        "autoscaling without a model to size with",
        manifest(autoscaling={"mode": "Advisory", "prometheus": {"url": "http://prom:9090"}}),
        "spec.model: Invalid value: spec.autoscaling.mode Advisory or Auto sizes the pools from "
        "the model's architecture: it needs spec.model.preset, or spec.model.params, layers, kvHeads and headDim",
    ),
    (
        "a GPU budget below the minimum pools",
        manifest(
            prefill={"minReplicas": 2, "replicas": 2}, decode={"minReplicas": 1}, autoscaling={"gpuBudget": 2}
        ),
        "spec.autoscaling.gpuBudget must cover the minimum pools",
    ),
    (
        "autoscaling with part of a model's shape",
        manifest(
            model={"name": "m", "params": 8e9, "layers": 32, "kvHeads": 8},
            autoscaling={"mode": "Auto", "prometheus": {"url": "http://prom:9090"}},
        ),
        "spec.autoscaling.mode Advisory or Auto sizes the pools from the model's architecture",
    ),
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
        "routing switch on a vllm version read to need explicit roles",
        manifest(engine={"image": "v:1", "version": "0.35.0"}, conversion={"switchMethod": "Routing"}),
        "spec.engine.version: Invalid value: spec.engine.version: switchMethod Routing renders "
        "kv_role kv_both, which vLLM is read to take only up to 0.34",
    ),
    (
        "engine version that is no version",
        manifest(engine={"image": "v:1", "version": "latest"}),
        'spec.engine.version: Invalid value: "latest": spec.engine.version in body should match',
    ),
    (
        "unknown switch method",
        manifest(conversion={"switchMethod": "Recreate"}),
        'spec.conversion.switchMethod: Unsupported value: "Recreate": supported values: "Auto", "Routing", '
        '"HTTP", "Restart", "InPlace"',
    ),
    (
        "sglang http switch on a transfer backend that cannot switch",
        manifest(engine={"image": "s:1", "type": "sglang", "kvConnector": "nixl"}),
        "spec.engine.kvConnector: Invalid value: spec.engine.kvConnector: SGLang switches roles over "
        "HTTP (/pd_role_switch) only with the mooncake or mori transfer backend",
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


# The lowest value of every number in the spec. Durations and ratios below these are no setting (a drain
# or a KV lease under a second, a model under a million parameters, an SLO under 1 ms, a percentile below
# the median); a new numeric field fails the first test below until it is tabled here.
MINIMUMS: dict[str, float] = {
    "model.params": 1e6,
    "model.layers": 1,
    "model.kvHeads": 1,
    "model.headDim": 1,
    "model.hiddenSize": 1,
    "model.kvBytes": 0.125,  # one bit
    "model.weightBytes": 0.125,
    "model.kvLatentDim": 1,
    "model.ropeDim": 1,
    "hardware.peakFlops": 1e9,  # 1 GFLOP/s
    "hardware.mfu": 0.001,
    "hardware.hbmBandwidth": 1e9,  # 1 GB/s
    "hardware.mbu": 0.001,
    "hardware.hbmBytes": 1e9,  # 1 GB
    "hardware.linkBandwidth": 1e6,  # 1 MB/s
    "hardware.linkOverheadSeconds": 0,
    "slo.ttftSeconds": 0.001,
    "slo.tpotSeconds": 0.001,
    "slo.attainment": 0.5,
    "slo.transferBudgetSeconds": 0.001,
    "engine.port": 1,
    "engine.security.runAsUser": 0,
    "engine.security.runAsGroup": 0,
    "engine.security.fsGroup": 0,
    **{
        f"{role}.{field}": minimum
        for role in ("prefill", "decode")
        for field, minimum in (
            ("replicas", 0),
            ("minReplicas", 0),
            ("maxReplicas", 0),
            ("gpusPerInstance", 1),
            ("tolerations[].tolerationSeconds", 0),
        )
    },
    **{
        f"{holder}affinity.{kind}.preferredDuringSchedulingIgnoredDuringExecution[].weight": 1
        for holder in ("prefill.", "decode.", "")
        for kind in ("nodeAffinity", "podAffinity", "podAntiAffinity")
    },
    "router.replicas": 0,
    "router.port": 1,
    "router.security.runAsUser": 0,
    "router.security.runAsGroup": 0,
    "router.security.fsGroup": 0,
    "conversion.drainTimeoutSeconds": 1,
    "conversion.kvLeaseSeconds": 1,
    "rollout.maxSurge": 0,
    "rollout.maxUnavailable": 0,
    "autoscaling.intervalSeconds": 1,
    "autoscaling.scaleUpWindowSeconds": 0,
    "autoscaling.scaleDownWindowSeconds": 0,
    "autoscaling.scaleDownPeriodSeconds": 1,
    "autoscaling.tolerance": 0,
    "autoscaling.gpuBudget": 2,  # one prefill and one decode GPU
}


def numeric_fields(node: dict[str, Any], path: str = "") -> dict[str, dict[str, Any]]:
    """Every integer or number in the schema by dotted path (`[]` for a list's items)."""
    if node.get("type") in ("integer", "number"):
        return {path: node}
    found: dict[str, dict[str, Any]] = {}
    for name, child in (node.get("properties") or {}).items():
        found |= numeric_fields(child, f"{path}.{name}" if path else name)
    if "items" in node:
        found |= numeric_fields(node["items"], f"{path}[]")
    return found


NUMERIC = numeric_fields(spec_schema())
AFFINITY_TERM = {"podAffinityTerm": {"topologyKey": "kubernetes.io/hostname"}}
# What a weighted affinity item needs besides its weight.
WEIGHTED_ITEM = {
    "nodeAffinity": {"preference": {}},
    "podAffinity": AFFINITY_TERM,
    "podAntiAffinity": AFFINITY_TERM,
}


def with_value(path: str, value: float) -> dict[str, Any]:
    """A valid manifest but for `path` set to `value`, with what the field needs around it."""
    body = manifest()
    spec: dict[str, Any] = body["spec"]
    node = spec
    parts = path.split(".")
    for part in parts[:-1]:
        if part.endswith("[]"):
            node[part[:-2]] = [{}]
            node = node[part[:-2]][0]
        else:
            node = node.setdefault(part, {})
    node[parts[-1]] = value
    if parts[-1] == "tolerationSeconds":
        node |= {"key": "k", "operator": "Exists", "effect": "NoExecute"}
    if parts[-1] == "weight":
        node |= WEIGHTED_ITEM[parts[-3]]
    if "tolerations" in path or "affinity" in path:
        spec["conversion"] = {"enabled": False}  # the roles no longer schedule alike
    if path == "rollout.maxSurge":
        spec["rollout"]["maxUnavailable"] = 1  # a rollout must be able to progress
    if parts[-1] == "maxReplicas":
        spec[parts[0]]["replicas"] = 0
    if parts[-1] in ("kvLatentDim", "ropeDim"):
        spec["model"] |= {"kvLatentDim": 512, "ropeDim": 64, parts[-1]: value}
    return body


def below(minimum: float, integer: bool) -> list[float]:
    """Values under the minimum: for integers the next one down; for numbers half of it (-0.5 under 0)
    and 0, an integer, which the API server's schema check compares with the minimum cut to an integer."""
    if integer:
        return [int(minimum) - 1]
    return [minimum / 2, 0] if minimum > 0 else [-0.5]


def test_every_numeric_field_has_its_tabled_minimum() -> None:
    assert sorted(NUMERIC) == sorted(MINIMUMS), "a numeric field without a considered minimum"
    differ = {
        path: node.get("minimum") for path, node in NUMERIC.items() if node.get("minimum") != MINIMUMS[path]
    }
    assert not differ, f"minimum in the CRD differs from the table: {differ}"
    assert not [path for path, node in NUMERIC.items() if node.get("exclusiveMinimum")]


@pytest.mark.parametrize("path", sorted(MINIMUMS))
def test_each_numeric_field_takes_its_minimum_and_refuses_less_naming_field_value_and_rule(
    kube_cluster: LocalCluster, namespace: str, path: str
) -> None:
    minimum = MINIMUMS[path]
    integer = NUMERIC[path]["type"] == "integer"
    at_minimum = server_create(
        kube_cluster, namespace, with_value(path, int(minimum) if integer else minimum)
    )
    assert at_minimum.returncode == 0, at_minimum.stderr
    parse_pdd(json.loads(at_minimum.stdout))  # the operator's model takes the minimum too
    field = "spec." + path.replace("[]", "[0]")
    for value in below(minimum, integer):
        result = server_create(kube_cluster, namespace, with_value(path, value))
        assert result.returncode != 0, f"{field}={value} accepted"
        shown = str(int(value)) if float(value).is_integer() else repr(value)  # as the API server prints it
        schema_rule = f"{field}: Invalid value: {shown}: {field} in body should be greater than or equal to"
        cel_rule = f"{field}: Invalid value: {field} must be at least {minimum:g}"  # the integer 0
        assert schema_rule in result.stderr or cel_rule in result.stderr, result.stderr


# Hosts a Prometheus URL must never name: the controller's own lists of metadata names and addresses, the
# link-local, unspecified, multicast and broadcast ranges, and numeric forms the resolver turns into them.
HOSTILE_URLS = [
    *(f"http://{name}/computeMetadata/v1" for name in sorted(METADATA_NAMES)),
    "http://METADATA.google.internal.:80/",
    *(f"http://{a}/" if a.version == 4 else f"http://[{a}]/" for a in sorted(METADATA_ADDRESSES, key=str)),
    "http://169.254.0.1:9090",
    "http://169.254.255.255:9090",
    "http://[fe80::1]:9090",
    "http://[FEBF:ffff::1]:9090",
    "http://[fd00:ec2:0::254]/",
    "http://0.0.0.0:9090",
    "http://[::]:9090",
    "http://224.0.0.1:9090",
    "http://[ff02::1]:9090",
    "http://255.255.255.255:9090",
    "http://2852039166/",
    "http://0xa9fea9fe/",
    "http://0251.0376.0251.0376/",
    "http://169.254.169.254.:80/",
    "http://[::ffff:169.254.169.254]/",
]
ORDINARY_URLS = [
    "http://prometheus.monitoring.svc:9090",
    "https://prom.example.com/api/prom",
    "http://127.0.0.1:9090",
    "http://[::1]:9090/",
    "http://10.0.0.7:9090",
    "http://[2001:db8::7]:9090",
    "http://prom-0.example:9090",
]


def autoscaled(url: str) -> dict[str, Any]:
    return manifest(
        model={"name": "m", "preset": "llama-3.1-8b"},
        autoscaling={"mode": "Auto", "prometheus": {"url": url}},
    )


@pytest.mark.parametrize("url", HOSTILE_URLS)
def test_metadata_and_link_local_prometheus_urls_are_refused_at_admission(
    kube_cluster: LocalCluster, namespace: str, url: str
) -> None:
    result = server_create(kube_cluster, namespace, autoscaled(url))
    assert result.returncode != 0, f"{url} accepted"
    field = "spec.autoscaling.prometheus.url"
    assert f'{field}: Invalid value: "{url}": {field}' in result.stderr, result.stderr


@pytest.mark.parametrize("url", ORDINARY_URLS)
def test_ordinary_prometheus_urls_are_admitted(kube_cluster: LocalCluster, namespace: str, url: str) -> None:
    result = server_create(kube_cluster, namespace, autoscaled(url))
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize(
    "model",
    [
        {"name": "m", "preset": "llama-3.1-8b"},
        {"name": "m", "params": 8e9, "layers": 32, "kvHeads": 8, "headDim": 128},
        {"name": "m", "params": 6.7e11, "layers": 61, "kvLatentDim": 512, "ropeDim": 64},
    ],
    ids=["preset", "shape", "mla-shape"],
)
def test_autoscaling_with_a_model_to_size_with_is_admitted(
    kube_cluster: LocalCluster, namespace: str, model: dict[str, Any]
) -> None:
    body = manifest(model=model, autoscaling={"mode": "Advisory", "prometheus": {"url": "http://prom:9090"}})
    result = server_create(kube_cluster, namespace, body)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize(
    ("engine", "conversion", "args"),
    [
        ({"kvConnector": "mori"}, {"switchMethod": "HTTP"}, ["--dp-size", "1", "--ep-size=1"]),
        ({}, {}, ["--tp-size", "8", "--pp-size", "01"]),
        ({"kvConnector": "nixl"}, {"switchMethod": "Restart"}, ["--dp-size", "4", "--enable-dp-attention"]),
        ({"kvConnector": "nixl"}, {"enabled": False}, ["--ep-size=8"]),
    ],
    ids=["mori-parallelism-1", "mooncake-default-tp8", "restart-switch", "no-conversion"],
)
def test_sglang_specs_the_http_switch_allows_or_does_not_use_are_admitted(
    kube_cluster: LocalCluster,
    namespace: str,
    engine: dict[str, Any],
    conversion: dict[str, Any],
    args: list[str],
) -> None:
    body = manifest(
        engine={"image": "s:1", "type": "sglang", **engine}, conversion=conversion, prefill={"args": args}
    )
    result = server_create(kube_cluster, namespace, body)
    assert result.returncode == 0, result.stderr
    parse_pdd(json.loads(result.stdout))  # the operator takes what the API server admits


@pytest.mark.parametrize(
    ("engine", "where", "found"),
    [
        ({}, ("prefill", ["--dp-size", "2"]), "'--dp-size 2'"),
        ({"args": ["--ep-size=8"]}, ("prefill", []), "'--ep-size 8'"),
        ({}, ("decode", ["--pp-size", "4", "--pp-size", "1"]), "'--pp-size 4'"),
        ({}, ("decode", ["--enable-dp-attention"]), "'--enable-dp-attention'"),
    ],
    ids=["dp", "ep-in-shared-args", "pp-given-twice", "dp-attention"],
)
def test_sglang_parallelism_the_http_switch_refuses_is_invalid_naming_the_field(
    kube_cluster: LocalCluster,
    namespace: str,
    engine: dict[str, Any],
    where: tuple[str, list[str]],
    found: str,
) -> None:
    role, args = where
    body = manifest(engine={"image": "s:1", "type": "sglang", **engine}, **{role: {"args": args}})
    admitted = server_create(kube_cluster, namespace, body)  # over CEL's cost budget to scan: admitted
    assert admitted.returncode == 0, admitted.stderr
    with pytest.raises(InputError, match=rf"spec\.{role}\.args \({found}, with spec\.engine\.args\): SGLang"):
        parse_pdd(json.loads(admitted.stdout))


@pytest.mark.parametrize(
    ("engine", "conversion", "method"),
    [
        ({"image": "vllm/vllm-openai:v0.40.0"}, {"switchMethod": "InPlace"}, SwitchMethod.IN_PLACE),
        ({"image": "s:1", "type": "sglang"}, {"switchMethod": "InPlace"}, SwitchMethod.IN_PLACE),
        (
            {"image": "c:1", "type": "custom", "command": ["serve"]},
            {"switchMethod": "InPlace"},
            SwitchMethod.IN_PLACE,
        ),
        ({"image": "v:1", "version": "0.34.1"}, {"switchMethod": "Routing"}, SwitchMethod.ROUTING),
        ({"image": "v:1", "version": "v0.35.0"}, {}, SwitchMethod.IN_PLACE),
        ({"image": "vllm/vllm-openai:v0.32.0"}, {}, SwitchMethod.ROUTING),
        ({"image": "v:1"}, {"switchMethod": "Routing"}, SwitchMethod.ROUTING),  # no version: the user's call
    ],
    ids=[
        "vllm-in-place",
        "sglang-in-place",
        "custom-in-place",
        "routing-0.34",
        "auto-0.35",
        "auto-tag-0.32",
        "routing-unknown",
    ],
)
def test_switch_methods_the_crd_admits_resolve_as_the_operator_reads_them(
    kube_cluster: LocalCluster,
    namespace: str,
    engine: dict[str, Any],
    conversion: dict[str, Any],
    method: SwitchMethod,
) -> None:
    result = server_create(kube_cluster, namespace, manifest(engine=engine, conversion=conversion))
    assert result.returncode == 0, result.stderr
    assert parse_pdd(json.loads(result.stdout)).spec.switch_method is method


def test_an_explicit_routing_switch_on_a_vllm_image_tag_needing_explicit_roles_is_invalid_spec(
    kube_cluster: LocalCluster, namespace: str
) -> None:
    """CEL reads spec.engine.version only; a version from the image's tag is the operator's to refuse."""
    body = manifest(engine={"image": "vllm/vllm-openai:v0.35.0"}, conversion={"switchMethod": "Routing"})
    admitted = server_create(kube_cluster, namespace, body)
    assert admitted.returncode == 0, admitted.stderr
    with pytest.raises(
        InputError, match=r"spec\.engine\.image='v0\.35\.0': spec\.conversion\.switchMethod=Routing"
    ):
        parse_pdd(json.loads(admitted.stdout))
