"""A real Prometheus server on a free loopback port, with a scrape config the caller gives."""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from e2e.harness.procs import free_port, kill_pid, wait_until
from e2e.harness.testbin import testbin_dir
from xpyd_api.names import COMPONENT_INSTANCE, COMPONENT_ROUTER, LABEL_COMPONENT


@dataclass
class PrometheusServer:
    """A running Prometheus: where to query it and where its log is."""

    url: str
    pid: int
    log_path: Path

    def query(self, promql: str) -> list[dict[str, Any]]:
        """Instant query; returns the `result` list, raising on any non-success answer."""
        params = urllib.parse.urlencode({"query": promql})
        with urllib.request.urlopen(f"{self.url}/api/v1/query?{params}", timeout=10) as response:
            body = json.loads(response.read())
        if body.get("status") != "success":
            raise RuntimeError(f"Prometheus query {promql!r} failed: {body}")
        return list(body["data"]["result"])

    def targets_up(self) -> int:
        """How many scrape targets are currently healthy."""
        with urllib.request.urlopen(f"{self.url}/api/v1/targets", timeout=10) as response:
            body = json.loads(response.read())
        return sum(1 for t in body["data"]["activeTargets"] if t.get("health") == "up")


def scrape_config(targets: Sequence[str], interval: str = "1s", job: str = "xpyd-test") -> dict[str, Any]:
    """A minimal prometheus.yml scraping `host:port` targets on loopback."""
    return {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "scrape_configs": [{"job_name": job, "static_configs": [{"targets": list(targets)}]}],
    }


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False


@contextlib.contextmanager
def start_prometheus(config: dict[str, Any], startup_timeout: float = 60) -> Iterator[PrometheusServer]:
    """Start Prometheus with `config` (a prometheus.yml as a dict); stopped by pid on exit."""
    binary = testbin_dir() / "prometheus"
    workdir = Path(tempfile.mkdtemp(prefix="xpyd-prom-"))
    (workdir / "prometheus.yml").write_text(json.dumps(config))  # JSON is valid YAML
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = workdir / "prometheus.log"
    with log_path.open("w") as log:
        process = subprocess.Popen(
            [
                str(binary),
                f"--config.file={workdir / 'prometheus.yml'}",
                f"--storage.tsdb.path={workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--web.enable-lifecycle",
                "--storage.tsdb.retention.time=1d",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    server = PrometheusServer(url=url, pid=process.pid, log_path=log_path)
    try:
        wait_until(lambda: process.poll() is not None or _ready(url), startup_timeout, f"Prometheus at {url}")
        if process.poll() is not None:
            raise RuntimeError(
                f"Prometheus exited with {process.returncode}:\n{log_path.read_text()[-3000:]}"
            )
        yield server
    finally:
        kill_pid(process.pid)
        process.wait(timeout=10)
        shutil.rmtree(workdir, ignore_errors=True)


CHART_DIR = Path(__file__).resolve().parents[2] / "charts" / "xpyd"
_RELABEL_KEYS = {"sourceLabels": "source_labels", "targetLabel": "target_label", "replacement": "replacement"}
_RELABEL_KEYS |= {"regex": "regex", "action": "action", "separator": "separator", "modulus": "modulus"}


def chart_pod_monitors() -> dict[str, dict[str, Any]]:
    """The chart's PodMonitors as `helm template` renders them (monitoring enabled), by the component
    (`xpyd.dev/component`: instance, router) of the pods each selects."""
    result = subprocess.run(
        [
            str(testbin_dir() / "helm"),
            "template",
            "xpyd",
            str(CHART_DIR),
            "--api-versions",
            "monitoring.coreos.com/v1/PodMonitor",
            "--set",
            "monitoring.podMonitor.enabled=true",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"helm template failed: {result.stderr[-2000:]}")
    monitors = [d for d in yaml.safe_load_all(result.stdout) if d and d.get("kind") == "PodMonitor"]
    by_component = {m["spec"]["selector"]["matchLabels"][LABEL_COMPONENT]: m for m in monitors}
    if sorted(by_component) != sorted([COMPONENT_INSTANCE, COMPONENT_ROUTER]) or len(monitors) != 2:
        raise RuntimeError(
            f"the chart rendered PodMonitors of {sorted(by_component)}, expected instance+router"
        )
    return by_component


def pod_monitor_scrape_config(
    pod_monitors: Sequence[dict[str, Any]], kubeconfig: Path | None, namespace: str, interval: str = "2s"
) -> dict[str, Any]:
    """prometheus.yml scraping `namespace`'s pods as prometheus-operator would for `pod_monitors`: one job
    per monitor, Kubernetes pod discovery against the API server of `kubeconfig` (None: Prometheus runs
    in the cluster and uses its pod's service account)."""
    return {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "scrape_configs": [pod_monitor_job(m, kubeconfig, namespace) for m in pod_monitors],
    }


def pod_monitor_job(pod_monitor: dict[str, Any], kubeconfig: Path | None, namespace: str) -> dict[str, Any]:
    """The scrape job prometheus-operator makes of `pod_monitor` (its single endpoint): discover the pods
    of `namespace`, drop finished ones, keep those matching its selector and container port, label
    `namespace`/`pod`/`container`, then the monitor's own relabelings."""
    spec = pod_monitor["spec"]
    (endpoint,) = spec["podMetricsEndpoints"]
    finished = {
        "source_labels": ["__meta_kubernetes_pod_phase"],
        "regex": "(Failed|Succeeded)",
        "action": "drop",
    }
    keep = [
        {
            "source_labels": [
                f"__meta_kubernetes_pod_label_{label_name(key)}",
                f"__meta_kubernetes_pod_labelpresent_{label_name(key)}",
            ],
            "regex": f"({value});true",
            "action": "keep",
        }
        for key, value in spec["selector"]["matchLabels"].items()
    ]
    keep.append(
        {
            "source_labels": ["__meta_kubernetes_pod_container_port_name"],
            "regex": endpoint["port"],
            "action": "keep",
        }
    )
    standard = [
        {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
        {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
        {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
    ]
    own = [{_RELABEL_KEYS[k]: v for k, v in rule.items()} for rule in endpoint.get("relabelings") or []]
    discovery: dict[str, Any] = {"role": "pod", "namespaces": {"names": [namespace]}}
    if kubeconfig is not None:
        discovery["kubeconfig_file"] = str(kubeconfig)
    return {
        "job_name": f"podMonitor/{namespace}/{pod_monitor['metadata']['name']}/0",
        "metrics_path": endpoint.get("path", "/metrics"),
        "kubernetes_sd_configs": [discovery],
        "relabel_configs": [finished, *keep, *standard, *own],
    }


def label_name(key: str) -> str:
    """A Kubernetes label key as Prometheus' discovery meta label spells it."""
    return "".join(c if c.isalnum() else "_" for c in key)
