"""Rendered manifests: labels, owner references, engine role arguments, selectors, template hashes."""

from __future__ import annotations

import json
from typing import Any

import pytest

from xpyd_api.models import PDDeployment, parse_pdd
from xpyd_api.names import (
    ANNOTATION_TRANSITION,
    LABEL_PDD,
    LABEL_ROLE,
    LABEL_SERVING,
    LABEL_TEMPLATE_HASH,
    Role,
)
from xpyd_operator.core import render


def make_pdd(**spec: Any) -> PDDeployment:
    raw: dict[str, Any] = {
        "model": {"name": "org/model"},
        "engine": {"image": "vllm:0.32.0"},  # a vLLM version read to take kv_both: Auto is Routing
        "router": {"image": "r:1"},
    }
    for key, value in spec.items():
        raw[key] = {**raw.get(key, {}), **value}
    return parse_pdd({"metadata": {"name": "p", "namespace": "ns", "uid": "uid-1"}, "spec": raw})


def flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


@pytest.mark.parametrize(
    ("conversion", "role", "kv_role"),
    [
        ({}, Role.PREFILL, "kv_both"),
        ({}, Role.DECODE, "kv_both"),
        ({"switchMethod": "Restart"}, Role.PREFILL, "kv_producer"),
        ({"switchMethod": "Restart"}, Role.DECODE, "kv_consumer"),
    ],
)
def test_vllm_kv_transfer_config(conversion: dict[str, str], role: Role, kv_role: str) -> None:
    args = render.engine_role_args(make_pdd(conversion=conversion).spec, role)
    assert json.loads(flag(args, "--kv-transfer-config")) == {
        "kv_connector": "NixlConnector",
        "kv_role": kv_role,
        "kv_connector_extra_config": {"kv_lease_duration": 30},
    }
    assert flag(args, "--model") == "org/model"


@pytest.mark.parametrize(("lease", "rendered"), [(6, 6), (2.5, 2.5), (1, 1)])
def test_nixl_engines_hold_kv_for_the_lease_the_drains_wait_out(lease: float, rendered: float) -> None:
    spec = make_pdd(conversion={"kvLeaseSeconds": lease}).spec
    for role in Role:
        kv_config = json.loads(flag(render.engine_role_args(spec, role), "--kv-transfer-config"))
        assert kv_config["kv_connector_extra_config"] == {"kv_lease_duration": rendered}


def test_other_vllm_connectors_get_no_nixl_lease() -> None:
    spec = make_pdd(engine={"kvConnector": "MooncakeConnector"}).spec
    kv_config = json.loads(flag(render.engine_role_args(spec, Role.PREFILL), "--kv-transfer-config"))
    assert "kv_connector_extra_config" not in kv_config


@pytest.mark.parametrize(
    ("conversion", "role", "mode", "switch_flag"),
    [
        ({}, Role.PREFILL, "$(XPYD_ROLE)", True),
        ({"switchMethod": "Restart"}, Role.DECODE, "decode", False),
    ],
)
def test_sglang_disaggregation_flags(
    conversion: dict[str, str], role: Role, mode: str, switch_flag: bool
) -> None:
    backend = "mori" if switch_flag else "nixl"  # the HTTP switch needs a backend that can switch
    spec = make_pdd(engine={"type": "sglang", "kvConnector": backend}, conversion=conversion).spec
    args = render.engine_role_args(spec, role)
    assert flag(args, "--disaggregation-mode") == mode
    assert flag(args, "--disaggregation-transfer-backend") == backend
    assert ("--enable-pd-role-switch" in args) is switch_flag


def test_tensor_parallel_follows_gpus_per_instance() -> None:
    spec = make_pdd(prefill={"gpusPerInstance": 4}, decode={"gpusPerInstance": 4}).spec
    assert flag(render.engine_role_args(spec, Role.PREFILL), "--tensor-parallel-size") == "4"


