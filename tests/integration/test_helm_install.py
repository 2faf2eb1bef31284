"""The chart on the real local cluster: install, RBAC proven by the real processes, upgrade, uninstall.

kwok pods run nothing, so the operator and the controller run here as subprocesses, each with exactly the
command and arguments its installed Deployment carries and authenticated with a token of the chart's
ServiceAccount for it: a verb missing from the chart's RBAC leaves the sample PDDeployment un-Ready (or
without status.autoscaler) and fails the test.
"""

from __future__ import annotations

import json
import re
import sys
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from e2e.harness.cluster import LocalCluster
from e2e.harness.procs import free_port, wait_until
from tests.helm_chart import CHART_DIR, helm
from tests.integration.controller import read_metrics
from tests.integration.pdd import FAST_SETTINGS, apply, get_json, wait_ready

from xpyd_api.names import GROUP, PLURAL
from xpyd_operator.testing import OperatorProcess

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "crds" / "samples" / "minimal.yaml"
CRD_NAME = f"{PLURAL}.{GROUP}"
ROUTER_ACCOUNT = "xpyd-router"
POD_SECURITY_LABEL = "pod-security.kubernetes.io/enforce"
RELEASE_KINDS = "deployment,replicaset,pod,service,serviceaccount,role,rolebinding"


def _can(cluster: LocalCluster, service_account: str, namespace: str, verb: str, resource: str) -> bool:
    """`kubectl auth can-i` as a ServiceAccount; `resource` may carry a subresource after a slash."""
    resource, _, subresource = resource.partition("/")
    args = ["auth", "can-i", verb, resource, "-n", namespace, f"--as=system:serviceaccount:{service_account}"]
    if subresource:
        args.append(f"--subresource={subresource}")
    return cluster.kubectl(*args, check=False).stdout.strip() == "yes"


def _service_account_kubeconfig(cluster: LocalCluster, namespace: str, name: str, path: Path) -> Path:
    """A kubeconfig for this cluster whose only credential is a fresh token of the ServiceAccount."""
    token = cluster.kubectl("create", "token", name, "-n", namespace, "--duration=15m").stdout.strip()
    config = json.loads(cluster.kubectl("config", "view", "--raw", "--minify", "-o", "json").stdout)
    config["users"][0]["user"] = {"token": token}
    path.write_text(json.dumps(config))
    return path


def _as_chart_runs_it(cluster: LocalCluster, namespace: str, name: str, tmp_path: Path) -> OperatorProcess:
    """The installed Deployment `name`'s command and arguments, run here as its ServiceAccount.

    `python` is this interpreter and `xpyd` the console script next to it, both from this checkout.
    """
    deployment = get_json(cluster, "deployment", name, "-n", namespace)
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    program, *rest = container["command"]
    executable = sys.executable if program == "python" else str(Path(sys.executable).with_name(program))
    kubeconfig = _service_account_kubeconfig(cluster, namespace, name, tmp_path / f"{name}-kubeconfig.json")
    # The container's literal env as the chart sets it; POD_NAMESPACE and POD_IP: what its downward-API
    # env gives the pod (the controller's Lease namespace, the address /metrics binds to).
    literal = {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}
    env = {**cluster.env(), **literal, "KUBECONFIG": str(kubeconfig)}
    env |= {"POD_NAMESPACE": namespace, "POD_IP": "127.0.0.1"}
    process = OperatorProcess(env, tmp_path / f"{name}.log", (), FAST_SETTINGS)
    args = [re.sub(r"\$\((\w+)\)", lambda ref: env.get(ref[1], ref[0]), arg) for arg in container["args"]]
    process.argv = [executable, *rest, *args]
    return process


