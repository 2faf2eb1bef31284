"""`xpyd controller` (= `python -m xpyd_controller.cli.controller`): run the autoscaling controller against
the current cluster. The process itself is `controller.py`, imported only when the command runs."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

# Policies that take the spec's autoscaling windows and tolerance as knobs (control/setup.py).
LIVE_POLICIES = ("xpyd", "threshold")

DESCRIPTION = """\
Run the xpyd autoscaling controller: every spec.autoscaling.intervalSeconds, for each PDDeployment whose
spec.autoscaling.mode is Advisory or Auto, read the engines' metrics from spec.autoscaling.prometheus.url,
ask the policy for prefill/decode sizes, write status.autoscaler (inputs, desired sizes, binding
constraint, predicted TTFT/TPOT, reasons) and, in Auto, spec.prefill.replicas and spec.decode.replicas.
No metrics at all (Prometheus down, no matching series) holds the sizes; it never scales down on that.

examples:
  xpyd controller --namespace serving                 # one namespace, leader election on
  xpyd controller --all-namespaces --metrics-port 9400
  xpyd controller --namespace serving --once --no-leader-elect   # one pass, print decisions, exit

Engine series must carry the labels namespace, pdd and role (rename with --label-*); docs/controller.md
shows the scrape relabelling and the RBAC the controller needs."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument(
        "--namespace",
        action="append",
        default=[],
        metavar="NS",
        help="watch PDDeployments in NS (repeatable)",
    )
    scope.add_argument("--all-namespaces", action="store_true", help="watch PDDeployments in every namespace")
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster, then $KUBECONFIG)")
    parser.add_argument(
        "--metrics-port", type=int, default=9400, help="port of the controller's own /metrics (9400; 0 = off)"
    )
    parser.add_argument("--metrics-address", default="0.0.0.0", help="address /metrics listens on (0.0.0.0)")
    parser.add_argument(
        "--metrics-auth",
        choices=("kubernetes", "none"),
        default="kubernetes",
        help="who may read /metrics: kubernetes (default) serves HTTPS to a bearer token the API server "
        "authenticates (TokenReview) whose user may get the non-resource URL /metrics "
        "(SubjectAccessReview); none serves plain HTTP to anyone who can connect (bind it to loopback, or "
        "to the pod IP behind a NetworkPolicy)",
    )
    parser.add_argument(
        "--metrics-cert-dir",
        metavar="DIR",
        help="tls.crt and tls.key of /metrics with --metrics-auth kubernetes (default: a self-signed "
        "certificate made at start)",
    )
    parser.add_argument(
        "--health-port",
        type=int,
        default=0,
        help="port of /healthz (the loop completes passes) and /readyz (it completed one) (0 = off)",
    )
    parser.add_argument(
        "--prometheus-allow",
        action="append",
        default=[],
        metavar="URL",
        help="Prometheus URL prefix a PDDeployment may name (repeatable; none = any URL that is not "
        "link-local or a cloud metadata address)",
    )
    elect = parser.add_mutually_exclusive_group()
    elect.add_argument(
        "--leader-elect",
        dest="leader_elect",
        action="store_true",
        default=True,
        help="decide only while holding the leader Lease (default): replicas can run side by side",
    )
    elect.add_argument(
        "--no-leader-elect", dest="leader_elect", action="store_false", help="act without a Lease"
    )
    parser.add_argument(
        "--lease-namespace",
        help="namespace of the Lease (default: the pod's namespace, else the first --namespace, else default)",
    )
    parser.add_argument("--lease-name", default="xpyd-controller", help="name of the Lease (xpyd-controller)")
    parser.add_argument(
        "--lease-duration",
        type=float,
        default=15.0,
        help="seconds a leader holds the Lease without renewing (15)",
    )
    parser.add_argument("--identity", help="this replica's name in the Lease (default: hostname-pid)")
    parser.add_argument(
        "--policy",
        default="xpyd",
        choices=LIVE_POLICIES,
        help="policy deciding the sizes (xpyd); both take the spec's windows and tolerance as knobs",
    )
    parser.add_argument(
        "--rate-window", type=float, default=60.0, help="seconds of history behind rates and quantiles (60)"
    )
    parser.add_argument(
        "--tick",
        type=float,
        default=1.0,
        help="seconds between passes; each PDD is decided at its own interval (1)",
    )
    for label, default in (("namespace", "namespace"), ("pdd", "pdd"), ("role", "role")):
        parser.add_argument(
            f"--label-{label}",
            default=default,
            help=f"name of the series label holding the {label} ({default})",
        )
    parser.add_argument("--once", action="store_true", help="one pass over every PDDeployment, then exit")
    parser.add_argument("--log-level", default="INFO", help="logging level (INFO)")


def register(subparsers: Any, help_text: str) -> None:
    parser = subparsers.add_parser(
        "controller",
        help=help_text,
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser)
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from xpyd_controller.controller import run

    return run(args)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m xpyd_controller.cli.controller",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser)
    return _run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
