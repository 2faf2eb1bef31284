"""Pure rendering of the Kubernetes objects a PDDeployment owns: instance pods, services, the router.

Instance pods carry the role only in labels (and in `XPYD_ROLE`, read from the label by the downward
API), so relabelling moves an instance between roles; everything role-specific that is baked into the
container (vLLM kv_role, a role-only arg) changes the template hash, so such an instance gets rolled.
Under switchMethod InPlace the kv_role is read from a label too (`XPYD_KV_ROLE`), and a liveness probe
restarts the container when the role label no longer matches the role it started with (the kubelet then
resolves the env vars from the labels again: docs/kind.md, "Restart in place on a real kubelet").
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any

from xpyd_api.engines import (
    ENGINES,
    NIXL_CONNECTOR,
    NIXL_EXTRA_CONFIG,
    NIXL_HOST_ENV,
    NIXL_KV_LEASE,
    NIXL_PORT_ENV,
    NIXL_SIDE_CHANNEL_PORT,
    SGLANG_DEFAULT_TRANSFER_BACKEND,
    EngineType,
)
from xpyd_api.models import (
    VLLM_ROUTER_KV_CONNECTORS,
    PDDeployment,
    PDDeploymentSpec,
    RouterType,
    SecuritySpec,
    SwitchMethod,
)
from xpyd_api.names import (
    ANNOTATION_TRANSITION,
    API_VERSION,
    COMPONENT_INSTANCE,
    COMPONENT_ROUTER,
    KIND,
    LABEL_COMPONENT,
    LABEL_KV_ROLE,
    LABEL_PDD,
    LABEL_ROLE,
    LABEL_SERVING,
    LABEL_TEMPLATE_HASH,
    Role,
)

GPU_RESOURCE = "nvidia.com/gpu"
ENGINE_CONTAINER = "engine"
ROLE_ENV = "XPYD_ROLE"
KV_ROLE_ENV = "XPYD_KV_ROLE"
VLLM_KV_ROLES = {Role.PREFILL: "kv_producer", Role.DECODE: "kv_consumer"}
# switchMethod InPlace: the role label as a file (the kubelet rewrites it within ~1 s of a relabel), and a
# liveness probe comparing it with the role the container started with. Once a second, one failure: the
# restart follows the relabel within seconds (docs/kind.md measured 1.5-4 s). The probe never looks at the
# engine's health, so a long model load after the restart does not trip it; its timeout is well above
# what `sh` and `cat` take, so a busy node does not restart an engine whose role did not change.
PODINFO_VOLUME = "xpyd-podinfo"
PODINFO_DIR = "/etc/xpyd/podinfo"
PODINFO_ROLE_FILE = "role"
ROLE_LIVENESS_COMMAND = ["sh", "-c", f'[ "$(cat {PODINFO_DIR}/{PODINFO_ROLE_FILE})" = "${ROLE_ENV}" ]']
ROLE_LIVENESS_TIMEOUT_SECONDS = 3
# A deleted pod's engine gets SIGTERM only after this sleep: vllm-router 0.1.17 drops a pod marked for
# deletion at once (< 1 s measured), so no new request is on its way when the engine starts to stop.
PRE_STOP_SLEEP_SECONDS = 5
EXIT_MARGIN_SECONDS = 10
# Where the router exports its metrics. Both routers bind 127.0.0.1 by default, out of Prometheus' reach
# in a pod, so the render binds all of the pod's addresses.
ROUTER_METRICS_PORT = 29000
# vllm-router adds a discovered pod only once its health check answers, retrying every 30 s by default,
# and holds every other pod event (a relabel, a deletion) until then: one engine slow to answer stalls
# the router's whole view of the pools. Retrying each second bounds that stall by the engine's own start.
VLLM_ROUTER_STARTUP_CHECK_ARGS = ("--worker-startup-check-interval", "1")
# smg tells vLLM's KV connector from this pod annotation (without it, vLLM's prefill leg is not asked to
# keep its KV and decode recomputes the prompt).
SMG_KV_CONNECTOR_ANNOTATION = "smg.ai/kv-connector"
ROUTER_COMMANDS = {
    RouterType.VLLM_ROUTER: ["vllm-router"],
    RouterType.SGLANG_ROUTER: ["python3", "-m", "sglang_router.launch_router"],
    RouterType.SMG: ["smg", "launch"],  # the smg wheel's console script
}


def owner_reference(pdd: PDDeployment) -> dict[str, Any]:
    """Makes the PDDeployment the controlling owner, so deleting it garbage-collects everything."""
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": pdd.name,
        "uid": pdd.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def instance_selector(pdd_name: str, role: Role) -> dict[str, str]:
    """Labels of the instances of `role` that take traffic (Services and the router use these)."""
    return {LABEL_PDD: pdd_name, LABEL_ROLE: str(role), LABEL_SERVING: "true"}


def engine_role_args(spec: PDDeploymentSpec, role: Role) -> list[str]:
    """The engine's command-line arguments for `role`, before the user's extra args.

    vLLM: `--kv-transfer-config` JSON with `kv_connector` and `kv_role` (kv_both when conversion is by
    routing, since such an instance must serve either role; `$(XPYD_KV_ROLE)` in place, read from the
    kv-role label at start; kv_producer/kv_consumer otherwise); with
    NIXL also the KV lease the drains wait out (`conversion.kvLeaseSeconds`), so both read one value.
    SGLang: `--disaggregation-mode prefill|decode` and `--disaggregation-transfer-backend`; with the HTTP
    and InPlace switches the mode is read from the role label at start, and with HTTP
    `--enable-pd-role-switch` is set; metrics
    are switched on (`--enable-metrics --collect-tokens-histogram`), the autoscaler reads them.
    """
    engine = spec.engine
    flags = ENGINES[engine.type].flags
    method = spec.switch_method
    tensor_parallel = spec.pool(role).gpus_per_instance
    if flags is None:
        return []
    args = [flags.model, spec.model.name, flags.host, "0.0.0.0", flags.port, str(engine.port)]
    if flags.kv_transfer_config:
        kv_role = {SwitchMethod.ROUTING: "kv_both", SwitchMethod.IN_PLACE: f"$({KV_ROLE_ENV})"}.get(
            method, VLLM_KV_ROLES[role]
        )
        kv_config: dict[str, Any] = {"kv_connector": spec.vllm_connector, "kv_role": kv_role}
        if _uses_nixl(spec):
            kv_config[NIXL_EXTRA_CONFIG] = {NIXL_KV_LEASE: _whole_if_whole(spec.conversion.kv_lease_seconds)}
        args += [flags.kv_transfer_config, json.dumps(kv_config, separators=(",", ":"), sort_keys=True)]
    if flags.shutdown_timeout:
        args += [flags.shutdown_timeout, str(shutdown_timeout_seconds(spec))]
    if flags.disaggregation_mode:
        mode = f"$({ROLE_ENV})" if method in (SwitchMethod.HTTP, SwitchMethod.IN_PLACE) else str(role)
        args += [flags.disaggregation_mode, mode]
    if flags.transfer_backend:
        args += [flags.transfer_backend, engine.kv_connector or SGLANG_DEFAULT_TRANSFER_BACKEND]
    args += flags.metrics
    if tensor_parallel > 1:
        args += [flags.tensor_parallel, str(tensor_parallel)]
    if method is SwitchMethod.HTTP and flags.role_switch:
        args.append(flags.role_switch)
    return args


def _whole_if_whole(value: float) -> float | int:
    """A JSON number without a fraction where it has none (vLLM reads the lease as an int)."""
    return int(value) if value == int(value) else value


def shutdown_timeout_seconds(spec: PDDeploymentSpec) -> int:
    """How long an engine that got SIGTERM keeps serving its in-flight requests (vLLM's
    `--shutdown-timeout`; 0, its default, aborts them): as long as a drain may take."""
    return math.ceil(spec.conversion.drain_timeout_seconds)


def termination_grace_seconds(spec: PDDeploymentSpec) -> int:
    """The preStop sleep, the engine's shutdown timeout and a margin for the process to exit."""
    return PRE_STOP_SLEEP_SECONDS + shutdown_timeout_seconds(spec) + EXIT_MARGIN_SECONDS