def _release_objects(cluster: LocalCluster, release: str) -> list[str]:
    selector = f"app.kubernetes.io/instance={release}"
    namespaced = cluster.kubectl("get", RELEASE_KINDS, "-A", "-l", selector, "-o", "name").stdout.split()
    cluster_wide = cluster.kubectl(
        "get", "clusterrole,clusterrolebinding", "-l", selector, "-o", "name"
    ).stdout.split()
    return namespaced + cluster_wide


def _assert_installed(cluster: LocalCluster, namespace: str, release: str, roles_in: list[str]) -> None:
    established = '{.status.conditions[?(@.type=="Established")].status}'
    assert cluster.kubectl("get", "crd", CRD_NAME, "-o", f"jsonpath={established}").stdout == "True"
    pods = get_json(cluster, "pods", "-n", namespace, "-l", f"app.kubernetes.io/instance={release}")["items"]
    components = sorted(p["metadata"]["labels"]["app.kubernetes.io/component"] for p in pods)
    assert components == ["controller", "operator"]
    for pod in pods:
        component = pod["metadata"]["labels"]["app.kubernetes.io/component"]
        assert pod["status"]["phase"] == "Running"
        assert pod["spec"]["nodeName"] in cluster.nodes
        assert pod["spec"]["serviceAccountName"] == f"{release}-xpyd-{component}"
    for component in ("operator", "controller"):
        cluster.kubectl("get", "serviceaccount", f"{release}-xpyd-{component}", "-n", namespace)
        for role_namespace in roles_in:
            kinds = "role,rolebinding" if role_namespace else "clusterrole,clusterrolebinding"
            scope = ["-n", role_namespace] if role_namespace else []
            cluster.kubectl("get", kinds, f"{release}-xpyd-{component}", *scope)


def _assert_controller_grants(
    cluster: LocalCluster, namespace: str, release: str, workload: str, unwatched_allowed: bool
) -> None:
    account = f"{namespace}:{release}-xpyd-controller"
    expected = {
        (workload, "get", "pddeployments.xpyd.dev"): True,
        (workload, "watch", "pddeployments.xpyd.dev"): True,
        (workload, "patch", "pddeployments.xpyd.dev"): True,
        (workload, "patch", "pddeployments.xpyd.dev/status"): True,
        (workload, "list", "pods"): True,
        (workload, "watch", "pods"): True,
        (workload, "create", "events"): True,
        (namespace, "get", "leases.coordination.k8s.io"): True,
        (namespace, "create", "leases.coordination.k8s.io"): True,
        (namespace, "update", "leases.coordination.k8s.io"): True,
        (workload, "update", "leases.coordination.k8s.io"): False,
        (workload, "delete", "pods"): False,
        (workload, "create", "pddeployments.xpyd.dev"): False,
        (workload, "get", "secrets"): False,
        ("default", "list", "pddeployments.xpyd.dev"): unwatched_allowed,
    }
    actual = {key: _can(cluster, account, *key) for key in expected}
    assert actual == expected


def _assert_router_grants(cluster: LocalCluster, namespace: str) -> None:
    """The routers' account may discover pods in its own namespace, and do nothing more."""
    expected = {(namespace, "list"): True, (namespace, "watch"): True, (namespace, "delete"): False}
    expected[("default", "list")] = False
    account = f"{namespace}:{ROUTER_ACCOUNT}"
    assert {key: _can(cluster, account, *key, "pods") for key in expected} == expected


def _assert_upgrade_drops_the_controller(
    cluster: LocalCluster, namespace: str, release: str, workload: str
) -> None:
    upgraded = helm(
        *("upgrade", release, str(CHART_DIR), "-n", namespace, "--reuse-values", "--wait", "--timeout=60s"),
        *("--set", "controller.enabled=false"),
        env=cluster.env(),
    )
    assert upgraded.returncode == 0, upgraded.stderr
    deployments = get_json(cluster, "deployments", "-n", namespace)["items"]
    assert [d["metadata"]["name"] for d in deployments] == [f"{release}-xpyd-operator"]
    controller_account = f"{namespace}:{release}-xpyd-controller"
    assert not _can(cluster, controller_account, workload, "list", "pddeployments.xpyd.dev")


