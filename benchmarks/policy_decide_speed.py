"""What one xpyd decision costs, against the policy at a git revision, on the same observations.

The observations are recorded once from a simulated run (the compressed drift day and `mix-swing`),
then replayed into fresh policies: this tree's `policy/xpyd.py` and the same file at `--against REV`
(loaded from git beside it), interleaved run by run so both see the same machine load. Reports the
median over runs of the mean time per `decide` call, and how many decisions differ.

    .venv/bin/python benchmarks/policy_decide_speed.py --against REV [--runs 7] [--write]

`--write` replaces the "xpyd decision cost" subsection at the end of the "Autoscaling policies"
section of docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import importlib.util
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

from autoscaling import SECTION, build_trace
from bench_docs import publish
from xpyd_controller.policy import xpyd
from xpyd_controller.policy.context import PolicyContext, configure
from xpyd_controller.policy.types import Decision, Limits, Observation
from xpyd_controller.sim.policies import policy_context
from xpyd_controller.sim.runner import simulate
from xpyd_controller.sim.scenarios import Scenario, load_scenario, mix_swing
from xpyd_controller.sim.traces import Trace

SUBSECTION = "### xpyd decision cost (`benchmarks/policy_decide_speed.py`)"
SOURCE = "controller/src/xpyd_controller/policy/xpyd.py"
DRIFT_HOURS = 6.0


def module_at(revision: str) -> ModuleType:
    """`policy/xpyd.py` as it was at `revision`, imported under its own name beside this tree's."""
    root = Path(__file__).resolve().parent.parent
    text = subprocess.run(
        ["git", "show", f"{revision}:{SOURCE}"], cwd=root, check=True, capture_output=True, text=True
    ).stdout
    spec = importlib.util.spec_from_loader(f"xpyd_at_{revision}", loader=None)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    exec(compile(text, f"{revision}:{SOURCE}", "exec"), module.__dict__)
    return module


class Recorder:
    """Runs this tree's policy in the simulator, keeping every observation and limits it was given."""

    def __init__(self, context: PolicyContext) -> None:
        self.inner = xpyd.make_xpyd(context)
        self.name = self.inner.name
        self.calls: list[tuple[Observation, Limits]] = []

    def decide(self, observation: Observation, limits: Limits) -> Decision:
        self.calls.append((observation, limits))
        return self.inner.decide(observation, limits)


def recorded(scenario: Scenario, trace: Trace) -> tuple[PolicyContext, list[tuple[Observation, Limits]]]:
    context = policy_context(scenario.config)
    recorder = Recorder(context)
    simulate(scenario.config, trace, recorder, limits=scenario.limits)
    return context, recorder.calls


def replay(
    module: ModuleType, context: PolicyContext, calls: list[tuple[Observation, Limits]]
) -> tuple[float, list[tuple[int | None, int | None]]]:
    """Seconds per decision over the whole replay, and the decisions' counts."""
    policy = module.XpydPolicy(context, configure("xpyd", module.XpydConfig(), context.knobs))
    counts = []
    started = time.perf_counter()
    for observation, limits in calls:
        decision = policy.decide(observation, limits)
        counts.append((decision.prefill, decision.decode))
    return (time.perf_counter() - started) / len(calls), counts


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--against", required=True, help="git revision of the baseline policy")
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    baseline = module_at(args.against)
    rows = []
    drift, swing = load_scenario("azure-drift-day"), mix_swing()
    runs = ((drift, build_trace(drift, 1, DRIFT_HOURS)), (swing, swing.traffic.build(1)))
    for scenario, trace in runs:
        context, calls = recorded(scenario, trace)
        ours, theirs = [], []
        for _ in range(args.runs):
            seconds, our_counts = replay(xpyd, context, calls)
            ours.append(seconds)
            seconds, their_counts = replay(baseline, context, calls)
            theirs.append(seconds)
        differ = sum(a != b for a, b in zip(our_counts, their_counts, strict=True))
        ours_ms, theirs_ms = statistics.median(ours) * 1e3, statistics.median(theirs) * 1e3
        rows.append(
            f"| {scenario.name} | {len(calls):,} | {ours_ms:.3f} | {theirs_ms:.3f} | "
            f"{ours_ms / theirs_ms:.2f} | {differ} |"
        )
    text = "\n".join(
        [
            SUBSECTION,
            "",
            f"Command: `.venv/bin/python benchmarks/policy_decide_speed.py {' '.join(sys.argv[1:])}` on "
            f"{platform.machine()} / Python {platform.python_version()}; observations recorded from one run "
            f"(seed 1; the drift day compressed to {DRIFT_HOURS:g} h), replayed {args.runs} times into each "
            "policy, interleaved; median over runs of the mean time per decision.",
            "",
            f"| scenario | decisions | this tree ms/decision | {args.against} ms/decision | ratio | "
            "decisions that differ |",
            "|---|---|---|---|---|---|",
            *rows,
            "",
        ]
    )
    return publish(SECTION, text, args.write, append=True)


if __name__ == "__main__":
    sys.exit(main())
