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


def _refuse(message: str) -> int:
    """Exit code 2 for input the controller cannot start with, the reason on stderr."""
    print(f"xpyd controller: {message}", file=sys.stderr)
    return 2


def _settings(args: argparse.Namespace, identity: str) -> Settings:
    """The decision loop's settings from the flags; ValueError names a value it cannot use."""
    labels = LabelNames(args.label_namespace, args.label_pdd, args.label_role)
    return Settings(
        policy=args.policy,
        window_s=args.rate_window,
        labels=labels,
        prometheus_allow=tuple(args.prometheus_allow),
        identity=identity,
    )


def _start_metrics(
    args: argparse.Namespace, cluster: ControllerCluster, telemetry: PrometheusTelemetry
) -> str | None:
    """Serves /metrics if --metrics-port asks for it; why it cannot (port taken, bad certificate), or
    None. A controller nobody can scrape is refused at start rather than running unobserved."""
    if not args.metrics_port:
        return None
    try:
        _serve_metrics(args, cluster, telemetry)
    except (OSError, ssl.SSLError) as error:
        return f"cannot serve /metrics: {error}"
    return None


def _start_health(args: argparse.Namespace) -> LoopHealth:
    """The loop's liveness, served on --health-port if given; a loop that finished no pass for a
    minute, or ten ticks if longer, is wedged."""
    health = LoopHealth(max(STALE_AFTER_SECONDS, 10 * args.tick))
    if args.health_port:
        serve_health(health, args.health_port, args.metrics_address)
    return health


def _elector(args: argparse.Namespace, cluster: ControllerCluster, identity: str) -> LeaderElector | None:
    """The Lease election with --leader-elect, so only one replica decides; None runs as the only one."""
    if not args.leader_elect:
        return None
    return LeaderElector(cluster, _lease_namespace(args), args.lease_name, identity, args.lease_duration)


def _stop_on_signals() -> threading.Event:
    """An event SIGTERM and SIGINT set, so the loop ends after its pass and releases the Lease."""
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    return stop


def _pass(
    controller: Controller, elector: LeaderElector | None, telemetry: PrometheusTelemetry, once: bool
) -> None:
    """One pass if this replica leads, logging each decision (and printing it with --once). A failure
    (the API server or the Lease hiccuped) is logged and the next tick tries again."""
    try:
        leading = elector.try_lead(time.time()) if elector else True
        telemetry.set_leader(leading)
        if leading:
            # --once waits for its decisions; the loop harvests them on the next tick, so
            # a tenant whose Prometheus hangs never holds up the others' passes
            for record in controller.run_pass(time.time(), wait_s=None if once else 0.0):
                logger.info("decision: %s", _summary(record))
                if once:
                    print(_summary(record))
    except Exception:
        logger.exception("pass failed")


def _loop(
    args: argparse.Namespace,
    controller: Controller,
    elector: LeaderElector | None,
    *,
    telemetry: PrometheusTelemetry,
    health: LoopHealth,
    stop: threading.Event,
) -> None:
    """A pass every --tick until stopped (a single one with --once); each pass, failed or not, is
    timed and marks the loop live, since a failed pass is retried, not wedged."""
    while not stop.is_set():
        started = time.monotonic()
        _pass(controller, elector, telemetry, args.once)
        telemetry.record_pass(time.monotonic() - started)
        health.pass_done()
        if args.once:
            break
        stop.wait(args.tick)


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if not args.namespace and not args.all_namespaces:
        return _refuse("give --namespace NS (repeatable) or --all-namespaces")
    identity = args.identity or f"{socket.gethostname()}-{os.getpid()}"
    try:
        settings = _settings(args, identity)
        api = connect(args.kubeconfig)
    except ValueError as error:
        return _refuse(str(error))
    cluster = ControllerCluster(api, args.namespace)
    telemetry = PrometheusTelemetry()
    if problem := _start_metrics(args, cluster, telemetry):
        return _refuse(problem)
    health = _start_health(args)
    controller = Controller(cluster, PrometheusSources(), telemetry, settings)
    elector = _elector(args, cluster, identity)
    stop = _stop_on_signals()
    if not args.once:
        cluster.watch(stop)
    logger.info("controller %s started (namespaces: %s)", identity, ", ".join(args.namespace) or "all")
    try:
        _loop(args, controller, elector, telemetry=telemetry, health=health, stop=stop)
    finally:
        if elector is not None:
            elector.release(time.time())
    return 0
