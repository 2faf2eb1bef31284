"""The controller process: wires the Kubernetes and Prometheus adapters, leader election and the own
/metrics endpoint around the pure decision loop. Its entry point is `cli/controller.py` (`xpyd controller`
= `python -m xpyd_controller.cli.controller`), which imports this module, never the other way round.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import ssl
import sys
import threading
import time
from pathlib import Path

from xpyd_controller.adapters.health import LoopHealth, serve_health
from xpyd_controller.adapters.k8s import ControllerCluster, MetricsAccess, connect
from xpyd_controller.adapters.prometheus import PrometheusSource, Resolver, resolve_host
from xpyd_controller.adapters.telemetry import PrometheusTelemetry, tls_context
from xpyd_controller.control.lease import LeaderElector
from xpyd_controller.control.loop import Controller, Settings
from xpyd_controller.control.promql import LabelNames
from xpyd_controller.control.status import DecisionRecord

logger = logging.getLogger("xpyd_controller")
SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
# A loop that finished no pass for this long (or 10 ticks, if longer) is wedged: /healthz fails.
STALE_AFTER_SECONDS = 60.0


class PrometheusSources:
    """One PrometheusSource per URL and decision thread, reused across passes (each keeps its HTTP
    session and its own `last_error`, so two tenants deciding at once never see each other's)."""

    def __init__(self, resolve: Resolver = resolve_host) -> None:
        self._by_key: dict[tuple[str, int], PrometheusSource] = {}
        self._resolve = resolve

    def __call__(self, url: str) -> PrometheusSource:
        key = (url, threading.get_ident())
        if key not in self._by_key:
            self._by_key[key] = PrometheusSource(url, resolve=self._resolve)
        return self._by_key[key]


def _lease_namespace(args: argparse.Namespace) -> str:
    if args.lease_namespace:
        return str(args.lease_namespace)
    if os.environ.get("POD_NAMESPACE"):
        return os.environ["POD_NAMESPACE"]
    if SERVICE_ACCOUNT_NAMESPACE.exists():
        return SERVICE_ACCOUNT_NAMESPACE.read_text().strip()
    return str(args.namespace[0]) if args.namespace else "default"


def _summary(record: DecisionRecord) -> str:
    decision = record.decision
    return (
        f"prefill={record.desired[0]} decode={record.desired[1]} applied={record.applied} "
        f"binding={decision.binding or 'none'} reasons={','.join(decision.reasons) or 'none'}"
    )


def _serve_metrics(
    args: argparse.Namespace, cluster: ControllerCluster, telemetry: PrometheusTelemetry
) -> None:
    """/metrics as --metrics-auth says: HTTPS to authorised tokens (kubernetes), or plain HTTP (none)."""
    if args.metrics_auth == "none":
        telemetry.serve(args.metrics_port, args.metrics_address, None, None)
        return
    cert_dir = Path(args.metrics_cert_dir) if args.metrics_cert_dir else None
    tls = tls_context(cert_dir, args.metrics_address)
    telemetry.serve(args.metrics_port, args.metrics_address, MetricsAccess(cluster).status, tls)


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if not args.namespace and not args.all_namespaces:
        print("xpyd controller: give --namespace NS (repeatable) or --all-namespaces", file=sys.stderr)
        return 2
    identity = args.identity or f"{socket.gethostname()}-{os.getpid()}"
    try:
        labels = LabelNames(args.label_namespace, args.label_pdd, args.label_role)
        settings = Settings(
            policy=args.policy,
            window_s=args.rate_window,
            labels=labels,
            prometheus_allow=tuple(args.prometheus_allow),
            identity=identity,
        )
        api = connect(args.kubeconfig)
    except ValueError as error:
        print(f"xpyd controller: {error}", file=sys.stderr)
        return 2
    cluster = ControllerCluster(api, args.namespace)
    telemetry = PrometheusTelemetry()
    if args.metrics_port:
        try:
            _serve_metrics(args, cluster, telemetry)
        except (OSError, ssl.SSLError) as error:
            print(f"xpyd controller: cannot serve /metrics: {error}", file=sys.stderr)
            return 2
    health = LoopHealth(max(STALE_AFTER_SECONDS, 10 * args.tick))
    if args.health_port:
        serve_health(health, args.health_port, args.metrics_address)
    controller = Controller(cluster, PrometheusSources(), telemetry, settings)
    elector = (
        LeaderElector(cluster, _lease_namespace(args), args.lease_name, identity, args.lease_duration)
        if args.leader_elect
        else None
    )
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    if not args.once:
        cluster.watch(stop)
    logger.info("controller %s started (namespaces: %s)", identity, ", ".join(args.namespace) or "all")
    try:
        while not stop.is_set():
            started = time.monotonic()
            try:
                leading = elector.try_lead(time.time()) if elector else True
                telemetry.set_leader(leading)
                if leading:
                    # --once waits for its decisions; the loop harvests them on the next tick, so
                    # a tenant whose Prometheus hangs never holds up the others' passes
                    for record in controller.run_pass(time.time(), wait_s=None if args.once else 0.0):
                        logger.info("decision: %s", _summary(record))
                        if args.once:
                            print(_summary(record))
            except Exception:  # the API server or the Lease hiccuped: try again next tick
                logger.exception("pass failed")
            telemetry.record_pass(time.monotonic() - started)
            health.pass_done()
            if args.once:
                break
            stop.wait(args.tick)
    finally:
        if elector is not None:
            elector.release(time.time())
    return 0
