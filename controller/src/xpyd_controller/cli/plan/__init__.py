"""`xpyd plan`: size the prefill and decode pools for a model, GPU, link, workload and SLOs.

A thin edge over `xpyd_controller.model`: `arguments` parses the flags once into specs, `sizing` calls
the vectorised `size_pools` (a sweep's points in one call), `render` prints a table or JSON and
`plotting` draws `--plot`. The flags and the JSON are a fixed contract (docs/cli.md).
Exit codes: 0 = a plan (every point of a sweep is reported, feasible or not); 1 = a single plan that no
pool size makes meet its SLOs (the constraints and their gaps are printed); 2 = invalid input.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

from xpyd_controller.cli.plan.arguments import (
    PlanInputError,
    add_parser,
    build_inputs,
    parse_sweep,
    spec_error_words,
)
from xpyd_controller.cli.plan.plotting import plot
from xpyd_controller.cli.plan.render import render_sweep, render_table, scenario_json
from xpyd_controller.cli.plan.sizing import SweepResult, run_sweep, size
from xpyd_controller.model.specs import SpecError


def register(subparsers: Any, help_text: str) -> None:
    add_parser(subparsers, help_text).set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    sweep: SweepResult | None = None
    try:
        if args.sweep:
            sweep = run_sweep(args, *parse_sweep(args.sweep))
            inputs, plan = sweep.inputs, sweep.plan
        else:
            inputs = build_inputs(args)
            plan = size(inputs)
    except SpecError as err:
        print(f"xpyd plan: error: {spec_error_words(err)}", file=sys.stderr)
        return 2
    except PlanInputError as err:
        print(f"xpyd plan: error: {err}", file=sys.stderr)
        return 2
    emit: Callable[[str], None] = print
    if sweep is None:
        row = scenario_json(plan, (), inputs)
        emit(json.dumps(row, indent=2) if args.json else render_table(plan, inputs))
        status = 0 if row["slo_attainable"] else 1
    else:
        if args.json:
            points = [
                {"invalid_input": sweep.invalid[i], "feasible": False}
                if i in sweep.invalid
                else {**scenario_json(plan, sweep.plan_index[i], inputs), "invalid_input": None}
                for i in range(sweep.values.size)
            ]
            emit(
                json.dumps({"sweep": sweep.name, "values": sweep.values.tolist(), "plans": points}, indent=2)
            )
        else:
            emit(render_sweep(sweep, inputs))
        status = 0
    if args.plot:
        plot(args.plot, args, inputs, sweep)
    return status
