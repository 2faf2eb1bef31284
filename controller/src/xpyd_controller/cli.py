"""The `xpyd` command line. Each subcommand lives in its own module exposing `register(subparsers)`."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from xpyd_controller import __version__

# Subcommand modules, each with `register(subparsers) -> None` that sets `func` on its parser.
SUBCOMMAND_MODULES = (
    "xpyd_controller.cli_plan",
    "xpyd_controller.cli_simulate",
    "xpyd_controller.cli_controller",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="xpyd",
        description=(
            "Size, simulate and autoscale prefill/decode (PD) disaggregated LLM serving.\n\n"
            "  xpyd plan       how many prefill and decode instances for this model, GPU, link, traffic\n"
            "  xpyd simulate   replay traffic against a fleet and a policy; goodput, GPU-hours, plots\n"
            "  xpyd controller run the autoscaler: Prometheus metrics in, PDDeployment sizes out\n"
            "  xpyd version    print the version"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    version = sub.add_parser("version", help="print the xpyd version")
    version.set_defaults(func=_print_version)
    for name in SUBCOMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def _print_version(_args: argparse.Namespace) -> int:
    from xpyd_controller.sim.native import compiled_status

    status = compiled_status()
    advice = "" if status == "current" else " (run hack/native for a ~2x faster simulator)"
    print(f"xpyd {__version__}\nsimulator engine: compiled build {status}{advice}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "func", None) is None:
        parser.print_help()
        return 2
    try:
        result = args.func(args)
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader went away (`xpyd plan --sweep ... | head`): stop quietly, as Unix tools do.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
