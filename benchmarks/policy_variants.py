"""xpyd's own knobs side by side: is each default the better setting on the days it is judged on?

Variants are knob maps passed the way a deployment passes them (`PolicyContext.knobs`, validated by
`configure`), so what is measured is what `xpyd simulate --knob` and the controller run. Each variant
moves one knob (docs/tuning.md, "Knobs") to the alternative a deployment would try: no tolerance band
(`tolerance=0`: shrink to exactly the need), a down window twice as long, a lead time of a slow cold
start, a backlog drained four times slower, a TTFT correction four times slower. Scenarios: the drift
day (compressed like `autoscaling.py --hours`), `mix-swing`, and `mix-swing-heavy-chat` (8 instead of
6 req/s: the chat phase fills the decode KV cache, so a TTFT miss there is decode's). Besides the
outcome it times every `decide` call (the policy's own cost per decision). Mean and 95 % confidence
interval (Student t) over seeds, the same seeds for every variant.

    .venv/bin/python benchmarks/policy_variants.py [--seeds 5] [--hours 6] [--jobs 1] [--write]

`--write` replaces the generated block of the "xpyd policy variants" subsection of docs/BENCHMARKS.md
(between its `<!-- begin/end generated: policy_variants.py -->` markers); the prose around it stays.
"""

from __future__ import annotations

import argparse
import dataclasses
import platform
import statistics
import sys
import time

from autoscaling import METRICS, Outcome, build_trace, results_table, run_all
from bench_docs import publish_blocks
from xpyd_controller.policy.registry import make_policy
from xpyd_controller.policy.types import Decision, Limits, Observation, Policy
from xpyd_controller.sim.policies import policy_context
from xpyd_controller.sim.runner import simulate
from xpyd_controller.sim.scenarios import Scenario, load_scenario

BLOCK = "policy_variants.py"
VARIANTS: dict[str, dict[str, float]] = {
    "defaults": {},
    "tolerance=0": {"tolerance": 0.0},
    "down_window_s=600": {"down_window_s": 600.0},
    "lead_time_s=300": {"lead_time_s": 300.0},
    "backlog_drain_s=120": {"backlog_drain_s": 120.0},
    "calibration_s=1200": {"calibration_s": 1200.0},
}
SHOWN = ("goodput", "gpu_hours", "good_requests_per_gpu_hour", "ttft_p99", "scale_ups", "conversions")
COLUMNS = [m for m in METRICS if m[0] in SHOWN] + [("decide_ms", "policy ms/decision (median)", "{:.2f}")]


def scenario(key: str) -> Scenario:
    return load_scenario("azure-drift-day" if key == "drift" else key)


SCENARIOS = ("drift", "mix-swing", "mix-swing-heavy-chat")


class RecordingPolicy:
    """Passes decisions through, keeping the time each `decide` call took."""

    def __init__(self, inner: Policy) -> None:
        self.inner = inner
        self.name = inner.name
        self.seconds: list[float] = []

    def decide(self, observation: Observation, limits: Limits) -> Decision:
        started = time.perf_counter()
        decision = self.inner.decide(observation, limits)
        self.seconds.append(time.perf_counter() - started)
        return decision


def run_variant(job: tuple[str, str, int, float]) -> Outcome:
    key, label, seed, hours = job
    chosen = scenario(key)
    trace = build_trace(chosen, seed, hours) if key == "drift" else chosen.traffic.build(seed)
    context = dataclasses.replace(policy_context(chosen.config), knobs=VARIANTS[label])
    policy = RecordingPolicy(make_policy("xpyd", context))
    started = time.perf_counter()
    result = simulate(chosen.config, trace, policy, limits=chosen.limits)
    metrics = {name: float(getattr(result, name)) for name, _, _ in COLUMNS[:-1]}
    metrics["decide_ms"] = statistics.median(policy.seconds) * 1e3
    return Outcome(key, label, seed, metrics, time.perf_counter() - started)


def markdown(outcomes: list[Outcome], args: argparse.Namespace, wall: float) -> str:
    lines = [
        f"Command: `.venv/bin/python benchmarks/policy_variants.py {' '.join(sys.argv[1:])}` on "
        f"{platform.machine()} / Python {platform.python_version()}, {args.seeds} seeds per row "
        f"(mean ± 95 % CI), {wall:.0f} s wall.",
        "",
    ]
    for key in SCENARIOS:
        chosen = scenario(key)
        squeezed = f" (compressed to {args.hours:g} h)" if key == "drift" and args.hours < 24 else ""
        lines += [
            f"**{chosen.name}**: {chosen.description}{squeezed}",
            "",
            *results_table(outcomes, key, "xpyd knobs", list(VARIANTS), COLUMNS),
            "",
        ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--hours", type=float, default=6.0, help="length of the drift day (compressed)")
    parser.add_argument("--jobs", type=int, default=1, help="worker processes")
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    jobs = [
        (key, label, seed, args.hours)
        for key in SCENARIOS
        for seed in range(1, args.seeds + 1)
        for label in VARIANTS
    ]
    started = time.perf_counter()
    outcomes = run_all(run_variant, jobs, args.jobs)
    text = markdown(outcomes, args, time.perf_counter() - started)
    return publish_blocks({BLOCK: text}, args.write)


if __name__ == "__main__":
    sys.exit(main())
