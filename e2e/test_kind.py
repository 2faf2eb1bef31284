"""Real pods on kind: what a user installs, running.

The chart is installed with the built xpyd image into a namespace enforcing the restricted Pod Security
Standard, so the operator and the controller run in-cluster under the chart's RBAC; Prometheus runs in
the cluster and discovers the instance pods with the relabelling of the chart's PodMonitor; a
PDDeployment's instance pods run the engine stand-in (`python -m xpyd_controller.standin`, from the
same image) behind the real vllm-router; a conversion restarts one of those pods' engine in place
(switchMethod InPlace: the kubelet restarts the container with the new role), and in Auto the in-cluster
controller sizes the pools from what the in-cluster Prometheus scraped while traffic flows through the
router, and new real pods start and take requests.

Only with XPYD_CLUSTER=kind, under `hack/kind run` (`hack/test` runs this group so; docs/kind.md). The
test process reaches pods and Services through the API server's proxy, as `kubectl` users do: a
`kubectl proxy` on a free loopback port (inside hack/kind's network namespace) carries its GETs and
JSON POSTs.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import threading
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pytest
from tests.helm_chart import CHART_DIR, helm
from tests.integration.pdd import apply, get_json, instance_pods, patch_spec, roles, wait_ready

from e2e.harness.cluster import LocalCluster
from e2e.harness.dataplane import started_process
from e2e.harness.procs import free_port, wait_until
from e2e.harness.prometheus import chart_pod_monitors, pod_monitor_scrape_config
from xpyd_api.names import (
    ANNOTATION_CONVERSIONS,
    ANNOTATION_TRANSITION,
    LABEL_ROLE,
)

pytestmark = pytest.mark.kind

POD_SECURITY = "pod-security.kubernetes.io/enforce"
ROUTER_ACCOUNT = "xpyd-router"
GPUS_PER_NODE = 16  # room for both tests' PDDeployments (one GPU per instance)
# Each image hack/kind built and loaded into the cluster.
XPYD_IMAGE_ENV, ROUTER_IMAGE_ENV, PROMETHEUS_IMAGE_ENV = (
    "XPYD_KIND_XPYD_IMAGE",
    "XPYD_KIND_ROUTER_IMAGE",
    "XPYD_KIND_PROMETHEUS_IMAGE",
)
RESTRICTED_CONTAINER = {
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "capabilities": {"drop": ["ALL"]},
}


def _image(variable: str) -> str:
    image = os.environ.get(variable, "")
    assert image, f"{variable} is not set: run this group under hack/kind run"
    return image


def _meta_label(label: str) -> str:
    """The Kubernetes service discovery's name for a pod label (what a PodMonitor's relabelling reads)."""
    return "__meta_kubernetes_pod_label_" + "".join(c if c.isalnum() else "_" for c in label)


def _restricted_namespace(cluster: LocalCluster, name: str) -> None:
    cluster.kubectl("create", "namespace", name)
    cluster.kubectl("label", "namespace", name, f"{POD_SECURITY}=restricted")


def _restricted_pod(user: int) -> dict[str, Any]:
    return {
        "runAsNonRoot": True,
        "runAsUser": user,
        "runAsGroup": user,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def _proxy(namespace: str, service: str, port: int, path: str) -> str:
    """The API server's proxy path to a Service's port."""
    return f"/api/v1/namespaces/{namespace}/services/{service}:{port}/proxy/{path.lstrip('/')}"


def _advertise_gpus(cluster: LocalCluster) -> None:
    """The node has no GPUs; an extended resource in its status lets the instance pods' GPU requests fit."""
    for node in cluster.nodes:
        resource = "nvidia.com~1gpu"
        patch = [
            {"op": "add", "path": f"/status/capacity/{resource}", "value": str(GPUS_PER_NODE)},
            {"op": "add", "path": f"/status/allocatable/{resource}", "value": str(GPUS_PER_NODE)},
        ]
        cluster.kubectl("patch", "node", node, "--subresource=status", "--type=json", "-p", json.dumps(patch))


