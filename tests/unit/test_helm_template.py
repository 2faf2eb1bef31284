"""What the chart renders (`helm lint`, `helm template` with the real helm binary) for the values users set."""

from __future__ import annotations

import re
import tarfile
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.helm_chart import CHART_DIR, ROOT, STANDARD_LABELS, helm, render, template

from xpyd_api.names import COMPONENT_INSTANCE, COMPONENT_ROUTER, LABEL_COMPONENT, LABEL_PDD, LABEL_ROLE

NAMESPACED = {"watch": {"mode": "Namespaces", "namespaces": ["team-a", "team-b"]}}
MONITORS = {"monitoring": {"serviceMonitor": {"enabled": True}, "podMonitor": {"enabled": True}}}
MONITORING_APIS = (
    "--api-versions",
    "monitoring.coreos.com/v1/ServiceMonitor",
    "--api-versions",
    "monitoring.coreos.com/v1/PodMonitor",
)
RBAC_ROW = re.compile(r"^\| `([^`]*)`[^|]*\| `([^`]+)` \| ([a-z, ]+)")
Rules = dict[tuple[str, str], set[str]]
# Kopf discovers what it serves from the CRDs, in both watch modes.
KOPF_CRDS: Rules = {("apiextensions.k8s.io", "customresourcedefinitions"): {"list", "watch"}}


def _documented_rules(doc: str) -> Rules:
    """The table under '## RBAC it needs' in a docs page, as {(api group, resource): verbs}; `""` is core."""
    section = (ROOT / "docs" / doc).read_text().split("## RBAC it needs", 1)[1].split("\n## ", 1)[0]
    rows = (RBAC_ROW.match(line) for line in section.splitlines())
    return {(row[1].strip('"'), row[2]): {verb.strip() for verb in row[3].split(",")} for row in rows if row}


LEASES = ("coordination.k8s.io", "leases")


REVIEWS = (("authentication.k8s.io", "tokenreviews"), ("authorization.k8s.io", "subjectaccessreviews"))


def _controller_rules() -> tuple[Rules, Rules, Rules]:
    """docs/controller.md's table split into (rules where it watches, rules on its Lease, the cluster-wide
    reviews that decide who reads its /metrics)."""
    documented = _documented_rules("controller.md")
    lease = {LEASES: documented.pop(LEASES)}
    reviews = {key: documented.pop(key) for key in REVIEWS}
    return documented, lease, reviews


