"""The `xpyd` command line. Each subcommand lives in its own module exposing `register(subparsers, help)`.

Only the chosen subcommand's module is imported (numpy, the simulator or the Kubernetes client are
not loaded to print help or the version): start-up is most of a short `xpyd plan` call.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from xpyd_controller import __version__

# Subcommand → (its module, with `register(subparsers, help_text)` that sets `func`; its help line).
COMMANDS = {
    "plan": ("xpyd_controller.cli.plan", "size prefill/decode pools for a model, GPU, link and traffic"),
    "simulate": (
        "xpyd_controller.cli.simulate",
        "replay traffic against a fleet and a policy; goodput, GPU-hours, plots",
    ),
    "controller": (
        "xpyd_controller.cli.controller",
        "run the autoscaling controller (reads Prometheus, writes replicas and status)",
    ),
}


def build_parser(argv: Sequence[str] = ()) -> argparse.ArgumentParser:
    """The parser; the subcommand named in `argv` gets its full flags, the others only their help line."""
    parser = argparse.ArgumentParser(
        prog="xpyd",
        description="Size, simulate and autoscale prefill/decode (PD) disaggregated LLM serving.",
    )
    parser.add_argument("--version", action="version", version=f"xpyd {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    chosen = next((arg for arg in argv if not arg.startswith("-")), None)
    for name, (module, help_text) in COMMANDS.items():
        if name == chosen:
            importlib.import_module(module).register(sub, help_text)
        else:
            sub.add_parser(name, help=help_text)
    version = sub.add_parser("version", help="print the version and which simulator engine runs")
    version.set_defaults(func=_print_version)
    return parser


def _print_version(_args: argparse.Namespace) -> int:
    from xpyd_controller.sim.native import engine_description

    print(f"xpyd {__version__}\nsimulator engine: {engine_description()}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    arguments = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(arguments)
    args = parser.parse_args(arguments)
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