def _restricted_namespace(cluster: LocalCluster, name: str) -> None:
    """A namespace enforcing the restricted Pod Security Standard: the API server admits the chart's pods
    only if their security contexts comply. A privileged pod is refused there (the control)."""
    cluster.kubectl("create", "namespace", name)
    cluster.kubectl("label", "namespace", name, f"{POD_SECURITY_LABEL}=restricted")
    privileged = cluster.kubectl(
        "run", "probe", "--image=x", "--privileged", "--dry-run=server", "-n", name, check=False
    )
    assert privileged.returncode != 0 and "violates PodSecurity" in privileged.stderr, privileged.stderr


def _advisory_sample(dead_prometheus: str) -> dict[str, Any]:
    """crds/samples/minimal.yaml with a model preset and the controller in Advisory mode against a
    Prometheus that is down: the controller still lists it, records "no data" in status.autoscaler and
    holds the sizes. The router runs as the chart's router account."""
    sample: dict[str, Any] = yaml.safe_load(SAMPLE.read_text())
    sample["spec"]["model"]["preset"] = "llama-3.1-8b"  # autoscaling sizes with the model's architecture
    sample["spec"]["autoscaling"] = {
        "mode": "Advisory",
        "intervalSeconds": 1,
        "prometheus": {"url": dead_prometheus},
    }
    sample["spec"]["router"]["serviceAccountName"] = ROUTER_ACCOUNT
    return sample


def _assert_metrics_need_a_reader(cluster: LocalCluster, namespace: str, port: int) -> None:
    """The controller's /metrics, as the chart serves it: HTTPS; 401 without a token, 403 for an account
    the API server knows but RBAC does not let get /metrics, the series for one bound to the chart's
    metrics-reader ClusterRole (the controller's own account reviews both through the API server)."""
    url = f"https://127.0.0.1:{port}/metrics"

    def token(account: str) -> str:
        return cluster.kubectl("create", "token", account, "-n", namespace, "--duration=15m").stdout.strip()

    wait_until(lambda: read_metrics(url)[0] == 401, 30, "/metrics to answer")
    assert read_metrics(url, "not-a-token") == (401, "")
    assert read_metrics(url, token("stranger")) == (403, "")
    status, text = read_metrics(url, token("scraper"))
    assert status == 200 and "xpyd_controller_leader 1.0" in text, (status, text[:200])
    with pytest.raises(OSError):  # no plain HTTP
        urllib.request.urlopen(url.replace("https", "http"), timeout=5)


def _has_autoscaler_status(cluster: LocalCluster, namespace: str) -> bool:
    return bool((get_json(cluster, "pdd", "minimal", "-n", namespace).get("status") or {}).get("autoscaler"))