@dataclass
class ApiProxy:
    """`kubectl proxy` on a loopback port: the API server's proxy to Services, with the headers a JSON
    API needs (`kubectl create --raw` sends no Content-Type, and the router refuses such a POST)."""

    url: str

    def get_json(self, path: str, timeout: float = 10) -> Any:
        with urllib.request.urlopen(self.url + path, timeout=timeout) as response:
            return json.loads(response.read())

    def post_json(self, path: str, body: dict[str, Any], timeout: float = 60) -> Any:
        request = urllib.request.Request(
            self.url + path,
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.loads(response.read())


@pytest.fixture(scope="module")
def api_proxy(kube_cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiProxy]:
    port = free_port()
    argv = [str(kube_cluster.bin_dir / "kubectl"), "proxy", "--address=127.0.0.1", f"--port={port}"]
    log = tmp_path_factory.mktemp("kubectl-proxy") / "proxy.log"
    url = f"http://127.0.0.1:{port}"
    with started_process(argv, url, "/version", log, env=kube_cluster.env()):
        yield ApiProxy(url)


@dataclass
class Prometheus:
    """The in-cluster Prometheus: its ClusterIP URL (what the controller is given: the cluster has no
    DNS) and queries through the API server's proxy."""

    api: ApiProxy
    namespace: str
    url: str

    def query(self, promql: str) -> list[dict[str, Any]]:
        path = _proxy(
            self.namespace, "prometheus", 9090, "api/v1/query?" + urllib.parse.urlencode({"query": promql})
        )
        body = self.api.get_json(path)
        assert body["status"] == "success", body
        return list(body["data"]["result"])


def _prometheus_config(workload_namespace: str) -> dict[str, Any]:
    """Scrape the workload namespace's instance and router pods as prometheus-operator does for the
    chart's PodMonitors (in-cluster discovery), and the xpyd controller's /metrics as the chart's
    ServiceMonitor does: HTTPS (its self-signed certificate) with Prometheus's ServiceAccount token."""
    config = pod_monitor_scrape_config(list(chart_pod_monitors().values()), None, workload_namespace)
    controller = [
        {
            "source_labels": [_meta_label("app.kubernetes.io/component")],
            "regex": "controller",
            "action": "keep",
        },
        {
            "source_labels": ["__meta_kubernetes_pod_container_port_name"],
            "regex": "metrics",
            "action": "keep",
        },
    ]
    config["scrape_configs"].append(
        {
            "job_name": "xpyd-controller",
            "kubernetes_sd_configs": [{"role": "pod"}],
            "relabel_configs": controller,
            "scheme": "https",
            "tls_config": {"insecure_skip_verify": True},
            "authorization": {"credentials_file": "/var/run/secrets/kubernetes.io/serviceaccount/token"},
        }
    )
    return config


def _deploy_prometheus(
    cluster: LocalCluster, api: ApiProxy, namespace: str, workload_namespace: str
) -> Prometheus:
    _restricted_namespace(cluster, namespace)
    labels = {"app.kubernetes.io/name": "prometheus"}
    objects: list[dict[str, Any]] = [
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": "prometheus", "namespace": namespace},
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": f"{namespace}-prometheus"},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": f"{namespace}-prometheus"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": f"{namespace}-prometheus",
            },
            "subjects": [{"kind": "ServiceAccount", "name": "prometheus", "namespace": namespace}],
        },
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "prometheus", "namespace": namespace},
            "data": {"prometheus.yml": json.dumps(_prometheus_config(workload_namespace))},
        },
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "prometheus", "namespace": namespace, "labels": labels},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "serviceAccountName": "prometheus",
                        "securityContext": _restricted_pod(65534),
                        "containers": [
                            {
                                "name": "prometheus",
                                "image": _image(PROMETHEUS_IMAGE_ENV),
                                "imagePullPolicy": "Never",
                                "args": [
                                    "--config.file=/etc/prometheus/prometheus.yml",
                                    "--storage.tsdb.path=/prometheus",
                                    "--web.listen-address=:9090",
                                ],
                                "ports": [{"name": "web", "containerPort": 9090}],
                                "readinessProbe": {
                                    "httpGet": {"path": "/-/ready", "port": "web"},
                                    "periodSeconds": 2,
                                },
                                "securityContext": RESTRICTED_CONTAINER,
                                "volumeMounts": [
                                    {"name": "config", "mountPath": "/etc/prometheus"},
                                    {"name": "data", "mountPath": "/prometheus"},
                                ],
                            }
                        ],
                        "volumes": [
                            {"name": "config", "configMap": {"name": "prometheus"}},
                            {"name": "data", "emptyDir": {}},
                        ],
                    },
                },
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "prometheus", "namespace": namespace},
            "spec": {"selector": labels, "ports": [{"name": "web", "port": 9090, "targetPort": "web"}]},
        },
    ]
    cluster.kubectl(
        "apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": objects})
    )
    cluster.kubectl(
        "rollout", "status", "deployment/prometheus", "-n", namespace, "--timeout=180s", timeout=200
    )
    ip = cluster.kubectl(
        "get", "service", "prometheus", "-n", namespace, "-o", "jsonpath={.spec.clusterIP}"
    ).stdout
    return Prometheus(api, namespace, f"http://{ip}:9090")


