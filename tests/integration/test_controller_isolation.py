"""Tenant isolation in the controller: PDDeployments whose Prometheus accepts TCP and never answers do
not slow down the decisions of a healthy one (a real Prometheus), measured as decisions per second.

The loop runs with the real Prometheus adapter (its per-decision time budget) and an in-memory cluster.
The control runs the same with a single decision worker, the serial loop of before: there the healthy
tenant starves, so the measurement can tell the two apart.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

from e2e.harness.prometheus import PrometheusServer, scrape_config
from tests.unit.test_controller_loop import FakeCluster, FakeTelemetry, pdd

from xpyd_controller.control.loop import Controller, Settings
from xpyd_controller.controller import PrometheusSources

HOSTILE = 6
SECONDS = 8.0


@contextmanager
def silent_prometheus() -> Iterator[str]:
    """A TCP server on 127.0.0.1 that accepts every connection and never sends a byte."""
    server = socket.create_server(("127.0.0.1", 0), backlog=128)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}"
    finally:
        stop.set()
        thread.join()
        for connection in held:
            connection.close()
        server.close()


def _tenants(healthy_url: str, hostile_url: str | None) -> FakeCluster:
    objects: list[dict[str, Any]] = [pdd("healthy", mode="Advisory", autoscaling={"intervalSeconds": 1})]
    if hostile_url:
        objects += [
            pdd(f"hostile{i}", mode="Advisory", autoscaling={"intervalSeconds": 1}) for i in range(HOSTILE)
        ]
    cluster = FakeCluster(*objects)
    for name, body in cluster.objects.items():
        body["spec"]["autoscaling"]["prometheus"]["url"] = healthy_url if name == "healthy" else hostile_url
    return cluster


def _healthy_decisions(cluster: FakeCluster, workers: int | None = None) -> int:
    telemetry = FakeTelemetry()
    executor = ThreadPoolExecutor(workers) if workers else None
    loop = Controller(cluster, PrometheusSources(), telemetry, Settings(window_s=30), executor=executor)
    deadline = time.monotonic() + SECONDS
    while time.monotonic() < deadline:
        loop.run_pass(time.time(), wait_s=0.0)
        time.sleep(0.05)
    return sum(1 for name, _ in telemetry.records if name == "healthy")


def test_hostile_tenants_do_not_slow_a_healthy_ones_decisions(
    prometheus_factory: Callable[[dict[str, Any]], PrometheusServer],
) -> None:
    prometheus = prometheus_factory(scrape_config([]))
    baseline = _healthy_decisions(_tenants(prometheus.url, None))
    with silent_prometheus() as silent:
        isolated = _healthy_decisions(_tenants(prometheus.url, silent))
        serial = _healthy_decisions(_tenants(prometheus.url, silent), workers=1)
    print(
        f"\nhealthy decisions in {SECONDS:.0f}s: alone {baseline}, beside {HOSTILE} hostile {isolated}, "
        f"serial control {serial}"
    )
    assert baseline >= SECONDS - 2  # one per second
    assert isolated >= 0.8 * baseline
    assert serial < 0.5 * baseline  # the control: a serial loop starves the healthy tenant