def _engine_command(spec: PDDeploymentSpec) -> list[str]:
    if spec.engine.command:
        return list(spec.engine.command)
    return list(ENGINES[spec.engine.type].command)


def _resources(spec: PDDeploymentSpec, role: Role) -> dict[str, Any]:
    pool = spec.pool(role)
    gpus = {GPU_RESOURCE: str(pool.gpus_per_instance)}
    return {"limits": {**pool.resources.limits, **gpus}, "requests": {**pool.resources.requests, **gpus}}


def _uses_nixl(spec: PDDeploymentSpec) -> bool:
    return spec.engine.type is EngineType.VLLM and spec.vllm_connector == NIXL_CONNECTOR


def pod_security_context(security: SecuritySpec) -> dict[str, Any]:
    """Pod-level part of the restricted profile: non-root (unless overridden), seccomp RuntimeDefault."""
    context: dict[str, Any] = {
        "runAsNonRoot": security.run_as_non_root,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    for key, value in (
        ("runAsUser", security.run_as_user),
        ("runAsGroup", security.run_as_group),
        ("fsGroup", security.fs_group),
    ):
        if value is not None:
            context[key] = value
    return context


def container_security_context(security: SecuritySpec) -> dict[str, Any]:
    """Container-level part: no privilege escalation, every capability dropped but the allowed adds."""
    capabilities: dict[str, Any] = {"drop": ["ALL"]}
    if security.add_capabilities:
        capabilities["add"] = [str(c) for c in security.add_capabilities]
    return {"allowPrivilegeEscalation": False, "privileged": False, "capabilities": capabilities}


def _restarts_in_place(spec: PDDeploymentSpec) -> bool:
    return spec.switch_method is SwitchMethod.IN_PLACE


def _label_env(name: str, label: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": f"metadata.labels['{label}']"}}}


def role_labels(spec: PDDeploymentSpec, role: Role) -> dict[str, str]:
    """The labels that name an instance's role: the role, and under InPlace for vLLM its kv_role (one
    patch of both is the in-place switch)."""
    labels = {LABEL_ROLE: str(role)}
    if _restarts_in_place(spec) and spec.engine.type is EngineType.VLLM:
        labels[LABEL_KV_ROLE] = VLLM_KV_ROLES[role]
    return labels


def engine_env(spec: PDDeploymentSpec, role: Role) -> list[dict[str, Any]]:
    """The engine's environment: the role (downward API from the label; under InPlace for vLLM the
    kv_role too), NIXL's side channel on the pod IP (vLLM with NixlConnector), then the user's literal
    variables (a name the user sets replaces the rendered one), then those read from Secrets by name and
    key (spec.engine.secretEnv)."""
    pool = spec.pool(role)
    rendered = [_label_env(ROLE_ENV, LABEL_ROLE)]
    if LABEL_KV_ROLE in role_labels(spec, role):
        rendered.append(_label_env(KV_ROLE_ENV, LABEL_KV_ROLE))
    if _uses_nixl(spec):
        rendered += [
            {"name": NIXL_HOST_ENV, "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": NIXL_PORT_ENV, "value": str(NIXL_SIDE_CHANNEL_PORT)},
        ]
    users = [{"name": var.name, "value": var.value} for var in (*spec.engine.env, *pool.env)]
    secret = [
        {"name": var.name, "valueFrom": {"secretKeyRef": {"name": var.secret_name, "key": var.key}}}
        for var in spec.engine.secret_env
    ]
    overridden = {entry["name"] for entry in users + secret}
    return [entry for entry in rendered if entry["name"] not in overridden] + users + secret


def instance_pod_spec(spec: PDDeploymentSpec, role: Role) -> dict[str, Any]:
    """The pod spec of an instance of `role` (without a node binding); its hash is the template hash.

    The engine's termination message falls back to its last log lines, so an image that rejects a flag
    xpyd renders is reported by name (status.report_unsupported_flags), not only as a crash loop.
    """
    pool = spec.pool(role)
    ports = [{"name": "http", "containerPort": spec.engine.port, "protocol": "TCP"}]
    if _uses_nixl(spec):
        ports.append({"name": "nixl", "containerPort": NIXL_SIDE_CHANNEL_PORT, "protocol": "TCP"})
    container = {
        "name": ENGINE_CONTAINER,
        "image": spec.engine.image,
        "command": _engine_command(spec),
        "args": [*engine_role_args(spec, role), *spec.engine.args, *pool.args],
        "ports": ports,
        "env": engine_env(spec, role),
        "resources": _resources(spec, role),
        "readinessProbe": {
            "httpGet": {"path": ENGINES[spec.engine.type].endpoints.health, "port": "http"},
            "periodSeconds": 5,
        },
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": container_security_context(spec.engine.security),
        # a deleted pod leaves the router's pool within a second; only then does the engine get SIGTERM
        "lifecycle": {"preStop": {"sleep": {"seconds": PRE_STOP_SLEEP_SECONDS}}},
    }
    if _restarts_in_place(spec):
        _add_role_liveness(container)
    pod_spec: dict[str, Any] = {
        "containers": [container],
        "restartPolicy": "Always",
        "terminationGracePeriodSeconds": termination_grace_seconds(spec),
        # engines never call the Kubernetes API: no token in the pod for a compromised engine to use
        "automountServiceAccountToken": False,
        "securityContext": pod_security_context(spec.engine.security),
    }
    if _restarts_in_place(spec):
        pod_spec["volumes"] = [_podinfo_volume()]
    if pool.node_selector:
        pod_spec["nodeSelector"] = dict(pool.node_selector)
    if pool.tolerations:
        pod_spec["tolerations"] = list(pool.tolerations)
    affinity = pool.affinity or spec.affinity
    if affinity:
        pod_spec["affinity"] = affinity
    return pod_spec


def _podinfo_volume() -> dict[str, Any]:
    """The role label as the file the liveness probe reads (downward API, updated on a relabel)."""
    role_file = {"path": PODINFO_ROLE_FILE, "fieldRef": {"fieldPath": f"metadata.labels['{LABEL_ROLE}']"}}
    return {"name": PODINFO_VOLUME, "downwardAPI": {"items": [role_file]}}


def _add_role_liveness(container: dict[str, Any]) -> None:
    """InPlace: the container restarts when its role label no longer names the role it started with."""
    container["volumeMounts"] = [{"name": PODINFO_VOLUME, "mountPath": PODINFO_DIR, "readOnly": True}]
    container["livenessProbe"] = {
        "exec": {"command": list(ROLE_LIVENESS_COMMAND)},
        "periodSeconds": 1,
        # three in a row: one exec slower than its timeout on a busy node never restarts a serving engine
        "failureThreshold": 3,
        "timeoutSeconds": ROLE_LIVENESS_TIMEOUT_SECONDS,
    }


def template_hash(spec: PDDeploymentSpec, role: Role) -> str:
    """Short stable hash of a role's pod template; a pod whose label differs is outdated."""
    canonical = json.dumps(instance_pod_spec(spec, role), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:10]


def instance_pod(
    pdd: PDDeployment,
    role: Role,
    name: str,
    *,
    serving: bool = True,
    node: str | None = None,
    transition: str | None = None,
) -> dict[str, Any]:
    """A complete instance Pod; `node` pins it (a restart conversion keeps the instance on its node)."""
    spec = instance_pod_spec(pdd.spec, role)
    if node:
        spec["nodeName"] = node
    metadata: dict[str, Any] = {
        "name": name,
        "namespace": pdd.namespace,
        "labels": {
            LABEL_PDD: pdd.name,
            **role_labels(pdd.spec, role),
            LABEL_SERVING: "true" if serving else "false",
            LABEL_TEMPLATE_HASH: template_hash(pdd.spec, role),
            LABEL_COMPONENT: COMPONENT_INSTANCE,
        },
        "ownerReferences": [owner_reference(pdd)],
    }
    annotations: dict[str, str] = {}
    if pdd.spec.router.type is RouterType.SMG and pdd.spec.engine.type is EngineType.VLLM:
        annotations[SMG_KV_CONNECTOR_ANNOTATION] = pdd.spec.vllm_connector
    if transition is not None:
        annotations[ANNOTATION_TRANSITION] = transition
    if annotations:
        metadata["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def role_service(pdd: PDDeployment, role: Role) -> dict[str, Any]:
    """Headless Service per role: DNS for the serving instances of that role."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": f"{pdd.name}-{role}",
            "namespace": pdd.namespace,
            "labels": {LABEL_PDD: pdd.name, LABEL_ROLE: str(role)},
            "ownerReferences": [owner_reference(pdd)],
        },
        "spec": {
            "clusterIP": "None",
            "selector": instance_selector(pdd.name, role),
            "ports": [{"name": "http", "port": pdd.spec.engine.port, "targetPort": "http"}],
        },
    }


def _selector_terms(pdd_name: str, role: Role) -> list[str]:
    return [f"{key}={value}" for key, value in instance_selector(pdd_name, role).items()]


def _router_kv_connector_args(spec: PDDeploymentSpec) -> list[str]:
    """vllm-router in front of vLLM must speak the engines' KV connector (`--kv-connector`, default nixl);
    a `--kv-connector` in spec.router.args wins."""
    if spec.router.type is not RouterType.VLLM_ROUTER or spec.engine.type is not EngineType.VLLM:
        return []
    if any(arg == "--kv-connector" or arg.startswith("--kv-connector=") for arg in spec.router.args):
        return []
    return ["--kv-connector", VLLM_ROUTER_KV_CONNECTORS[spec.vllm_connector]]


def router_args(pdd: PDDeployment) -> list[str]:
    """Router flags: PD mode with Kubernetes service discovery by the instances' label selectors."""
    spec = pdd.spec
    pd_flag = (
        "--vllm-pd-disaggregation" if spec.router.type is RouterType.VLLM_ROUTER else "--pd-disaggregation"
    )
    return [
        "--host",
        "0.0.0.0",
        "--port",
        str(spec.router.port),
        pd_flag,
        *_router_kv_connector_args(spec),
        *(VLLM_ROUTER_STARTUP_CHECK_ARGS if spec.router.type is RouterType.VLLM_ROUTER else ()),
        "--service-discovery",
        "--service-discovery-namespace",
        pdd.namespace,
        "--service-discovery-port",
        str(spec.engine.port),
        "--prefill-selector",
        *_selector_terms(pdd.name, Role.PREFILL),
        "--decode-selector",
        *_selector_terms(pdd.name, Role.DECODE),
        "--prometheus-host",
        "0.0.0.0",
        "--prometheus-port",
        str(ROUTER_METRICS_PORT),
        *spec.router.args,
    ]


def _router_labels(pdd_name: str) -> dict[str, str]:
    return {LABEL_PDD: pdd_name, LABEL_COMPONENT: COMPONENT_ROUTER}


def router_deployment(pdd: PDDeployment) -> dict[str, Any] | None:
    """The router Deployment, or None when `spec.router.type` is none."""
    router = pdd.spec.router
    if router.type is RouterType.NONE:
        return None
    command = list(ROUTER_COMMANDS[router.type])
    pod_spec: dict[str, Any] = {
        "containers": [
            {
                "name": "router",
                "image": router.image,
                "command": command,
                "args": router_args(pdd),
                "ports": [
                    {"name": "http", "containerPort": router.port, "protocol": "TCP"},
                    {"name": "metrics", "containerPort": ROUTER_METRICS_PORT, "protocol": "TCP"},
                ],
                "securityContext": container_security_context(router.security),
            }
        ],
        # the router keeps its service-account token: it lists pods for service discovery
        "securityContext": pod_security_context(router.security),
    }
    if router.service_account_name:
        pod_spec["serviceAccountName"] = router.service_account_name
    labels = _router_labels(pdd.name)
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": f"{pdd.name}-router",
            "namespace": pdd.namespace,
            "labels": labels,
            "ownerReferences": [owner_reference(pdd)],
        },
        "spec": {
            "replicas": router.replicas,
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": pod_spec},
        },
    }


def router_service(pdd: PDDeployment) -> dict[str, Any] | None:
    """The router's ClusterIP Service (the deployment's single endpoint), or None without a router."""
    if pdd.spec.router.type is RouterType.NONE:
        return None
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": f"{pdd.name}-router",
            "namespace": pdd.namespace,
            "labels": _router_labels(pdd.name),
            "ownerReferences": [owner_reference(pdd)],
        },
        "spec": {
            "selector": _router_labels(pdd.name),
            "ports": [{"name": "http", "port": pdd.spec.router.port, "targetPort": "http"}],
        },
    }