@dataclass
class Installed:
    release: str
    release_namespace: str
    workload_namespace: str
    prometheus: Prometheus
    api: ApiProxy


@pytest.fixture(scope="module")
def installed(kube_cluster: LocalCluster, api_proxy: ApiProxy) -> Iterator[Installed]:
    """The chart from the built image in a restricted namespace, and Prometheus; uninstalled afterwards."""
    suffix = uuid.uuid4().hex[:6]
    release, release_ns, workload_ns = f"x{suffix}", f"xpyd-{suffix}", f"w-{suffix}"
    _advertise_gpus(kube_cluster)
    monitoring = f"mon-{suffix}"
    prometheus = _deploy_prometheus(kube_cluster, api_proxy, monitoring, workload_ns)
    _restricted_namespace(kube_cluster, release_ns)
    kube_cluster.kubectl("create", "namespace", workload_ns)
    repository, _, tag = _image(XPYD_IMAGE_ENV).rpartition(":")
    values = {
        "image": {"repository": repository, "tag": tag, "pullPolicy": "Never"},
        "routerAccess": {"enabled": True, "namespaces": [workload_ns]},
        "operator": {"settings": {"resyncSeconds": 2, "activePollSeconds": 0.5}},
        # Prometheus reads the controller's /metrics with its token: bound to the chart's metrics-reader
        "controller": {
            "metricsReaders": [{"kind": "ServiceAccount", "name": "prometheus", "namespace": monitoring}]
        },
    }
    install = ["install", release, str(CHART_DIR), "-n", release_ns, "--wait", "--timeout=240s"]
    installed = helm(*install, values=values, env=kube_cluster.env())
    assert installed.returncode == 0, installed.stderr
    yield Installed(release, release_ns, workload_ns, prometheus, api_proxy)
    # No --wait: the cluster is deleted next; waiting only let the pods finish their grace periods (~40 s).
    helm("uninstall", release, "-n", release_ns, env=kube_cluster.env())


def test_chart_runs_operator_and_controller_as_restricted_pods(
    kube_cluster: LocalCluster, installed: Installed
) -> None:
    """Both Deployments' pods run the image in the restricted namespace, and Prometheus scrapes the
    controller pod: pods are real, not kwok's."""
    pods = get_json(kube_cluster, "pods", "-n", installed.release_namespace)["items"]
    running = {
        p["metadata"]["labels"]["app.kubernetes.io/component"]: p
        for p in pods
        if p["status"]["phase"] == "Running"
        and all(c.get("ready") for c in p["status"].get("containerStatuses", []))
    }
    assert sorted(running) == ["controller", "operator"]
    for pod in running.values():
        assert pod["spec"]["containers"][0]["image"] == _image(XPYD_IMAGE_ENV)
        assert pod["status"]["containerStatuses"][0]["restartCount"] == 0
    wait_until(
        lambda: any(r["value"][1] == "1" for r in installed.prometheus.query('up{job="xpyd-controller"}')),
        120,
        "Prometheus in the cluster to scrape the controller pod",
    )


