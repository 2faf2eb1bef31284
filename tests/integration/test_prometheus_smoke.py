"""The harness's Prometheus is real: it scrapes an exporter on loopback and answers PromQL, and it finds
pods as in a cluster, by Kubernetes pod discovery with the chart's PodMonitors."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e.harness import LocalCluster, PrometheusServer
from e2e.harness.loopback import exposition_handler, loopback_server
from e2e.harness.pods import running_pods
from e2e.harness.procs import wait_until
from e2e.harness.prometheus import chart_pod_monitors, pod_monitor_scrape_config, scrape_config
from tests.integration.test_router_events import rendered

from xpyd_api.names import COMPONENT_INSTANCE, COMPONENT_ROUTER, LABEL_ROLE

pytestmark = pytest.mark.prometheus

EXPORTED_VALUE = 1234.5


def _exposition() -> str:
    return f'# TYPE xpyd_smoke_value gauge\nxpyd_smoke_value{{role="decode"}} {EXPORTED_VALUE}\n'


@pytest.fixture
def exporter() -> Iterator[str]:
    with loopback_server(exposition_handler(_exposition)) as address:
        yield address


def test_prometheus_scrapes_exporter_and_answers_promql(
    prometheus_factory: Callable[[dict[str, Any]], PrometheusServer], exporter: str
) -> None:
    prom = prometheus_factory(scrape_config([exporter]))
    wait_until(lambda: bool(prom.query("xpyd_smoke_value")), 60, "the first scrape of the exporter")
    result = prom.query('sum by (role) (xpyd_smoke_value{job="xpyd-test"})')
    assert [(r["metric"]["role"], float(r["value"][1])) for r in result] == [("decode", EXPORTED_VALUE)]
    assert prom.targets_up() == 1


def _targets(prom: PrometheusServer, healthy: bool = False) -> dict[str, dict[str, str]]:
    """Discovered targets by pod (only those scraped fine with `healthy`): the labels their series get."""
    with urllib.request.urlopen(f"{prom.url}/api/v1/targets?state=active", timeout=10) as response:
        targets = json.loads(response.read())["data"]["activeTargets"]
    return {t["labels"]["pod"]: t["labels"] for t in targets if t["health"] == "up" or not healthy}


def _series_roles(prom: PrometheusServer, namespace: str) -> dict[str, set[str]]:
    """The role labels of each engine pod's current `vllm:num_requests_running` series, by pod."""
    roles: dict[str, set[str]] = {}
    for series in prom.query(f'vllm:num_requests_running{{namespace="{namespace}"}}'):
        roles.setdefault(series["metric"]["pod"], set()).add(series["metric"].get("role", ""))
    return roles


@pytest.mark.cluster
def test_prometheus_discovers_the_pods_through_the_api_server_with_the_chart_pod_monitors(
    kube_cluster: LocalCluster,
    namespace: str,
    tmp_path: Path,
    prometheus_factory: Callable[[dict[str, Any]], PrometheusServer],
) -> None:
    """The operator's rendered instance pods and router, served on their loopback pod IPs (stand-ins and
    the real vllm-router): Prometheus finds them through the API server, labels their series as the
    chart's PodMonitors say, and follows a relabel and a deletion."""
    objects = rendered(namespace)
    engines = sorted(pod["metadata"]["name"] for pod in objects["pods"])
    monitors = chart_pod_monitors()
    config = pod_monitor_scrape_config(list(monitors.values()), kube_cluster.kubeconfig, namespace, "1s")
    with running_pods(kube_cluster, namespace, tmp_path / "pods"):
        manifest = {"apiVersion": "v1", "kind": "List", "items": [*objects["pods"], objects["router"]]}
        kube_cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(manifest))
        prom = prometheus_factory(config)
        wait_until(lambda: len(_targets(prom, healthy=True)) == len(engines) + 1, 90, "every pod scraped")
        scraped = _targets(prom)
        role_of = {
            pod["metadata"]["name"]: {pod["metadata"]["labels"][LABEL_ROLE]} for pod in objects["pods"]
        }
        wait_until(lambda: _series_roles(prom, namespace) == role_of, 30, "every engine's series")
        (router_pod,) = set(scraped) - set(engines)
        router = scraped[router_pod]
        assert router["job"] == f"podMonitor/{namespace}/{monitors[COMPONENT_ROUTER]['metadata']['name']}/0"
        assert router["pdd"] == "r" and "role" not in router
        engine_job = f"podMonitor/{namespace}/{monitors[COMPONENT_INSTANCE]['metadata']['name']}/0"
        assert {(scraped[p]["job"], scraped[p]["pdd"], scraped[p]["namespace"]) for p in engines} == {
            (engine_job, "r", namespace)
        }

        relabelled, deleted = "r-prefill-0", "r-decode-1"
        kube_cluster.kubectl(
            "label", "pod", relabelled, "-n", namespace, "--overwrite", f"{LABEL_ROLE}=decode"
        )
        wait_until(
            lambda: _series_roles(prom, namespace).get(relabelled) == {"decode"}, 30, "only the new role"
        )
        kube_cluster.kubectl("delete", "pod", deleted, "-n", namespace, "--wait=false")
        wait_until(lambda: deleted not in _targets(prom), 60, "the deleted pod to leave the targets")
        assert sorted(_targets(prom, healthy=True)) == sorted(set(scraped) - {deleted})
