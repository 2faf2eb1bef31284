"""The controller's own /metrics (prometheus-client): what it decided, why, and what it could not see."""

from __future__ import annotations

import contextlib

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from xpyd_api.models import PDDeployment
from xpyd_api.names import Role
from xpyd_controller.control.status import DecisionRecord

PDD_LABELS = ("namespace", "pdd")


class PrometheusTelemetry:
    """`Telemetry` backed by a prometheus-client registry (its own, so tests can run several)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.desired = Gauge(
            "xpyd_controller_desired_replicas",
            "Instances per role the last decision asked for.",
            [*PDD_LABELS, "role"],
            registry=self.registry,
        )
        self.decisions = Counter(
            "xpyd_controller_decisions",
            "Decisions taken, by the constraint that bound them.",
            [*PDD_LABELS, "binding"],
            registry=self.registry,
        )
        self.missing = Counter(
            "xpyd_controller_missing_data",
            "Decisions taken without this signal (query failed, empty or NaN).",
            [*PDD_LABELS, "signal"],
            registry=self.registry,
        )
        self.predicted_ttft = Gauge(
            "xpyd_controller_predicted_ttft_seconds",
            "TTFT the capacity model predicts at the desired prefill pool.",
            PDD_LABELS,
            registry=self.registry,
        )
        self.predicted_tpot = Gauge(
            "xpyd_controller_predicted_tpot_seconds",
            "TPOT the capacity model predicts at the desired decode pool.",
            PDD_LABELS,
            registry=self.registry,
        )
        self.decode_session = Gauge(
            "xpyd_controller_decode_session_seconds",
            "How long one request holds decode KV as the model sized it (measured where longer).",
            PDD_LABELS,
            registry=self.registry,
        )
        self.loop_seconds = Histogram(
            "xpyd_controller_loop_duration_seconds",
            "Wall time of one pass over every PDDeployment in scope.",
            registry=self.registry,
        )
        self.leader = Gauge(
            "xpyd_controller_leader", "1 while this replica holds the leader lease.", registry=self.registry
        )

    def serve(self, port: int, address: str = "0.0.0.0") -> None:
        start_http_server(port, addr=address, registry=self.registry)

    def record_decision(self, pdd: PDDeployment, record: DecisionRecord) -> None:
        names = (pdd.namespace, pdd.name)
        for role, count in zip(Role, record.desired, strict=True):
            self.desired.labels(*names, str(role)).set(count)
        self.decisions.labels(*names, record.decision.binding or "none").inc()
        for signal in record.missing:
            self.missing.labels(*names, signal).inc()
        for gauge, key in (
            (self.predicted_ttft, "predicted_ttft_seconds"),
            (self.predicted_tpot, "predicted_tpot_seconds"),
            (self.decode_session, "decode_session_seconds"),
        ):
            value = record.decision.details.get(key)
            if value is not None:
                gauge.labels(*names).set(value)

    def forget(self, namespace: str, name: str) -> None:
        """Drop the gauges of a PDDeployment that is gone or no longer autoscaled (counters stay)."""
        for role in Role:
            self._remove(self.desired, namespace, name, str(role))
        for gauge in (self.predicted_ttft, self.predicted_tpot, self.decode_session):
            self._remove(gauge, namespace, name)

    @staticmethod
    def _remove(gauge: Gauge, *labels: str) -> None:
        with contextlib.suppress(KeyError):  # never set for this object
            gauge.remove(*labels)

    def record_pass(self, seconds: float) -> None:
        self.loop_seconds.observe(seconds)

    def set_leader(self, leading: bool) -> None:
        self.leader.set(1 if leading else 0)