def _stand_in_pdd(name: str, installed: Installed) -> dict[str, Any]:
    image = _image(XPYD_IMAGE_ENV)
    return {
        "apiVersion": "xpyd.dev/v1alpha1",
        "kind": "PDDeployment",
        "metadata": {"name": name},
        "spec": {
            "model": {"name": "meta-llama/Llama-3.1-8B-Instruct", "preset": "llama-3.1-8b"},
            "engine": {"image": image, "command": ["python", "-m", "xpyd_controller.standin"]},
            "prefill": {"replicas": 2},
            "decode": {"replicas": 1},
            "router": {"image": _image(ROUTER_IMAGE_ENV), "serviceAccountName": ROUTER_ACCOUNT},
            # the kubelet restarts the engine container in its pod with the new role (a liveness probe)
            "conversion": {"switchMethod": "InPlace"},
            # Advisory: the controller reads the in-cluster Prometheus and writes status only, so the
            # sizes below are the test's.
            "autoscaling": {
                "mode": "Advisory",
                "intervalSeconds": 2,
                "prometheus": {"url": installed.prometheus.url},
            },
        },
    }


def _pods_ready(cluster: LocalCluster, namespace: str, name: str, count: int) -> bool:
    pods = instance_pods(cluster, namespace, name)
    ready = [
        p
        for p in pods
        if any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", []))
    ]
    return len(ready) == count


def _settled(cluster: LocalCluster, namespace: str, name: str, prefill: int, decode: int) -> bool:
    pods = instance_pods(cluster, namespace, name)
    moving = [p for p in pods if ANNOTATION_TRANSITION in (p["metadata"].get("annotations") or {})]
    wanted = sorted(["prefill"] * prefill + ["decode"] * decode)
    return not moving and sorted(roles(pods).values()) == wanted


def _placement(pods: list[dict[str, Any]]) -> dict[str, tuple[str, str, str]]:
    """Pod name -> (uid, node, pod IP): unchanged means the very same pods, where they were."""
    return {
        p["metadata"]["name"]: (p["metadata"]["uid"], p["spec"]["nodeName"], p["status"]["podIP"])
        for p in pods
    }


def _restarts(pods: list[dict[str, Any]]) -> dict[str, int]:
    return {p["metadata"]["name"]: p["status"]["containerStatuses"][0]["restartCount"] for p in pods}


def _engine_process(cluster: LocalCluster, namespace: str, pod: str) -> tuple[dict[str, str], list[str]]:
    """The environment and argv of the engine process (the container's PID 1) as it runs now."""
    environ = cluster.kubectl("exec", pod, "-n", namespace, "--", "cat", "/proc/1/environ").stdout
    cmdline = cluster.kubectl("exec", pod, "-n", namespace, "--", "cat", "/proc/1/cmdline").stdout
    env = dict(entry.partition("=")[::2] for entry in environ.split("\0") if "=" in entry)
    return env, [arg for arg in cmdline.split("\0") if arg]