def _rules(role: dict[str, Any]) -> Rules:
    rules: Rules = {}
    for rule in role["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                rules.setdefault((group, resource), set()).update(rule["verbs"])
    return rules


def _named(objects: list[dict[str, Any]], kind: str, name: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]


def _container(objects: list[dict[str, Any]], component: str) -> dict[str, Any]:
    (deployment,) = _named(objects, "Deployment", f"rel-xpyd-{component}")
    container: dict[str, Any] = deployment["spec"]["template"]["spec"]["containers"][0]
    return container


def test_helm_lint_is_clean() -> None:
    result = helm("lint", "--strict", str(CHART_DIR))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "[WARNING]" not in result.stdout and "[ERROR]" not in result.stdout


def test_helm_package_ships_the_crd_schema_and_dashboard(tmp_path: Path) -> None:
    result = helm("package", str(CHART_DIR), "--destination", str(tmp_path))
    assert result.returncode == 0, result.stderr
    (archive,) = tmp_path.glob("xpyd-*.tgz")
    with tarfile.open(archive) as packed:
        names = set(packed.getnames())
    expected = {
        "crds/pddeployments.xpyd.dev.yaml",
        "values.schema.json",
        "dashboards/xpyd.json",
        "templates/NOTES.txt",
    }
    assert {f"xpyd/{name}" for name in expected} <= names


@pytest.mark.parametrize(
    ("values", "kinds"),
    [
        pytest.param(
            {},
            {
                "ServiceAccount": 2,
                "Deployment": 2,
                "Service": 1,
                "ClusterRole": 5,  # operator, controller, the controller's metrics-auth and metrics-reader
                "ClusterRoleBinding": 4,
                "Role": 1,
                "RoleBinding": 1,
            },
            id="default-all-namespaces",
        ),
        pytest.param(
            NAMESPACED,
            {
                "ServiceAccount": 2,
                "Deployment": 2,
                "Service": 1,
                "ClusterRole": 3,
                "ClusterRoleBinding": 2,
                "Role": 5,
                "RoleBinding": 5,
            },
            id="namespaced",
        ),
        pytest.param(
            {"controller": {"enabled": False}},
            {"ServiceAccount": 1, "Deployment": 1, "ClusterRole": 2, "ClusterRoleBinding": 2},
            id="controller-off",
        ),
        pytest.param(
            {"controller": {"leaderElection": False}},
            {"ServiceAccount": 2, "Deployment": 2, "Service": 1, "ClusterRole": 5, "ClusterRoleBinding": 4},
            id="no-leader-election",
        ),
        pytest.param(
            {"controller": {"metricsAuth": "none"}},
            {"ServiceAccount": 2, "Deployment": 2, "Service": 1, "ClusterRole": 3, "ClusterRoleBinding": 3}
            | {"Role": 1, "RoleBinding": 1},
            id="metrics-unauthenticated",
        ),
        pytest.param(
            {"controller": {"metricsReaders": [{"kind": "ServiceAccount", "name": "p", "namespace": "mon"}]}},
            {"ServiceAccount": 2, "Deployment": 2, "Service": 1, "ClusterRole": 5, "ClusterRoleBinding": 5}
            | {"Role": 1, "RoleBinding": 1},
            id="metrics-readers",
        ),
    ],
)
def test_rendered_kinds(values: dict[str, Any], kinds: dict[str, int]) -> None:
    assert None not in yaml.safe_load_all(template(values).stdout), "an empty YAML document"
    objects = render(values)
    assert Counter(o["kind"] for o in objects) == kinds
    for obj in objects:
        labels = obj["metadata"]["labels"]
        assert set(STANDARD_LABELS) <= labels.keys(), obj["metadata"]
        assert labels["app.kubernetes.io/instance"] == "rel"


def test_all_namespaces_binds_cluster_roles_with_the_documented_verbs() -> None:
    objects = render({})
    (operator_role,) = _named(objects, "ClusterRole", "rel-xpyd-operator")
    (controller_role,) = _named(objects, "ClusterRole", "rel-xpyd-controller")
    assert _rules(operator_role) == _documented_rules("operator.md")
    assert _rules(controller_role) == _controller_rules()[0]
    (discovery,) = _named(objects, "ClusterRole", "rel-xpyd-operator-discovery")
    assert _rules(discovery) == KOPF_CRDS
    for name in ("rel-xpyd-operator", "rel-xpyd-operator-discovery", "rel-xpyd-controller"):
        (binding,) = _named(objects, "ClusterRoleBinding", name)
        assert binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": name,
        }
        component = "controller" if "controller" in name else "operator"
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": f"rel-xpyd-{component}", "namespace": "xpyd-system"}
        ]
    assert "--all-namespaces" in _container(objects, "operator")["args"]
    assert "--all-namespaces" in _container(objects, "controller")["args"]


def test_namespaced_mode_grants_roles_only_in_the_watched_namespaces() -> None:
    objects = render(NAMESPACED)
    for component, expected in (
        ("operator", _documented_rules("operator.md")),
        ("controller", _controller_rules()[0]),
    ):
        roles = _named(objects, "Role", f"rel-xpyd-{component}")
        assert sorted(r["metadata"]["namespace"] for r in roles) == ["team-a", "team-b"]
        assert all(_rules(role) == expected for role in roles)
        bindings = _named(objects, "RoleBinding", f"rel-xpyd-{component}")
        assert sorted(b["metadata"]["namespace"] for b in bindings) == ["team-a", "team-b"]
        args = _container(objects, component)["args"]
        assert "--all-namespaces" not in args
        assert [a for a in args if a.startswith("--namespace")] == [
            "--namespace=team-a",
            "--namespace=team-b",
        ]
    (discovery,) = _named(objects, "ClusterRole", "rel-xpyd-operator-discovery")
    assert _rules(discovery) == {**KOPF_CRDS, ("", "namespaces"): {"list", "watch"}}
    (lease_role,) = _named(objects, "Role", "rel-xpyd-controller-leader-election")
    assert lease_role["metadata"]["namespace"] == "xpyd-system"
    assert _rules(lease_role) == _controller_rules()[1]


