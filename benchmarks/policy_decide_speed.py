"""What one xpyd decision costs, against the policy at a git revision, on the same observations.

The observations are recorded once from a simulated run of this tree (the compressed drift day and
`mix-swing`), then replayed into fresh policies: this tree's and the one at `--against REV`. The
policy is a package of modules that import the rest of the controller, so the baseline is the whole
`controller/src` and `operator/src` of that revision (`git archive`), and each replay runs in its own
process whose PYTHONPATH puts one tree or the other first; it builds the policy by name
(`policy.registry.make_policy`, there in both, whatever xpyd's layout at the revision), is fed the
recorded context and (Observation, Limits) calls, pickled (the dataclasses of `policy/types.py` and
`policy/context.py` are what both sides share), and times its `decide` calls after a few untimed
ones (first-call costs). The two sides alternate run by run so both see the same machine load. Reports the median over runs of the
mean time per `decide` call, and how many decisions differ.

    .venv/bin/python benchmarks/policy_decide_speed.py --against REV [--runs 7] [--write]

`--write` replaces the "xpyd decision cost" subsection at the end of the "Autoscaling policies"
section of docs/BENCHMARKS.md.
"""

# Only the standard library at module level: the replay worker (`--replay`) is this file run under
# another tree's PYTHONPATH, and must import nothing of this tree but what it times.
from __future__ import annotations

import argparse
import json
import os
import pickle
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from xpyd_controller.policy.types import Decision, Limits, Observation, Policy
    from xpyd_controller.sim.scenarios import Scenario
    from xpyd_controller.sim.traces import Trace

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ("controller/src", "operator/src")
SUBSECTION = "### xpyd decision cost (`benchmarks/policy_decide_speed.py`)"
DRIFT_HOURS = 6.0
WARM_UP = 20  # untimed calls into a throwaway policy before the timed replay


def replay(calls_path: Path) -> dict[str, Any]:
    """The worker: seconds per decision over the whole replay and the decisions' counts, from the
    `xpyd_controller` first on the path (named in the answer, so the caller can check which)."""
    import xpyd_controller
    from xpyd_controller.policy.registry import make_policy

    with calls_path.open("rb") as file:
        context, calls = pickle.load(file)
    warm = make_policy("xpyd", context)
    for observation, limits in calls[:WARM_UP]:
        warm.decide(observation, limits)
    policy = make_policy("xpyd", context)
    counts = []
    started = time.perf_counter()
    for observation, limits in calls:
        decision = policy.decide(observation, limits)
        counts.append((decision.prefill, decision.decode))
    seconds = (time.perf_counter() - started) / len(calls)
    return {"module": xpyd_controller.__file__, "seconds": seconds, "counts": counts}


def run_replay(tree: Path, calls_path: Path) -> tuple[float, list[tuple[int | None, int | None]]]:
    """One replay in a fresh process with `tree`'s sources first on its path."""
    sources = [str(tree / source) for source in SOURCES]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sources)}
    command = [sys.executable, __file__, "--replay", str(calls_path)]
    done = subprocess.run(command, check=False, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"the replay for {tree} failed:\n{done.stderr}")
    answer = json.loads(done.stdout)
    if not Path(answer["module"]).is_relative_to(sources[0]):
        raise RuntimeError(f"the replay for {tree} imported xpyd_controller from {answer['module']}")
    return answer["seconds"], [tuple(pair) for pair in answer["counts"]]


def extract(revision: str, into: Path) -> Path:
    """The sources at `revision` under `into` (`controller/src`, `operator/src`)."""
    archive = subprocess.run(
        ["git", "archive", revision, *SOURCES], cwd=ROOT, check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


class Recorder:
    """Passes decisions through, keeping every observation and limits the policy was given."""

    def __init__(self, inner: Policy) -> None:
        self.inner = inner
        self.name = inner.name
        self.calls: list[tuple[Observation, Limits]] = []

    def decide(self, observation: Observation, limits: Limits) -> Decision:
        self.calls.append((observation, limits))
        return self.inner.decide(observation, limits)


def record(scenario: Scenario, trace: Trace, into: Path) -> int:
    """Runs this tree's policy in the simulator and pickles its context and every call it was given to
    `into`; the number of calls."""
    from xpyd_controller.policy.registry import make_policy
    from xpyd_controller.sim.policies import policy_context
    from xpyd_controller.sim.runner import simulate

    context = policy_context(scenario.config)
    recorder = Recorder(make_policy("xpyd", context))
    simulate(scenario.config, trace, recorder, limits=scenario.limits)
    with into.open("wb") as file:
        pickle.dump((context, recorder.calls), file)
    return len(recorder.calls)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--against", help="git revision of the baseline policy")
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--write", action="store_true")
    parser.add_argument("--replay", type=Path, help=argparse.SUPPRESS)  # the worker's mode
    args = parser.parse_args()
    if args.replay:
        json.dump(replay(args.replay), sys.stdout)
        return 0
    if not args.against:
        parser.error("--against REV is required")

    from autoscaling import SECTION, build_trace
    from bench_docs import publish
    from xpyd_controller.sim.scenarios import load_scenario, mix_swing

    rows = []
    drift, swing = load_scenario("azure-drift-day"), mix_swing()
    runs = ((drift, build_trace(drift, 1, DRIFT_HOURS)), (swing, swing.traffic.build(1)))
    with tempfile.TemporaryDirectory(prefix="policy_decide_speed-") as scratch:
        baseline = extract(args.against, Path(scratch))
        for scenario, trace in runs:
            calls_path = Path(scratch) / f"{scenario.name}.pickle"
            decisions = record(scenario, trace, calls_path)
            ours, theirs = [], []
            for _ in range(args.runs):
                seconds, our_counts = run_replay(ROOT, calls_path)
                ours.append(seconds)
                seconds, their_counts = run_replay(baseline, calls_path)
                theirs.append(seconds)
            differ = sum(a != b for a, b in zip(our_counts, their_counts, strict=True))
            ours_ms, theirs_ms = statistics.median(ours) * 1e3, statistics.median(theirs) * 1e3
            rows.append(
                f"| {scenario.name} | {decisions:,} | {ours_ms:.3f} | {theirs_ms:.3f} | "
                f"{ours_ms / theirs_ms:.2f} | {differ} |"
            )
    text = "\n".join(
        [
            SUBSECTION,
            "",
            f"Command: `.venv/bin/python benchmarks/policy_decide_speed.py {' '.join(sys.argv[1:])}` on "
            f"{platform.machine()} / Python {platform.python_version()}; observations recorded from one run "
            f"(seed 1; the drift day compressed to {DRIFT_HOURS:g} h), replayed {args.runs} times into each "
            "policy (one process per replay, the two trees alternating); median over runs of the mean time "
            "per decision.",
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