def test_conversion_on_real_pods_behind_the_real_router(
    kube_cluster: LocalCluster, installed: Installed
) -> None:
    """2 prefill + 1 decode stand-in engines, switchMethod InPlace; asking for 1 + 2 converts a running
    prefill pod in place: the same pod (uid, node, IP), its engine container restarted once by the
    kubelet (the liveness probe saw the role label change) with XPYD_ROLE decode and kv_role
    kv_consumer; the router's service discovery moves it to the decode pool, no request sent through the
    router during the conversion fails; Prometheus sees the pod's series under its new role."""
    namespace, name = installed.workload_namespace, "kind-pd"
    apply(kube_cluster, namespace, _stand_in_pdd(name, installed))
    wait_ready(kube_cluster, namespace, name, timeout=300)
    wait_until(lambda: _pods_ready(kube_cluster, namespace, name, 3), 180, "3 ready stand-in pods")
    first = instance_pods(kube_cluster, namespace, name)
    before, restarts_before = _placement(first), _restarts(first)
    router = f"{name}-router"
    kube_cluster.kubectl(
        "rollout", "status", f"deployment/{router}", "-n", namespace, "--timeout=180s", timeout=200
    )

    traffic = Traffic(installed.api, _proxy(namespace, router, 8000, "v1/completions"), 2.0, prompt_words=32)
    with traffic:
        patch_spec(kube_cluster, namespace, name, {"prefill": {"replicas": 1}, "decode": {"replicas": 2}})
        wait_until(lambda: _settled(kube_cluster, namespace, name, 1, 2), 240, "a prefill->decode conversion")
    print(f"traffic: sent {traffic.sent}, ok {traffic.ok}, failed {traffic.failed} {traffic.last_error}")
    assert traffic.ok > 0 and traffic.failed == 0, traffic.last_error

    pods = instance_pods(kube_cluster, namespace, name)
    assert _placement(pods) == before, "the same pods on the same nodes and IPs, none replaced"
    converted = [
        p for p in pods if int((p["metadata"].get("annotations") or {}).get(ANNOTATION_CONVERSIONS, "0")) == 1
    ]
    assert len(converted) == 1 and converted[0]["metadata"]["labels"][LABEL_ROLE] == "decode"
    converted_pod = converted[0]["metadata"]["name"]
    expected_restarts = {pod: count + (pod == converted_pod) for pod, count in restarts_before.items()}
    assert _restarts(pods) == expected_restarts, "only the converted pod's container restarted, once"
    env, argv = _engine_process(kube_cluster, namespace, converted_pod)
    assert (env["XPYD_ROLE"], env["XPYD_KV_ROLE"]) == ("decode", "kv_consumer"), env
    kv_config = json.loads(argv[argv.index("--kv-transfer-config") + 1])
    assert kv_config["kv_role"] == "kv_consumer", argv
    pod_ip = converted[0]["status"]["podIP"]

    def router_sees_it_as_decode() -> bool:
        workers = installed.api.get_json(_proxy(namespace, router, 8000, "workers"))
        entries = workers.get("workers", workers) if isinstance(workers, dict) else workers
        return any(pod_ip in json.dumps(w) and "decode" in json.dumps(w).lower() for w in entries)

    wait_until(router_sees_it_as_decode, 60, "the router to list the converted pod as a decode worker")
    body = {"model": "meta-llama/Llama-3.1-8B-Instruct", "prompt": "hello", "max_tokens": 4}
    answer = installed.api.post_json(_proxy(namespace, router, 8000, "v1/completions"), body)
    assert answer["choices"], answer

    wait_until(
        lambda: bool(
            installed.prometheus.query(f'up{{pod="{converted_pod}",role="decode",pdd="{name}"}} == 1')
        ),
        120,
        "Prometheus to scrape the converted pod under its new role",
    )

    def autoscaler() -> dict[str, Any]:
        status = get_json(kube_cluster, "pdd", name, "-n", namespace).get("status") or {}
        return dict(status.get("autoscaler") or {})

    # Not missing_data: the in-cluster controller read the engines' series from the in-cluster Prometheus.
    wait_until(
        lambda: autoscaler().get("binding") not in (None, "missing_data"),
        120,
        "the in-cluster controller to decide from the in-cluster Prometheus",
    )


# Autoscaling: a GPU slow enough (1e14 FLOP/s at MFU 0.4: ~0.9 s per 2000-token prompt) that 1.6
# requests/s need more than one prefill instance (`xpyd plan` with these numbers says 2), while decode
# (16 tokens each) stays light. The stand-in engines simulate the same GPU, so the load the controller
# reads from Prometheus is the load its capacity model predicts.
SLOW_GPU = {
    "gpu": "h100-sxm",
    "peakFlops": 1e14,
    "mfu": 0.4,
    "mbu": 1.0,  # explicit: the h100-sxm preset's calibrated MBU would put the decode step near the SLO
    "hbmBandwidth": 1e12,
    "hbmBytes": 20e9,
    "link": "ib-400g",
}
MODEL = {"name": "meta-llama/Llama-3.1-8B-Instruct", "preset": "llama-3.1-8b"}
TRAFFIC_RATE = 1.6  # requests/s
PROMPT_WORDS = 2000  # the stand-in counts one token per word
OUTPUT_TOKENS = 16