def test_instance_pod_labels_owner_and_resources() -> None:
    pdd = make_pdd(engine={"args": ["--x"]}, decode={"args": ["--only-decode"]})
    pod = render.instance_pod(pdd, Role.DECODE, "p-3", serving=False, node="n1", transition="{}")
    labels = pod["metadata"]["labels"]
    assert labels[LABEL_PDD] == "p" and labels[LABEL_ROLE] == "decode" and labels[LABEL_SERVING] == "false"
    assert labels[LABEL_TEMPLATE_HASH] == render.template_hash(pdd.spec, Role.DECODE)
    owner = pod["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["uid"], owner["controller"]) == ("PDDeployment", "uid-1", True)
    assert pod["spec"]["nodeName"] == "n1"
    container = pod["spec"]["containers"][0]
    assert container["args"][-2:] == ["--x", "--only-decode"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert container["env"][0]["valueFrom"]["fieldRef"]["fieldPath"] == f"metadata.labels['{LABEL_ROLE}']"


def test_template_hash_changes_with_the_template_only() -> None:
    base = make_pdd()
    assert render.template_hash(base.spec, Role.PREFILL) == render.template_hash(
        make_pdd().spec, Role.PREFILL
    )
    # vLLM kv_both: both roles run the same pod, so a conversion needs no rollout afterwards
    assert render.template_hash(base.spec, Role.PREFILL) == render.template_hash(base.spec, Role.DECODE)
    changed = make_pdd(engine={"image": "vllm:0.32.1"})
    assert render.template_hash(changed.spec, Role.PREFILL) != render.template_hash(base.spec, Role.PREFILL)
    replicas_only = make_pdd(prefill={"replicas": 3})
    assert render.template_hash(replicas_only.spec, Role.PREFILL) == render.template_hash(
        base.spec, Role.PREFILL
    )


def test_role_service_selects_serving_instances_of_its_role() -> None:
    service = render.role_service(make_pdd(), Role.PREFILL)
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"] == {LABEL_PDD: "p", LABEL_ROLE: "prefill", LABEL_SERVING: "true"}


@pytest.mark.parametrize(
    ("router_type", "pd_flag", "command"),
    [
        ("vllm-router", "--vllm-pd-disaggregation", ["vllm-router"]),
        ("sglang-router", "--pd-disaggregation", ["python3", "-m", "sglang_router.launch_router"]),
        ("smg", "--pd-disaggregation", ["smg", "launch"]),
    ],
)
def test_router_discovers_instances_by_label(router_type: str, pd_flag: str, command: list[str]) -> None:
    deployment = render.router_deployment(make_pdd(router={"type": router_type}))
    assert deployment is not None
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    args = container["args"]
    assert container["command"] == command
    assert pd_flag in args and "--service-discovery" in args
    assert flag(args, "--service-discovery-namespace") == "ns"
    start = args.index("--prefill-selector") + 1
    assert args[start : start + 3] == ["xpyd.dev/pdd=p", "xpyd.dev/role=prefill", "xpyd.dev/serving=true"]
    start = args.index("--decode-selector") + 1
    assert args[start : start + 3] == ["xpyd.dev/pdd=p", "xpyd.dev/role=decode", "xpyd.dev/serving=true"]
    # Metrics on every pod address (both routers default to 127.0.0.1, which Prometheus cannot scrape).
    assert flag(args, "--prometheus-host") == "0.0.0.0"
    assert flag(args, "--prometheus-port") == str(render.ROUTER_METRICS_PORT)
    # vllm-router retries a new pod's health each second, not every 30 s (its pod events wait meanwhile)
    assert ("--worker-startup-check-interval" in args) is (router_type == "vllm-router")
    if router_type == "vllm-router":
        assert flag(args, "--worker-startup-check-interval") == "1"
    assert {"name": "metrics", "containerPort": render.ROUTER_METRICS_PORT, "protocol": "TCP"} in container[
        "ports"
    ]


def test_smg_reads_the_vllm_kv_connector_from_an_instance_annotation() -> None:
    def annotations(pdd: PDDeployment, transition: str | None = None) -> dict[str, str] | None:
        pod = render.instance_pod(pdd, Role.DECODE, "p-0", transition=transition)
        return pod["metadata"].get("annotations")

    smg = make_pdd(router={"type": "smg"})
    assert annotations(smg) == {render.SMG_KV_CONNECTOR_ANNOTATION: "NixlConnector"}
    both = {render.SMG_KV_CONNECTOR_ANNOTATION: "NixlConnector", ANNOTATION_TRANSITION: "t"}
    assert annotations(smg, "t") == both
    assert annotations(make_pdd(router={"type": "vllm-router"})) is None
    assert annotations(make_pdd(router={"type": "sglang-router"})) is None
    assert annotations(make_pdd(router={"type": "smg"}, engine={"type": "sglang"})) is None  # SGLang's own PD


def test_no_router_renders_nothing() -> None:
    pdd = make_pdd(router={"type": "none"})
    assert render.router_deployment(pdd) is None and render.router_service(pdd) is None


def env_of(pdd: PDDeployment, role: Role = Role.PREFILL) -> dict[str, Any]:
    container = render.instance_pod(pdd, role, "p-0")["spec"]["containers"][0]
    return {entry["name"]: entry.get("value", entry.get("valueFrom")) for entry in container["env"]}


def test_nixl_side_channel_is_the_pod_ip() -> None:
    """vLLM's default side-channel host is localhost, which prefill hands decode as remote_host."""
    env = env_of(make_pdd())
    assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert env["VLLM_NIXL_SIDE_CHANNEL_PORT"] == "5600"
    ports = render.instance_pod(make_pdd(), Role.PREFILL, "p-0")["spec"]["containers"][0]["ports"]
    assert {"name": "nixl", "containerPort": 5600, "protocol": "TCP"} in ports


def test_no_nixl_env_for_other_connectors_and_engines() -> None:
    assert "VLLM_NIXL_SIDE_CHANNEL_HOST" not in env_of(make_pdd(engine={"kvConnector": "MooncakeConnector"}))
    assert "VLLM_NIXL_SIDE_CHANNEL_HOST" not in env_of(make_pdd(engine={"type": "sglang"}))


def test_users_env_replaces_the_rendered_entry() -> None:
    pdd = make_pdd(engine={"env": [{"name": "VLLM_NIXL_SIDE_CHANNEL_PORT", "value": "7000"}]})
    container = render.instance_pod(pdd, Role.PREFILL, "p-0")["spec"]["containers"][0]
    ports = [e for e in container["env"] if e["name"] == "VLLM_NIXL_SIDE_CHANNEL_PORT"]
    assert ports == [{"name": "VLLM_NIXL_SIDE_CHANNEL_PORT", "value": "7000"}]


def test_engine_exit_message_carries_its_log_tail() -> None:
    container = render.instance_pod(make_pdd(), Role.PREFILL, "p-0")["spec"]["containers"][0]
    assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"


def test_a_deleted_instance_leaves_the_router_before_its_engine_stops_and_finishes_its_requests() -> None:
    pdd = make_pdd(conversion={"drainTimeoutSeconds": 42.5})
    pod = render.instance_pod(pdd, Role.DECODE, "p-0")["spec"]
    container = pod["containers"][0]
    assert container["lifecycle"] == {"preStop": {"sleep": {"seconds": render.PRE_STOP_SLEEP_SECONDS}}}
    assert flag(container["args"], "--shutdown-timeout") == "43"  # vLLM's default 0 aborts in-flight
    assert pod["terminationGracePeriodSeconds"] == render.PRE_STOP_SLEEP_SECONDS + 43 + 10
    sglang = render.engine_role_args(make_pdd(engine={"type": "sglang"}).spec, Role.DECODE)
    assert "--shutdown-timeout" not in sglang


def test_sglang_serves_metrics_with_length_histograms() -> None:
    args = render.engine_role_args(make_pdd(engine={"type": "sglang"}).spec, Role.DECODE)
    assert "--enable-metrics" in args and "--collect-tokens-histogram" in args


@pytest.mark.parametrize(
    ("connector", "router_flag"),
    [(None, "nixl"), ("MooncakeConnector", "mooncake"), ("MoRIIOConnector", "moriio")],
)
def test_vllm_router_speaks_the_engines_connector(connector: str | None, router_flag: str) -> None:
    engine = {"kvConnector": connector} if connector else {}
    assert flag(render.router_args(make_pdd(engine=engine)), "--kv-connector") == router_flag


def test_router_kv_connector_only_for_vllm_router_and_vllm_and_not_twice() -> None:
    assert "--kv-connector" not in render.router_args(make_pdd(router={"type": "sglang-router"}))
    assert "--kv-connector" not in render.router_args(make_pdd(engine={"type": "sglang"}))
    given = render.router_args(make_pdd(router={"args": ["--kv-connector", "mooncake"]}))
    assert given.count("--kv-connector") == 1 and flag(given, "--kv-connector") == "mooncake"


RESTRICTED_CONTAINER = {
    "allowPrivilegeEscalation": False,
    "privileged": False,
    "capabilities": {"drop": ["ALL"]},
}
RESTRICTED_POD = {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}


def test_instance_and_router_pods_are_restricted_and_instances_carry_no_token() -> None:
    pdd = make_pdd()
    pod = render.instance_pod(pdd, Role.DECODE, "x-0")["spec"]
    assert pod["automountServiceAccountToken"] is False and "serviceAccountName" not in pod
    assert pod["securityContext"] == RESTRICTED_POD
    assert pod["containers"][0]["securityContext"] == RESTRICTED_CONTAINER
    deployment = render.router_deployment(pdd)
    assert deployment is not None
    router = deployment["spec"]["template"]["spec"]
    assert router["securityContext"] == RESTRICTED_POD  # keeps its token: it lists pods for discovery
    assert router["containers"][0]["securityContext"] == RESTRICTED_CONTAINER


def test_security_overrides_for_root_gpu_images_and_rdma() -> None:
    security = {"runAsNonRoot": False, "runAsUser": 0, "addCapabilities": ["IPC_LOCK"]}
    pod = render.instance_pod(
        make_pdd(engine={"image": "vllm:0.32.0", "security": security}), Role.PREFILL, "x-0"
    )
    assert (
        pod["spec"]["securityContext"]["runAsNonRoot"] is False
        and pod["spec"]["securityContext"]["runAsUser"] == 0
    )
    capabilities = pod["spec"]["containers"][0]["securityContext"]["capabilities"]
    assert capabilities == {"drop": ["ALL"], "add": ["IPC_LOCK"]}


def test_secrets_reach_the_engine_only_by_name_and_key_from_secret_env() -> None:
    engine = {
        "image": "vllm:0.32.0",
        "env": [{"name": "A", "value": "1"}],
        "secretEnv": [{"name": "HF_TOKEN", "secretName": "hub", "key": "token"}],
    }
    env = render.instance_pod(make_pdd(engine=engine), Role.PREFILL, "x-0")["spec"]["containers"][0]["env"]
    assert [e for e in env if e["name"] in ("A", "HF_TOKEN")] == [
        {"name": "A", "value": "1"},
        {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hub", "key": "token"}}},
    ]
    smuggled = make_pdd(
        engine={"image": "v", "env": [{"name": "B", "valueFrom": {"secretKeyRef": {"name": "x"}}}]}
    )
    smuggled_env = render.instance_pod(smuggled, Role.PREFILL, "x-0")["spec"]["containers"][0]["env"]
    assert [e for e in smuggled_env if e["name"] == "B"] == [{"name": "B", "value": ""}]


# Every switch method with every engine (those the spec accepts): what the role rides on. The InPlace
# contract is spelled out literally: a real-vLLM test and the kubelet measurement (docs/kind.md) rely on it.
SWITCHES = [
    ("vllm", "Routing"),
    ("vllm", "InPlace"),
    ("vllm", "Restart"),
    ("vllm", "HTTP"),
    ("sglang", "InPlace"),
    ("sglang", "Restart"),
    ("sglang", "HTTP"),
    ("custom", "InPlace"),
    ("custom", "Restart"),
    ("custom", "HTTP"),
]
ROLE_LIVENESS = {
    "exec": {"command": ["sh", "-c", '[ "$(cat /etc/xpyd/podinfo/role)" = "$XPYD_ROLE" ]']},
    "periodSeconds": 1,
    "failureThreshold": 3,
    "timeoutSeconds": 3,
}
PODINFO_VOLUME = {
    "name": "xpyd-podinfo",
    "downwardAPI": {
        "items": [{"path": "role", "fieldRef": {"fieldPath": "metadata.labels['xpyd.dev/role']"}}]
    },
}


def _switch_pdd(engine: str, method: str) -> PDDeployment:
    backend = {"sglang": {"kvConnector": "mooncake"}}.get(engine, {})
    return make_pdd(
        engine={"type": engine, "command": ["run"], **backend}, conversion={"switchMethod": method}
    )


def _kv_role(args: list[str]) -> str | None:
    if "--kv-transfer-config" not in args:
        return None
    return str(json.loads(flag(args, "--kv-transfer-config"))["kv_role"])


@pytest.mark.parametrize(("engine", "method"), SWITCHES)
@pytest.mark.parametrize("role", list(Role))
def test_each_switch_method_renders_the_role_where_its_switch_changes_it(
    engine: str, method: str, role: Role
) -> None:
    pod = render.instance_pod(_switch_pdd(engine, method), role, "p-0")
    container = pod["spec"]["containers"][0]
    labels, env = pod["metadata"]["labels"], {e["name"]: e for e in container["env"]}
    in_place = method == "InPlace"
    assert labels["xpyd.dev/role"] == str(role)
    assert env["XPYD_ROLE"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.labels['xpyd.dev/role']"}}
    explicit = {Role.PREFILL: "kv_producer", Role.DECODE: "kv_consumer"}[role]
    if engine == "vllm":
        expected = {"Routing": "kv_both", "InPlace": "$(XPYD_KV_ROLE)"}.get(method, explicit)
        assert _kv_role(container["args"]) == expected
    else:
        assert _kv_role(container["args"]) is None
    vllm_in_place = engine == "vllm" and in_place
    assert labels.get("xpyd.dev/kv-role") == (explicit if vllm_in_place else None)
    kv_env = {"fieldRef": {"fieldPath": "metadata.labels['xpyd.dev/kv-role']"}}
    assert env.get("XPYD_KV_ROLE", {}).get("valueFrom") == (kv_env if vllm_in_place else None)
    if engine == "sglang":
        from_label = method in ("InPlace", "HTTP")
        assert flag(container["args"], "--disaggregation-mode") == (
            "$(XPYD_ROLE)" if from_label else str(role)
        )
        assert ("--enable-pd-role-switch" in container["args"]) is (method == "HTTP")
    assert container.get("livenessProbe") == (ROLE_LIVENESS if in_place else None)
    mount = {"name": "xpyd-podinfo", "mountPath": "/etc/xpyd/podinfo", "readOnly": True}
    assert container.get("volumeMounts") == ([mount] if in_place else None)
    assert pod["spec"].get("volumes") == ([PODINFO_VOLUME] if in_place else None)


@pytest.mark.parametrize(("engine", "method"), SWITCHES)
def test_a_switch_that_keeps_the_pod_renders_one_template_for_both_roles(engine: str, method: str) -> None:
    """Routing, HTTP and InPlace keep the pod: its template must be current in its new role, or the
    instance would be rolled right after converting. Restart renders each role's own pod, and so does
    vLLM under HTTP (vLLM has no HTTP role switch: its kv_role is rendered per role)."""
    spec = _switch_pdd(engine, method).spec
    same = render.template_hash(spec, Role.PREFILL) == render.template_hash(spec, Role.DECODE)
    role_baked = engine != "custom" and (method == "Restart" or (engine, method) == ("vllm", "HTTP"))
    assert same is not role_baked


def test_the_in_place_switch_relabels_role_and_kv_role_together() -> None:
    spec = _switch_pdd("vllm", "InPlace").spec
    assert render.role_labels(spec, Role.DECODE) == {
        "xpyd.dev/role": "decode",
        "xpyd.dev/kv-role": "kv_consumer",
    }
    assert render.role_labels(_switch_pdd("sglang", "InPlace").spec, Role.DECODE) == {
        "xpyd.dev/role": "decode"
    }
    assert render.role_labels(_switch_pdd("vllm", "Routing").spec, Role.DECODE) == {"xpyd.dev/role": "decode"}
