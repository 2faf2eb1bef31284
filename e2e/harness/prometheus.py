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

from e2e.harness.procs import free_port, kill_pid, wait_until
from e2e.harness.testbin import testbin_dir


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