def test_namespaced_mode_without_namespaces_watches_the_release_namespace() -> None:
    objects = render({"watch": {"mode": "Namespaces"}}, namespace="serving")
    assert [r["metadata"]["namespace"] for r in _named(objects, "Role", "rel-xpyd-operator")] == ["serving"]
    assert "--namespace=serving" in _container(objects, "operator")["args"]


@pytest.mark.parametrize(
    ("settings", "log_level", "flag"),
    [
        ({}, "info", None),
        ({"resyncSeconds": 5, "probePodIp": False}, "debug", "--debug"),
        ({}, "warning", "--quiet"),
    ],
)
def test_operator_flags_and_settings(settings: dict[str, Any], log_level: str, flag: str | None) -> None:
    values = {"operator": {"logLevel": log_level, "logFormat": "json", "settings": settings}}
    container = _container(render(values), "operator")
    assert container["command"] == ["python", "-m", "xpyd_operator"]
    assert "--log-format=json" in container["args"]
    assert {"--debug", "--quiet"} & set(container["args"]) == ({flag} if flag else set())
    env = {e["name"]: e["value"] for e in container["env"]}
    expected = {"probePodIp": True, "resyncSeconds": 30, **settings}
    assert env["XPYD_RESYNC_SECONDS"] == str(expected["resyncSeconds"])
    assert env["XPYD_PROBE_POD_IP"] == str(expected["probePodIp"]).lower()
    assert set(env) == {
        "XPYD_PROBE_POD_IP",
        "XPYD_RESYNC_SECONDS",
        "XPYD_ACTIVE_POLL_SECONDS",
        "XPYD_ENGINE_TIMEOUT_SECONDS",
        "XPYD_RESTART_WAIT_SECONDS",
        "XPYD_MAX_CREATES_PER_PASS",
        "XPYD_EXCLUDED_NAMESPACES",
        "XPYD_ROUTER_SERVICE_ACCOUNTS",
    }
    assert env["XPYD_EXCLUDED_NAMESPACES"] == "kube-system" and env["XPYD_ROUTER_SERVICE_ACCOUNTS"] == ""