@pytest.mark.parametrize("mode", ["AllNamespaces", "Namespaces"])
def test_install_rbac_upgrade_uninstall(
    kube_cluster: LocalCluster, namespace: str, tmp_path: Path, mode: str
) -> None:
    """Release in its own restricted namespace, the PDDeployment in the test's namespace."""
    release = f"x{uuid.uuid4().hex[:6]}"
    release_ns = f"xpyd-{release}"
    watched = [namespace] if mode == "Namespaces" else []
    values: dict[str, Any] = {  # the processes below serve their ports on this host
        "watch": {"mode": mode, "namespaces": watched},
        "operator": {"healthPort": free_port()},
        "controller": {
            "metricsPort": free_port(),
            "healthPort": free_port(),
            "metricsReaders": [{"kind": "ServiceAccount", "name": "scraper", "namespace": release_ns}],
        },
        "routerAccess": {"enabled": True, "namespaces": [] if watched else [namespace]},
        # This cluster has no prometheus-operator: the monitor is skipped and NOTES.txt says why.
        "monitoring": {"podMonitor": {"enabled": True}},
    }
    env = kube_cluster.env()
    # Negative control: RBAC is enforced, so an account without grants is refused.
    assert not _can(kube_cluster, f"{namespace}:nobody", namespace, "get", "pods")

    _restricted_namespace(kube_cluster, release_ns)
    for account in ("scraper", "stranger"):  # who scrapes the controller's /metrics, and who may not
        kube_cluster.kubectl("create", "serviceaccount", account, "-n", release_ns)
    install = ["install", release, str(CHART_DIR), "-n", release_ns, "--wait", "--timeout=120s"]
    installed = helm(*install, values=values, env=env)
    try:
        assert installed.returncode == 0, installed.stderr
        notes = installed.stdout.split("NOTES:", 1)[1]
        assert f"deploy/{release}-xpyd-operator" in notes and "kubectl get pdd" in notes
        assert f'router ServiceAccount "{ROUTER_ACCOUNT}" (get/list/watch pods) in: {namespace}' in notes
        assert "does not serve monitoring.coreos.com/v1\nPodMonitor" in notes
        _assert_installed(kube_cluster, release_ns, release, watched or [""])
        _assert_controller_grants(kube_cluster, release_ns, release, namespace, unwatched_allowed=not watched)
        operator_account = f"{release_ns}:{release}-xpyd-operator"
        assert not _can(kube_cluster, operator_account, namespace, "delete", "pddeployments.xpyd.dev")
        _assert_router_grants(kube_cluster, namespace)

        operator = _as_chart_runs_it(kube_cluster, release_ns, f"{release}-xpyd-operator", tmp_path)
        controller = _as_chart_runs_it(kube_cluster, release_ns, f"{release}-xpyd-controller", tmp_path)
        with operator, controller:
            apply(kube_cluster, namespace, _advisory_sample(f"http://127.0.0.1:{free_port()}"))
            try:
                pdd = wait_ready(kube_cluster, namespace, "minimal", timeout=60)
                wait_until(lambda: _has_autoscaler_status(kube_cluster, namespace), 30, "status.autoscaler")
            finally:
                logs = {"operator": operator.log_tail(400), "controller": controller.log_tail(400)}
                print(
                    "\n".join(f"--- {name} log ---\n{text}" for name, text in logs.items()), file=sys.stderr
                )
            assert pdd["status"]["prefill"]["ready"] == 1 and pdd["status"]["decode"]["ready"] == 1
            router = get_json(kube_cluster, "deployment", "minimal-router", "-n", namespace)
            assert router["spec"]["template"]["spec"]["serviceAccountName"] == ROUTER_ACCOUNT
            lease = get_json(kube_cluster, "lease", "xpyd-controller", "-n", release_ns)
            assert lease["spec"]["holderIdentity"]
            _assert_metrics_need_a_reader(kube_cluster, release_ns, values["controller"]["metricsPort"])
            # An RBAC denial names the account; other 403s (a namespace being deleted) do not.
            denied = f'"system:serviceaccount:{release_ns}:'
            assert not [name for name, text in logs.items() if denied in text]
            # Deleted while the operator still runs, so Kopf's finalizer is removed.
            kube_cluster.kubectl("delete", "pdd", "minimal", "-n", namespace, "--timeout=60s")

        _assert_upgrade_drops_the_controller(kube_cluster, release_ns, release, namespace)
    finally:
        uninstalled = helm("uninstall", release, "-n", release_ns, "--wait", "--timeout=60s", env=env)
        kube_cluster.kubectl(
            "delete", "namespace", release_ns, "--wait=false", "--ignore-not-found", check=False
        )
    assert uninstalled.returncode == 0, uninstalled.stderr
    wait_until(lambda: not _release_objects(kube_cluster, release), 60, f"release {release} to leave nothing")
    kube_cluster.kubectl("get", "crd", CRD_NAME)  # Helm keeps CRDs