def _auto_pdd(name: str, installed: Installed) -> dict[str, Any]:
    standin_spec = json.dumps({"model": MODEL, "hardware": SLOW_GPU})
    return {
        "apiVersion": "xpyd.dev/v1alpha1",
        "kind": "PDDeployment",
        "metadata": {"name": name},
        "spec": {
            "model": MODEL,
            "hardware": SLOW_GPU,
            "slo": {"ttftSeconds": 3.0, "tpotSeconds": 0.04, "attainment": 0.9},
            "engine": {
                "image": _image(XPYD_IMAGE_ENV),
                "command": ["python", "-m", "xpyd_controller.standin"],
                "env": [{"name": "XPYD_STANDIN_SPEC", "value": standin_spec}],
            },
            "prefill": {"replicas": 1, "minReplicas": 1, "maxReplicas": 4},
            "decode": {"replicas": 1, "minReplicas": 1, "maxReplicas": 2},
            # Round robin: every prefill pod gets requests (the default cache_aware keeps light traffic
            # on one), so the test can see the new pods serve.
            "router": {
                "image": _image(ROUTER_IMAGE_ENV),
                "serviceAccountName": ROUTER_ACCOUNT,
                "args": ["--policy", "round_robin"],
            },
            "autoscaling": {
                "mode": "Auto",
                "intervalSeconds": 5,
                "prometheus": {"url": installed.prometheus.url},
                "scaleUpWindowSeconds": 0,
                "scaleDownWindowSeconds": 600,
                "gpuBudget": 6,
            },
        },
    }


@dataclass
class Traffic:
    """Completions at a steady rate through the router's Service (via the API server's proxy)."""

    api: ApiProxy
    path: str
    rate: float
    prompt_words: int = PROMPT_WORDS
    sent: int = 0
    ok: int = 0
    failed: int = 0
    last_error: str = ""

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._rng = random.Random(11)
        self._pool = ThreadPoolExecutor(max_workers=64)
        self._sender = threading.Thread(target=self._send, daemon=True)

    def _one(self, prompt: str) -> None:
        body = {"model": MODEL["name"], "prompt": prompt, "max_tokens": OUTPUT_TOKENS}
        try:
            answer = self.api.post_json(self.path, body, timeout=180)
            good, error = bool(answer.get("choices")), "" if answer.get("choices") else str(answer)[:200]
        except OSError as failure:  # urllib's HTTPError and URLError are OSErrors
            good, error = False, repr(failure)[:200]
        with self._lock:
            self.ok += good
            self.failed += not good
            self.last_error = error or self.last_error

    def _send(self) -> None:
        next_at = time.monotonic()
        while not self._stop.is_set():
            # Distinct words, so no prompt shares a cached prefix with another.
            prompt = " ".join(f"w{self._rng.randrange(10**9)}" for _ in range(self.prompt_words))
            self._pool.submit(self._one, prompt)
            self.sent += 1
            next_at += 1.0 / self.rate
            self._stop.wait(max(0.0, next_at - time.monotonic()))

    def __enter__(self) -> Traffic:
        self._sender.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._sender.join()
        self._pool.shutdown(wait=True, cancel_futures=True)


def _ready_pods(cluster: LocalCluster, namespace: str, name: str, role: str) -> list[dict[str, Any]]:
    return [
        p
        for p in instance_pods(cluster, namespace, name)
        if p["metadata"]["labels"][LABEL_ROLE] == role
        and not p["metadata"].get("deletionTimestamp")
        and any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", []))
    ]


@contextlib.contextmanager
def _pods_reported(cluster: LocalCluster, namespace: str, name: str) -> Iterator[None]:
    """Afterwards (shown when the test fails): each instance pod's readiness, restarts and last container
    state, and the kubelet's Events about them (probe failures, kills, back-offs)."""
    try:
        yield
    finally:
        for pod in instance_pods(cluster, namespace, name):
            statuses = pod["status"].get("containerStatuses") or [{}]
            summary = {k: statuses[0].get(k) for k in ("ready", "restartCount", "state", "lastState")}
            print(f"{pod['metadata']['name']} {pod['metadata']['labels'][LABEL_ROLE]}: {json.dumps(summary)}")
        events = json.loads(cluster.kubectl("get", "events", "-n", namespace, "-o", "json").stdout)["items"]
        for event in events:
            if event["involvedObject"].get("kind") == "Pod" and event.get("type") == "Warning":
                print(
                    f"{event['involvedObject']['name']}: {event['reason']} x{event.get('count', 1)} {event['message']}"
                )