@pytest.mark.parametrize(
    ("values", "args"),
    [
        (
            {},
            [
                "--all-namespaces",
                "--metrics-port=9400",
                "--metrics-address=$(POD_IP)",
                "--metrics-auth=kubernetes",
                "--health-port=8081",
                "--log-level=INFO",
                "--leader-elect",
            ],
        ),
        (
            {
                "metricsPort": 9500,
                "healthPort": 9501,
                "logLevel": "debug",
                "leaderElection": False,
                "prometheusAllowList": ["http://prom.monitoring.svc:9090"],
                "metricsAuth": "none",
            },
            [
                "--all-namespaces",
                "--metrics-port=9500",
                "--metrics-address=$(POD_IP)",
                "--metrics-auth=none",
                "--health-port=9501",
                "--prometheus-allow=http://prom.monitoring.svc:9090",
                "--log-level=DEBUG",
                "--no-leader-elect",
            ],
        ),
    ],
)
def test_controller_flags_and_metrics_service(values: dict[str, Any], args: list[str]) -> None:
    objects = render({"controller": values})
    container = _container(objects, "controller")
    assert container["command"] == ["xpyd", "controller"]
    assert container["args"] == args
    port = values.get("metricsPort", 9400)
    health = values.get("healthPort", 8081)
    assert container["ports"] == [
        {"name": "metrics", "containerPort": port, "protocol": "TCP"},
        {"name": "health", "containerPort": health, "protocol": "TCP"},
    ]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "health"}
    pod_ip = next(e for e in container["env"] if e["name"] == "POD_IP")
    assert pod_ip["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    (service,) = _named(objects, "Service", "rel-xpyd-controller-metrics")
    assert service["spec"]["ports"][0]["port"] == port


@pytest.mark.parametrize("component", ["operator", "controller"])
def test_pods_are_locked_down_and_placed_by_values(component: str) -> None:
    placement = {
        "nodeSelector": {"pool": "system"},
        "tolerations": [{"key": "system", "operator": "Exists"}],
        "affinity": {"nodeAffinity": {}},
        "resources": {"limits": {"cpu": "2"}},
    }
    objects = render({component: placement, "image": {"tag": "9.9.9", "pullPolicy": "Always"}})
    (deployment,) = _named(objects, "Deployment", f"rel-xpyd-{component}")
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert pod["serviceAccountName"] == f"rel-xpyd-{component}"
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert {m["mountPath"] for m in container["volumeMounts"]} == {"/tmp"}
    assert container["image"] == "ghcr.io/xpyd/xpyd:9.9.9"
    assert container["imagePullPolicy"] == "Always"
    assert container["resources"]["limits"]["cpu"] == "2"
    assert {key: pod[key] for key in ("nodeSelector", "tolerations", "affinity")} == {
        key: placement[key] for key in ("nodeSelector", "tolerations", "affinity")
    }


def test_image_tag_defaults_to_the_app_version() -> None:
    objects = render({})
    chart_version = re.search(r'appVersion: "([^"]+)"', (CHART_DIR / "Chart.yaml").read_text())
    assert chart_version is not None
    assert _container(objects, "operator")["image"] == f"ghcr.io/xpyd/xpyd:{chart_version[1]}"


@pytest.mark.parametrize(
    ("extra", "kinds"),
    [
        pytest.param((), [], id="no-prometheus-operator"),
        pytest.param(
            MONITORING_APIS, ["PodMonitor", "PodMonitor", "ServiceMonitor"], id="with-prometheus-operator"
        ),
    ],
)
def test_monitors_need_the_values_and_the_api(extra: tuple[str, ...], kinds: list[str]) -> None:
    objects = render(MONITORS, *extra)
    assert sorted(o["kind"] for o in objects if o["apiVersion"].startswith("monitoring.coreos.com")) == kinds
    assert not [
        o for o in render({}, *MONITORING_APIS) if o["apiVersion"].startswith("monitoring.coreos.com")
    ]


@pytest.mark.parametrize(
    ("values", "namespaces"),
    [
        ({"watch": {"mode": "Namespaces"}}, ["xpyd-system"]),
        (NAMESPACED, ["team-a", "team-b"]),
        ({"routerAccess": {"namespaces": ["edge"]}}, ["edge"]),
        ({**NAMESPACED, "routerAccess": {"namespaces": ["edge"]}}, ["edge"]),
    ],
)
def test_router_access_in_each_namespace(values: dict[str, Any], namespaces: list[str]) -> None:
    access = {"enabled": True, "serviceAccountName": "router-sa", **values.get("routerAccess", {})}
    objects = render({**values, "routerAccess": access})
    for kind in ("ServiceAccount", "Role", "RoleBinding"):
        assert sorted(o["metadata"]["namespace"] for o in _named(objects, kind, "router-sa")) == namespaces
    for role in _named(objects, "Role", "router-sa"):
        assert _rules(role) == {("", "pods"): {"get", "list", "watch"}}
    for binding in _named(objects, "RoleBinding", "router-sa"):
        namespace = binding["metadata"]["namespace"]
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": "router-sa", "namespace": namespace}
        ]


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            {"routerAccess": {"enabled": True}},
            "routerAccess.namespaces is empty: with watch.mode AllNamespaces, list the namespaces",
        ),
        (
            {"watch": {"namespaces": ["team-a"]}},
            'watch.namespaces=["team-a"] is only used with watch.mode Namespaces',
        ),
    ],
)
def test_inconsistent_values_fail_naming_the_value(values: dict[str, Any], message: str) -> None:
    result = template(values)
    assert result.returncode != 0
    assert message in result.stderr


