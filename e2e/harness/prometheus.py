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
from xpyd_api.names import COMPONENT_INSTANCE, LABEL_COMPONENT


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


_ENGINE_PODS = {"matchLabels": {LABEL_COMPONENT: COMPONENT_INSTANCE}}


def chart_pod_monitor() -> dict[str, Any]:
    """The chart's PodMonitor for engine pods, as `helm template` renders it (monitoring enabled)."""
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
    monitors = [
        d
        for d in yaml.safe_load_all(result.stdout)
        if d and d.get("kind") == "PodMonitor" and d["spec"]["selector"] == _ENGINE_PODS
    ]
    if len(monitors) != 1:
        raise RuntimeError(f"the chart rendered {len(monitors)} PodMonitors of engine pods, expected 1")
    return dict(monitors[0])


def pod_monitor_scrape_config(
    pod_monitor: dict[str, Any], sd_file: Path, interval: str = "2s"
) -> dict[str, Any]:
    """prometheus.yml scraping pods the way prometheus-operator turns `pod_monitor` into a scrape job:
    keep pods matching its selector and container port, label `namespace`/`pod`/`container`, then the
    monitor's own relabelings.

    The pods come from `sd_file`, which `PodRunner` keeps in Kubernetes service discovery's shape (one
    target per container port, with the same `__meta_kubernetes_*` labels), because the Debian Prometheus
    build the tests use has no `kubernetes_sd_configs`; the relabelling is the one a cluster would run.
    """
    spec = pod_monitor["spec"]
    (endpoint,) = spec["podMetricsEndpoints"]
    keep = [
        {
            "source_labels": [f"__meta_kubernetes_pod_label_{label_name(key)}"],
            "regex": value,
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
    return {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "scrape_configs": [
            {
                "job_name": f"podMonitor/{pod_monitor['metadata']['name']}",
                "metrics_path": endpoint.get("path", "/metrics"),
                "file_sd_configs": [{"files": [str(sd_file)], "refresh_interval": interval}],
                "relabel_configs": [*keep, *standard, *own],
            }
        ],
    }


def label_name(key: str) -> str:
    """A Kubernetes label key as Prometheus' discovery meta label spells it."""
    return "".join(c if c.isalnum() else "_" for c in key)
