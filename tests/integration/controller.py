"""Helpers for the controller's cluster tests: the controller as a real subprocess, and loopback
exporters serving vLLM-named metrics that grow at known rates (open-loop: arrivals do not depend on
capacity)."""

from __future__ import annotations

import sys
import time
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

from e2e.harness.loopback import loopback_server

from xpyd_operator.testing import OperatorProcess


class ControllerProcess(OperatorProcess):
    """`python -m xpyd_controller.controller ARGS` against a cluster, with the operator's process handling
    (own session, SIGKILL by default, log tail)."""

    def __init__(self, env: Mapping[str, str], log_path: Path, args: Sequence[str]) -> None:
        super().__init__(env, log_path)
        self.argv = [sys.executable, "-m", "xpyd_controller.controller", *args]


def scrape(port: int) -> str:
    """The text of a local /metrics endpoint ("" while nothing answers there yet)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            return str(response.read().decode())
    except OSError:
        return ""


@dataclass(frozen=True)
class Traffic:
    """What the simulated engines report: every request has the same lengths and latencies."""

    rate: float = 20.0
    prompt_tokens: float = 2000.0
    output_tokens: float = 1500.0
    ttft_s: float = 0.3
    tpot_s: float = 0.03
    waiting: float = 3.0
    running: float = 100.0
    kv_usage: float = 0.6


TOKEN_BUCKETS = (100, 1000, 2500, 5000, 10000)
SECOND_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1.0)


def _histogram(name: str, value: float, count: float, bounds: Sequence[float]) -> list[str]:
    lines = [f"# TYPE {name} histogram"]
    lines += [f'{name}_bucket{{le="{bound}"}} {count if value <= bound else 0}' for bound in bounds]
    lines += [f'{name}_bucket{{le="+Inf"}} {count}', f"{name}_sum {value * count}", f"{name}_count {count}"]
    return lines


def exposition(role: str, traffic: Traffic, elapsed: float) -> str:
    """One engine pool's /metrics after `elapsed` seconds of steady traffic."""
    count = traffic.rate * elapsed
    if role == "prefill":
        lines = _histogram("vllm:request_prompt_tokens", traffic.prompt_tokens, count, TOKEN_BUCKETS)
        lines += [
            "# TYPE vllm:prefix_cache_queries_total counter",
            f"vllm:prefix_cache_queries_total {traffic.prompt_tokens * count}",
            "# TYPE vllm:prefix_cache_hits_total counter",
            "vllm:prefix_cache_hits_total 0",
            "# TYPE vllm:num_requests_waiting gauge",
            f"vllm:num_requests_waiting {traffic.waiting}",
        ]
    else:
        lines = _histogram("vllm:request_generation_tokens", traffic.output_tokens, count, TOKEN_BUCKETS)
        lines += _histogram("vllm:time_to_first_token_seconds", traffic.ttft_s, count, SECOND_BUCKETS)
        lines += _histogram("vllm:inter_token_latency_seconds", traffic.tpot_s, count, SECOND_BUCKETS)
        lines += [
            "# TYPE vllm:num_requests_running gauge",
            f"vllm:num_requests_running {traffic.running}",
            "# TYPE vllm:kv_cache_usage_perc gauge",
            f"vllm:kv_cache_usage_perc {traffic.kv_usage}",
        ]
    return "\n".join(lines) + "\n"


@contextmanager
def engine_exporter(role: str, traffic: Traffic) -> Iterator[str]:
    """Serve one pool's metrics on loopback; yields `127.0.0.1:PORT`."""
    started = time.monotonic()

    class Exporter(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = exposition(role, traffic, time.monotonic() - started).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    with loopback_server(Exporter) as address:
        yield address


def labelled_scrape_config(targets: Mapping[str, Mapping[str, str]]) -> dict[str, Any]:
    """prometheus.yml scraping each `host:port` every second with the labels the pods' relabelling gives."""
    return {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [
            {
                "job_name": "engines",
                "static_configs": [
                    {"targets": [target], "labels": dict(labels)} for target, labels in targets.items()
                ],
            }
        ],
    }
