"""Role conversion on the `mix-swing` scenario: xpyd with and without it, beside the baselines.

The mix swings every 2 h between long-output chat and long-prompt RAG at a flat rate (70B on 4-GPU
H100 instances, cold start 5 min, conversion 30 s), so one pool's need falls while the other's rises.
Variants: xpyd with conversion, the same xpyd with the deployment's role conversion off (every move is
a drain plus a cold start), the Dynamo-style planner, the threshold scaler and the hindsight
oracle-window. Mean and 95 % confidence interval (Student t) over seeds, the same seeds for all.

    .venv/bin/python benchmarks/conversion.py [--seeds 5] [--hours 4] [--jobs 1] [--write]

`--write` replaces the generated block of the "Role conversion" subsection of docs/BENCHMARKS.md
(between its `<!-- begin/end generated: conversion.py -->` markers); the prose around it stays.
"""

from __future__ import annotations

import argparse
import dataclasses
import platform
import sys
import time

import bench_cache
import real_dynamo
from autoscaling import (
    METRICS,
    Outcome,
    add_seed_arguments,
    benchmark_policy,
    results_table,
    run_all,
    seeds_per_policy,
)
from bench_docs import publish_blocks
from xpyd_controller.sim.native import run_events
from xpyd_controller.sim.results import summarise as summarise_run
from xpyd_controller.sim.scenarios import mix_swing

BLOCK = "conversion.py"
SCENARIO = "mix-swing"
# label → (policy, the deployment may convert roles)
VARIANTS = {
    "xpyd": ("xpyd", True),
    "xpyd, no conversion": ("xpyd", False),
    "throughput-planner": ("throughput-planner", True),
    **{name: (name, True) for name in real_dynamo.NAMES},
    "threshold": ("threshold", True),
    "oracle-window": ("oracle-window", True),
}
SHOWN = ("goodput", "gpu_hours", "good_requests_per_gpu_hour", "conversions", "scale_ups", "ttft_p99")
COLUMNS = [m for m in METRICS if m[0] in SHOWN] + [("warming_hours", "warming instance-h", "{:.1f}")]


def runnable_variants() -> list[str]:
    """The variants this machine can run (Dynamo's own planner only under `hack/dynamo-bench`)."""
    have_dynamo = real_dynamo.available()
    return [
        label for label, (policy, _) in VARIANTS.items() if have_dynamo or policy not in real_dynamo.NAMES
    ]


def run_variant(job: tuple[str, int, float]) -> Outcome:
    """One variant on one seed; `warming_hours` sums instance-time waiting to serve a role it was given."""
    label, seed, hours = job
    policy_name, may_convert = VARIANTS[label]
    scenario = mix_swing(hours)
    control = dataclasses.replace(scenario.config.control, role_conversion=may_convert)
    config = dataclasses.replace(scenario.config, control=control)

    def run() -> dict[str, float]:
        trace = scenario.traffic.build(seed)
        policy = benchmark_policy(policy_name, config, trace, scenario.limits)
        raw = run_events(config, trace, policy, scenario.limits)
        result = summarise_run(trace, raw, config.slo)
        metrics = {name: float(getattr(result, name)) for name, _, _ in COLUMNS[:-1]}
        starting = sum(s.prefill_starting + s.decode_starting for s in raw.samples)
        metrics["warming_hours"] = starting * control.scrape_interval_s / 3600
        return metrics

    started = time.perf_counter()
    metrics = bench_cache.cached_metrics(
        f"conversion {scenario!r} {config!r} {label} {seed}", run, policy_name
    )
    return Outcome(SCENARIO, label, seed, metrics, time.perf_counter() - started)


def markdown(outcomes: list[Outcome], args: argparse.Namespace, wall: float) -> str:
    scenario = mix_swing(args.hours)
    lines = [
        f"Command: `{bench_cache.interpreter()} benchmarks/conversion.py {' '.join(sys.argv[1:])}` on "
        f"{platform.machine()} / Python {platform.python_version()}, {args.seeds} seeds per row "
        f"(mean ± 95 % CI), {wall:.0f} s wall"
        + "".join(f"; {label}: {n} seeds" for label, n in seeds_per_policy(args).items())
        + ".",
        "",
        f"**{scenario.name}**: {scenario.description}; start 2P:3D, limits 1–16 per pool.",
        "",
        *results_table(outcomes, SCENARIO, "variant", runnable_variants(), COLUMNS),
    ]
    missing = [label for label in VARIANTS if label not in runnable_variants()]
    if missing:
        lines += ["", f"Not run (Dynamo's wheels not installed: `hack/dynamo-bench`): {', '.join(missing)}."]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_seed_arguments(parser)
    parser.add_argument("--hours", type=float, default=4.0)
    parser.add_argument("--jobs", type=int, default=1, help="worker processes")
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    seeds = seeds_per_policy(args, parser)
    jobs = [
        (label, seed, args.hours)
        for seed in range(1, args.seeds + 1)
        for label in runnable_variants()
        if seed <= seeds.get(label, args.seeds)
    ]
    started = time.perf_counter()
    outcomes = run_all(run_variant, jobs, args.jobs)
    text = markdown(outcomes, args, time.perf_counter() - started)
    return publish_blocks({BLOCK: text}, args.write)


if __name__ == "__main__":
    sys.exit(main())
