"""The controller process: wires the Kubernetes and Prometheus adapters, leader election and the own
/metrics endpoint around the pure decision loop. `python -m xpyd_controller.controller` = `xpyd controller`.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from xpyd_controller.cli_controller import DESCRIPTION, add_arguments
from xpyd_controller.control.lease import LeaderElector
from xpyd_controller.control.loop import Controller, Settings
from xpyd_controller.control.status import DecisionRecord
from xpyd_controller.k8s.cluster import ControllerCluster, connect
from xpyd_controller.metrics.prometheus import PrometheusSource
from xpyd_controller.metrics.promql import LabelNames
from xpyd_controller.telemetry import PrometheusTelemetry

logger = logging.getLogger("xpyd_controller")
SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


class _Sources:
    """One PrometheusSource per URL, reused across passes (each keeps its HTTP session)."""

    def __init__(self) -> None:
        self._by_url: dict[str, PrometheusSource] = {}

    def __call__(self, url: str) -> PrometheusSource:
        if url not in self._by_url:
            self._by_url[url] = PrometheusSource(url)
        return self._by_url[url]


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


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if not args.namespace and not args.all_namespaces:
        print("xpyd controller: give --namespace NS (repeatable) or --all-namespaces", file=sys.stderr)
        return 2
    try:
        labels = LabelNames(args.label_namespace, args.label_pdd, args.label_role)
        settings = Settings(policy=args.policy, window_s=args.rate_window, labels=labels)
        api = connect(args.kubeconfig)
    except ValueError as error:
        print(f"xpyd controller: {error}", file=sys.stderr)
        return 2
    cluster = ControllerCluster(api, args.namespace)
    telemetry = PrometheusTelemetry()
    if args.metrics_port:
        telemetry.serve(args.metrics_port, args.metrics_address)
    controller = Controller(cluster, _Sources(), telemetry, settings)
    identity = args.identity or f"{socket.gethostname()}-{os.getpid()}"
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
                    for record in controller.run_pass(time.time()):
                        logger.info("decision: %s", _summary(record))
                        if args.once:
                            print(_summary(record))
            except Exception:  # the API server or the Lease hiccuped: try again next tick
                logger.exception("pass failed")
            telemetry.record_pass(time.monotonic() - started)
            if args.once:
                break
            stop.wait(args.tick)
    finally:
        if elector is not None:
            elector.release(time.time())
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m xpyd_controller.controller",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
