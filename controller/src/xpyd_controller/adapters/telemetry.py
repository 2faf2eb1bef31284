"""The controller's own /metrics (prometheus-client): what it decided, why, and what it could not see.

Its series name every tenant's PDDeployments, so by default it is served as operators in the ecosystem
serve theirs (controller-runtime's secure metrics, kube-rbac-proxy): over HTTPS, with a self-signed
certificate unless one is given, and only to a request whose bearer token the `authorize` callback
accepts (TokenReview + SubjectAccessReview, `adapters/k8s.MetricsAccess`).
"""

from __future__ import annotations

import contextlib
import ipaddress
import ssl
import tempfile
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from http.server import ThreadingHTTPServer
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, MetricsHandler

from xpyd_api.models import PDDeployment
from xpyd_api.names import Role
from xpyd_controller.control.status import DecisionRecord

PDD_LABELS = ("namespace", "pdd")
CERTIFICATE_DAYS = 365
REQUEST_TIMEOUT_SECONDS = 10  # a client that sends nothing (or stalls the TLS handshake) is cut off
Authorize = Callable[[str | None], int]  # the Authorization header → the HTTP status to answer with


def tls_context(cert_dir: Path | None, address: str) -> ssl.SSLContext:
    """A TLS server context from `cert_dir`/tls.crt and tls.key, else from a self-signed certificate for
    `address` and localhost made now (as controller-runtime does when it is given none)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if cert_dir is not None:
        context.load_cert_chain(cert_dir / "tls.crt", cert_dir / "tls.key")
        return context
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "xpyd-controller")])
    names: list[x509.GeneralName] = [x509.DNSName("localhost")]
    with contextlib.suppress(ValueError):
        names.append(x509.IPAddress(ipaddress.ip_address(address)))
    now = datetime.now(UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + timedelta(days=CERTIFICATE_DAYS))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .sign(key, hashes.SHA256())
    )
    with tempfile.TemporaryDirectory() as scratch:  # ssl loads only files; they are gone once loaded
        cert_file, key_file = Path(scratch) / "tls.crt", Path(scratch) / "tls.key"
        cert_file.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
        key_file.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        context.load_cert_chain(cert_file, key_file)
    return context


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

    def serve(
        self, port: int, address: str, authorize: Authorize | None, tls: ssl.SSLContext | None
    ) -> ThreadingHTTPServer:
        """Serve /metrics on a daemon thread: over `tls` when given, to requests `authorize` answers 200
        for (None: to anyone who can connect); returns the server (for shutdown)."""
        telemetry = self

        class Handler(MetricsHandler):
            registry = telemetry.registry
            timeout = REQUEST_TIMEOUT_SECONDS

            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                if self.path.split("?", 1)[0] != "/metrics":
                    self.send_error(404)
                    return
                status = 200 if authorize is None else authorize(self.headers.get("Authorization"))
                if status != 200:
                    self.send_error(status)
                    return
                super().do_GET()

            def log_message(self, *args: object) -> None:  # a scrape every few seconds: no log line
                pass

        server = ThreadingHTTPServer((address, port), Handler)
        server.daemon_threads = True
        if tls is not None:  # the handshake runs on the request's thread, not the accept loop's
            server.socket = tls.wrap_socket(server.socket, server_side=True, do_handshake_on_connect=False)
        threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
        return server

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