@pytest.mark.parametrize(("namespace", "expected"), [("", "xpyd-system"), ("monitoring", "monitoring")])
def test_dashboard_config_map_carries_the_dashboard_file(namespace: str, expected: str) -> None:
    assert not [o for o in render({}) if o["kind"] == "ConfigMap"]
    dashboard = {"enabled": True, "namespace": namespace}
    (config_map,) = [o for o in render({"monitoring": {"dashboard": dashboard}}) if o["kind"] == "ConfigMap"]
    assert config_map["metadata"]["namespace"] == expected
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert config_map["data"] == {
        "xpyd.json": (CHART_DIR / "dashboards" / "xpyd.json").read_text().rstrip("\n")
    }


def _prometheus_label(pod_label: str) -> str:
    """How Prometheus' Kubernetes discovery names a pod label: __meta_kubernetes_pod_label_<sanitised>."""
    return "__meta_kubernetes_pod_label_" + re.sub(r"[^a-zA-Z0-9_]", "_", pod_label)


@pytest.mark.parametrize(
    ("values", "selector"), [({}, {"any": True}), (NAMESPACED, {"matchNames": ["team-a", "team-b"]})]
)
def test_pod_monitors_scrape_instances_with_pdd_and_role_and_routers_with_pdd(
    values: dict[str, Any], selector: dict[str, Any]
) -> None:
    objects = render({**MONITORS, **values}, *MONITORING_APIS)
    monitor, routers = [o for o in objects if o["kind"] == "PodMonitor"]
    assert monitor["spec"]["selector"] == {"matchLabels": {LABEL_COMPONENT: COMPONENT_INSTANCE}}
    # Router pods on their own metrics port, labelled with the PDDeployment and no role (both pools).
    assert routers["spec"]["selector"] == {"matchLabels": {LABEL_COMPONENT: COMPONENT_ROUTER}}
    assert routers["spec"]["namespaceSelector"] == selector
    (router_endpoint,) = routers["spec"]["podMetricsEndpoints"]
    assert router_endpoint["port"] == "metrics"
    assert router_endpoint["relabelings"] == [
        {"sourceLabels": [_prometheus_label(LABEL_PDD)], "targetLabel": "pdd"}
    ]
    assert monitor["spec"]["namespaceSelector"] == selector
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    relabel = {r["targetLabel"]: r["sourceLabels"] for r in endpoint["relabelings"]}
    assert relabel == {"pdd": [_prometheus_label(LABEL_PDD)], "role": [_prometheus_label(LABEL_ROLE)]}
    (service_monitor,) = [o for o in objects if o["kind"] == "ServiceMonitor"]
    (service,) = _named(objects, "Service", "rel-xpyd-controller-metrics")
    assert service_monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    # The controller labels its series with the PDDeployment's namespace: the target's must not replace it.
    # It scrapes over HTTPS with Prometheus's own token, which the controller reviews.
    assert service_monitor["spec"]["endpoints"] == [
        {
            "port": "metrics",
            "path": "/metrics",
            "interval": "30s",
            "honorLabels": True,
            "scheme": "https",
            "bearerTokenFile": "/var/run/secrets/kubernetes.io/serviceaccount/token",
            "tlsConfig": {"insecureSkipVerify": True},
        }
    ]