def _prefills_served(api: ApiProxy, namespace: str, pod: str) -> int:
    log = api.get_json(f"/api/v1/namespaces/{namespace}/pods/{pod}:8000/proxy/xpyd/requests")
    return sum(1 for r in log["requests"] if r["kind"] == "prefill" and r["status"] == "ok")


def test_controller_in_cluster_scales_real_pods_from_in_cluster_prometheus(
    kube_cluster: LocalCluster, installed: Installed
) -> None:
    """Auto mode, 1 + 1 stand-in engines and more long-prompt traffic than one prefill instance serves:
    the in-cluster controller reads the router's and the engines' series from the in-cluster Prometheus,
    writes more prefill replicas, the operator starts real pods, and the router sends them requests."""
    namespace, name = installed.workload_namespace, "kind-auto"
    apply(kube_cluster, namespace, _auto_pdd(name, installed))
    wait_ready(kube_cluster, namespace, name, timeout=300)
    wait_until(lambda: _pods_ready(kube_cluster, namespace, name, 2), 180, "1 + 1 ready stand-in pods")
    router = f"{name}-router"
    kube_cluster.kubectl(
        "rollout", "status", f"deployment/{router}", "-n", namespace, "--timeout=180s", timeout=200
    )
    first = {p["metadata"]["name"] for p in instance_pods(kube_cluster, namespace, name)}

    def pdd() -> dict[str, Any]:
        body: dict[str, Any] = get_json(kube_cluster, "pdd", name, "-n", namespace)
        return body

    traffic = Traffic(installed.api, _proxy(namespace, router, 8000, "v1/completions"), TRAFFIC_RATE)
    with traffic, _pods_reported(kube_cluster, namespace, name):
        wait_until(
            lambda: pdd()["spec"]["prefill"]["replicas"] >= 2,
            300,
            "the controller to add prefill replicas",
            interval=2,
        )
        decided = pdd()
        wait_until(
            lambda: (
                len(_ready_pods(kube_cluster, namespace, name, "prefill"))
                == pdd()["spec"]["prefill"]["replicas"]
            ),
            240,
            "the new prefill pods to be ready",
            interval=2,
        )
        prefills = [p["metadata"]["name"] for p in _ready_pods(kube_cluster, namespace, name, "prefill")]
        started = [p for p in prefills if p not in first]
        assert started, f"no new prefill pod: {prefills} (first {sorted(first)})"
        wait_until(
            lambda: all(_prefills_served(installed.api, namespace, pod) > 0 for pod in started),
            90,
            f"the router to send the new prefill pods {started} requests",
            interval=2,
        )

        # The first decision may come before the 60 s rate window is full (the queue and TTFT already
        # tell); once it is full, the rate the controller reads is the rate sent through the router.
        def arrival_rate() -> float | None:
            status = pdd().get("status") or {}
            rate = ((status.get("autoscaler") or {}).get("inputs") or {}).get("arrivalRate")
            return None if rate is None else float(rate)

        wait_until(
            lambda: abs((arrival_rate() or 0.0) - TRAFFIC_RATE) <= 0.3 * TRAFFIC_RATE,
            150,
            f"the controller to read {TRAFFIC_RATE} requests/s",
            interval=2,
        )
        latest = pdd()["status"]["autoscaler"]
    first_decision = decided["status"]["autoscaler"]
    print(f"first decision: {first_decision}\nlatest: {latest}")
    print(f"traffic: sent {traffic.sent}, ok {traffic.ok}, failed {traffic.failed} {traffic.last_error}")
    assert first_decision["binding"] != "missing_data" and first_decision["missingData"] == []
    assert latest["missingData"] == []
    assert latest["inputs"]["meanInputTokens"] == pytest.approx(PROMPT_WORDS, rel=0.1)
    decisions = kube_cluster.kubectl(
        "get", "events", "-n", namespace, "--field-selector", "reason=ScaleDecision", "-o", "json"
    )
    assert json.loads(decisions.stdout)["items"], "no ScaleDecision Event"
    assert traffic.ok > 0 and traffic.failed <= 0.05 * (traffic.ok + traffic.failed), traffic.last_error
    for pod in _ready_pods(kube_cluster, namespace, name, "prefill"):
        assert pod["spec"]["containers"][0]["image"] == _image(XPYD_IMAGE_ENV)
