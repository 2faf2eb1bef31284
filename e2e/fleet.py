"""The live fleet's I/O: one loopback /metrics server per instance pod, following the cluster's pods.

Pods on fake (kwok) nodes run nothing, so the simulated engines of `xpyd_controller.sim.live` stand in
for them. `FleetRunner` polls one PDDeployment's instance pods, and for each pod serves its engine's
/metrics on 127.0.0.1 (a free port), annotates the pod with `xpyd.dev/metrics-url` (the operator reads a
draining instance's requests in flight there) and lists it in a Prometheus file_sd file with the labels
namespace, pdd and role (what the controller's PromQL selects on). Role and serving relabels are followed:
a serving label set to false stops new work (the router's rule), a role label change switches the engine.
A clock thread advances the fleet in real time.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client, config

from e2e.harness.loopback import exposition_handler, loopback_server
from xpyd_api.names import (
    ANNOTATION_METRICS_URL,
    COMPONENT_INSTANCE,
    LABEL_COMPONENT,
    LABEL_PDD,
    LABEL_ROLE,
    LABEL_SERVING,
    Role,
)
from xpyd_controller.sim.live import FleetStats, LiveFleet

logger = logging.getLogger(__name__)

CLOCK_TICK_S = 0.05  # how often the fleet's clock catches up with the wall clock
POD_POLL_S = 1.0


def file_sd_scrape_config(sd_file: Path, interval_s: float = 2.0) -> dict[str, Any]:
    """prometheus.yml scraping every target listed in `sd_file` (re-read on change and every interval)."""
    interval = f"{interval_s:g}s"
    return {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "scrape_configs": [
            {
                "job_name": "xpyd-live-fleet",
                "file_sd_configs": [{"files": [str(sd_file)], "refresh_interval": interval}],
            }
        ],
    }


@dataclass(frozen=True)
class RoleSwitch:
    """A pod the fleet saw relabelled: when (fleet seconds), which, and into which role."""

    at_s: float
    pod: str
    to: Role


@dataclass(frozen=True)
class PodView:
    """What the fleet needs of an instance pod."""

    name: str
    role: Role
    serving: bool  # labelled serving and Ready: the router sends it work
    gone: bool  # being deleted

    @classmethod
    def of(cls, pod: Any) -> PodView | None:
        labels = pod.metadata.labels or {}
        try:
            role = Role(labels.get(LABEL_ROLE, ""))
        except ValueError:
            return None
        conditions = (pod.status.conditions if pod.status else None) or []
        ready = any(c.type == "Ready" and c.status == "True" for c in conditions)
        return cls(
            name=pod.metadata.name,
            role=role,
            serving=ready and labels.get(LABEL_SERVING) == "true",
            gone=pod.metadata.deletion_timestamp is not None,
        )


class FleetRunner:
    """Runs `fleet` in real time as the engines of one PDDeployment's pods; stop it with `close()`."""

    def __init__(
        self, fleet: LiveFleet, kubeconfig: Path, *, namespace: str, pdd: str, sd_file: Path, model_name: str
    ) -> None:
        self.fleet = fleet
        self.namespace = namespace
        self.pdd = pdd
        self.sd_file = sd_file
        self.model_name = model_name
        self.switches: list[RoleSwitch] = []  # pods relabelled to the other role, as the fleet saw them
        self._api = client.CoreV1Api(config.new_client_from_config(config_file=str(kubeconfig)))
        self._lock = threading.Lock()
        self._servers: dict[str, contextlib.ExitStack] = {}  # one loopback /metrics server per pod
        self._addresses: dict[str, str] = {}
        self._known: dict[str, PodView] = {}
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._run_clock, name="fleet-clock", daemon=True),
            threading.Thread(target=self._run_pods, name="fleet-pods", daemon=True),
        ]
        self._write_targets()

    def start(self) -> FleetRunner:
        for thread in self._threads:
            thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        for thread in self._threads:
            if thread.is_alive():
                thread.join(timeout=10)
        for server in self._servers.values():
            server.close()
        self._servers.clear()
        self._addresses.clear()

    def stats(self) -> FleetStats:
        with self._lock:
            return self.fleet.stats()

    def roles(self) -> dict[str, Role]:
        """Each simulated engine's pod and role."""
        with self._lock:
            return self.fleet.roles()

    def metrics_text(self, pod: str) -> str:
        """The pod's engine's /metrics body; empty once the pod has left the fleet."""
        with self._lock:
            return self.fleet.metrics_text(pod, self.model_name) if pod in self.fleet else ""

    # ---- threads ------------------------------------------------------------------------------------

    def _run_clock(self) -> None:
        last = time.monotonic()
        while not self._stop.wait(CLOCK_TICK_S):
            now = time.monotonic()
            with self._lock:
                self.fleet.advance(now - last)
            last = now

    def _run_pods(self) -> None:
        while not self._stop.is_set():
            try:
                self.sync(self._list_pods())
            except Exception:  # the API server may blip; the next poll is level-based and catches up
                logger.exception("fleet: pod sync failed")
            self._stop.wait(POD_POLL_S)

    def _list_pods(self) -> list[PodView]:
        selector = f"{LABEL_PDD}={self.pdd},{LABEL_COMPONENT}={COMPONENT_INSTANCE}"
        pods = self._api.list_namespaced_pod(self.namespace, label_selector=selector).items
        return [view for view in map(PodView.of, pods) if view is not None]

    # ---- following the pods ------------------------------------------------------------------------

    def sync(self, pods: list[PodView]) -> None:
        """Make the fleet, the servers and the target file match `pods` (level-based, idempotent)."""
        present = {pod.name: pod for pod in pods if not pod.gone}
        changed = False
        for name in [n for n in self._known if n not in present]:
            self._drop(name)
            changed = True
        for name, pod in present.items():
            known = self._known.get(name)
            if known is None:
                self._adopt(pod)
                changed = True
                continue
            with self._lock:
                if pod.role is not known.role:
                    self.fleet.set_role(name, pod.role)
                    self.switches.append(RoleSwitch(self.fleet.now_s, name, pod.role))
                    changed = True
                if pod.serving != known.serving:
                    self.fleet.set_serving(name, pod.serving)
            self._known[name] = pod
        if changed:
            self._write_targets()

    def _adopt(self, pod: PodView) -> None:
        with self._lock:
            self.fleet.add(pod.name, pod.role, pod.serving)
        server = contextlib.ExitStack()
        address = server.enter_context(
            loopback_server(exposition_handler(lambda: self.metrics_text(pod.name)))
        )
        self._servers[pod.name] = server
        self._addresses[pod.name] = address
        self._known[pod.name] = pod
        url = f"http://{address}/metrics"
        annotations = {"metadata": {"annotations": {ANNOTATION_METRICS_URL: url}}}
        with contextlib.suppress(client.ApiException):  # deleted meanwhile: the next poll drops it
            self._api.patch_namespaced_pod(pod.name, self.namespace, annotations)

    def _drop(self, name: str) -> None:
        with self._lock:
            if name in self.fleet:
                self.fleet.remove(name)
        server = self._servers.pop(name, None)
        if server is not None:
            server.close()
        self._addresses.pop(name, None)
        self._known.pop(name, None)

    def _write_targets(self) -> None:
        """Rewrite the file_sd file atomically (Prometheus must never read half of it)."""
        targets = [
            {
                "targets": [self._addresses[name]],
                "labels": {"namespace": self.namespace, "pdd": self.pdd, "role": str(pod.role), "pod": name},
            }
            for name, pod in sorted(self._known.items())
            if name in self._addresses
        ]
        partial = self.sd_file.with_suffix(".tmp")
        partial.write_text(json.dumps(targets, indent=1))
        partial.replace(self.sd_file)


@contextlib.contextmanager
def running_fleet(
    fleet: LiveFleet, kubeconfig: Path, *, namespace: str, pdd: str, sd_file: Path, model_name: str
) -> Iterator[FleetRunner]:
    """A started `FleetRunner`, closed (threads joined, servers shut) on exit."""
    runner = FleetRunner(
        fleet, kubeconfig, namespace=namespace, pdd=pdd, sd_file=sd_file, model_name=model_name
    ).start()
    try:
        yield runner
    finally:
        runner.close()