@pytest.mark.parametrize(
    ("values", "named", "rule"),
    [
        ({"operator": {"replicas": -1}}, "/operator/replicas", "minimum: got -1, want 0"),
        ({"operator": {"replicas": 2}}, "/operator/replicas", "maximum: got 2, want 1"),
        ({"controller": {"replicas": -3}}, "/controller/replicas", "minimum: got -3, want 0"),
        (
            {"operator": {"logLevel": "verbose"}},
            "/operator/logLevel",
            "value must be one of 'debug', 'info', 'warning'",
        ),
        (
            {"watch": {"mode": "Everywhere"}},
            "/watch/mode",
            "value must be one of 'AllNamespaces', 'Namespaces'",
        ),
        ({"watch": {"namespaces": ["Team_A"]}}, "/watch/namespaces/0", "'Team_A' does not match pattern"),
        (
            {"operator": {"settings": {"resyncSeconds": 0}}},
            "/operator/settings/resyncSeconds",
            "exclusiveMinimum",
        ),
        (
            {"controller": {"metricsPort": 70000}},
            "/controller/metricsPort",
            "maximum: got 70,000, want 65,535",
        ),
        ({"image": {"pullPolicy": "Sometimes"}}, "/image/pullPolicy", "value must be one of"),
        (
            {"monitoring": {"podMonitor": {"interval": "soon"}}},
            "/monitoring/podMonitor/interval",
            "does not match pattern",
        ),
        ({"operatr": {"replicas": 1}}, "at ''", "additional properties 'operatr' not allowed"),
    ],
)
def test_invalid_values_are_rejected_naming_the_value(values: dict[str, Any], named: str, rule: str) -> None:
    for result in (template(values), helm("lint", str(CHART_DIR), values=values)):
        assert result.returncode != 0
        output = result.stdout + result.stderr
        assert named in output and rule in output, output


def test_router_accounts_and_excluded_namespaces_reach_the_operator() -> None:
    values = {
        "routerAccess": {"enabled": True, "namespaces": ["team-a"]},
        "operator": {"allowedRouterServiceAccounts": ["custom-router"]},
        "watch": {"excludedNamespaces": ["kube-system", "kube-public"]},
    }
    env = {e["name"]: e["value"] for e in _container(render(values), "operator")["env"]}
    assert env["XPYD_ROUTER_SERVICE_ACCOUNTS"] == "xpyd-router,custom-router"
    assert env["XPYD_EXCLUDED_NAMESPACES"] == "kube-system,kube-public"


def test_network_policies_are_optional_and_limit_metrics_to_their_peers() -> None:
    assert not [o for o in render({}) if o["kind"] == "NetworkPolicy"]
    peers = [{"namespaceSelector": {"matchLabels": {"name": "monitoring"}}}]
    objects = render({"networkPolicy": {"enabled": True, "metricsFrom": peers}})
    (operator,) = _named(objects, "NetworkPolicy", "rel-xpyd-operator")
    assert operator["spec"]["ingress"] == [] and operator["spec"]["policyTypes"] == ["Ingress"]
    (controller,) = _named(objects, "NetworkPolicy", "rel-xpyd-controller")
    [rule] = controller["spec"]["ingress"]
    assert rule["from"] == peers and rule["ports"] == [{"port": 9400, "protocol": "TCP"}]
    default = _named(render({"networkPolicy": {"enabled": True}}), "NetworkPolicy", "rel-xpyd-controller")[0]
    assert default["spec"]["ingress"][0]["from"] == [{"podSelector": {}}]


def test_metrics_are_read_through_the_api_servers_reviews_by_default() -> None:
    readers = [{"kind": "ServiceAccount", "name": "prometheus", "namespace": "monitoring"}]
    objects = render({"controller": {"metricsReaders": readers}})
    (auth,) = _named(objects, "ClusterRole", "rel-xpyd-controller-metrics-auth")
    assert _rules(auth) == _controller_rules()[2]
    (bound,) = _named(objects, "ClusterRoleBinding", "rel-xpyd-controller-metrics-auth")
    assert bound["subjects"] == [
        {"kind": "ServiceAccount", "name": "rel-xpyd-controller", "namespace": "xpyd-system"}
    ]
    (reader,) = _named(objects, "ClusterRole", "rel-xpyd-controller-metrics-reader")
    assert reader["rules"] == [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]
    (reading,) = _named(objects, "ClusterRoleBinding", "rel-xpyd-controller-metrics-reader")
    assert (
        reading["subjects"] == readers and reading["roleRef"]["name"] == "rel-xpyd-controller-metrics-reader"
    )
