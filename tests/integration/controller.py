"""Helpers for the controller's cluster tests: loopback exporters serving vLLM-named metrics that grow at
known rates (open-loop: arrivals do not depend on capacity), and reading the controller's /metrics."""

from __future__ import annotations

import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from e2e.harness.loopback import exposition_handler, loopback_server

from xpyd_controller.sim.exposition import EngineSeries, render


def scrape(port: int) -> str:
    """The text of a local /metrics endpoint ("" while nothing answers there yet)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            return str(response.read().decode())
    except OSError:
        return ""


def read_metrics(url: str, token: str | None = None) -> tuple[int, str]:
    """(HTTP status, text) of an HTTPS /metrics with the controller's self-signed certificate, showing
    `token` as a bearer token when given."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    unverified = ssl.create_default_context()
    unverified.check_hostname, unverified.verify_mode = False, ssl.CERT_NONE
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request, context=unverified, timeout=10) as answer:
            return answer.status, str(answer.read().decode())
    except urllib.error.HTTPError as error:
        return error.code, ""


@dataclass(frozen=True)
class Traffic:
    """What the simulated engines report: every request has the same lengths and latencies."""

    rate: float = 20.0
    prompt_tokens: float = 2000.0
    output_tokens: float = 1500.0
    ttft_s: float = 0.3
    tpot_s: float = 0.03
    waiting: int = 3
    running: int = 100
    kv_usage: float = 0.6


def exposition(role: str, traffic: Traffic, elapsed: float) -> str:
    """One engine pool's /metrics after `elapsed` seconds of steady traffic (the simulator's renderer)."""
    count = traffic.rate * elapsed
    series = EngineSeries()
    if role == "prefill":
        series.prompt_tokens.observe(traffic.prompt_tokens, count)
        series.prefix_queries = traffic.prompt_tokens * count
        series.waiting = traffic.waiting
    else:
        series.generation_tokens.observe(traffic.output_tokens, count)
        series.ttft.observe(traffic.ttft_s, count)
        series.inter_token.observe(traffic.tpot_s, count)
        series.running = traffic.running
        series.kv_usage = traffic.kv_usage
    return render(series, "m")


def garbled(text: str, values: Mapping[str, str]) -> str:
    """The exposition with the samples of the named series replaced (e.g. by "NaN", "+Inf", "1e308")."""
    lines = []
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        lines.append(f"{line.rsplit(' ', 1)[0]} {values[name]}" if name in values else line)
    return "\n".join(lines) + "\n"


@contextmanager
def engine_exporter(role: str, traffic: Traffic, garbage: Mapping[str, str] | None = None) -> Iterator[str]:
    """Serve one pool's metrics on loopback; yields `127.0.0.1:PORT`. While `garbage` (a mapping the
    caller may empty later) names series, their samples are replaced by its values."""
    started = time.monotonic()

    def render_now() -> str:
        text = exposition(role, traffic, time.monotonic() - started)
        return garbled(text, garbage) if garbage else text

    with loopback_server(exposition_handler(render_now)) as address:
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
