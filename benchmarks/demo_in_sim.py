"""`make demo` in the fleet simulator: its PDDeployment, traffic and control settings, seconds per run.

The demo takes 6-7 minutes of a shared machine per run and its numbers move with the machine's load;
this replays the same setup (e2e/stack.py: the spec's model and hardware, 2+2 instances, 1-5 per pool,
the 8-GPU budget, 4 req/s swinging every 90 s between long outputs and long prompts, decisions every
5 s on a 20 s window) through `xpyd_controller.sim`, for the xpyd policy and for fixed splits, and
scores it as the demo does: requests within the SLO (TTFT and mean time per output token), 5 s
intervals whose completions met it at 90 %, direction reversals per pool per mix phase (e2e.stack's
`Reversals`, on the desired counts every 5 s), conversions.

Where the simulator differs from the demo's engine stand-ins, the settings say so: a cold start of
`--cold-start` s (a stand-in pod on the local cluster serves within seconds), a conversion of the
KV lease (10 s) after its drain, 5 s of router follow-up per drain, 2 s of metrics lag. The fleet
simulator reserves each request's whole prompt + answer KV at admission, while the stand-ins (like
vLLM) page it in as tokens are generated (on average about the prompt and half the answer): the
simulated instances get `--kv-room` times the KV room after the weights so that both hold about as
many sessions (the policy still sizes for the spec's 20 GB). Not a measurement of the demo: a fast
way to compare policies on its setup, with the demo runs (docs/BENCHMARKS.md) as the judge.

    .venv/bin/python benchmarks/demo_in_sim.py [--seeds 0 1 2] [--knob NAME=VALUE ...]

`--knob` sets one of the xpyd policy's knobs (docs/tuning.md, "Knobs"; the spec's windows and
tolerance too), as `xpyd simulate --knob` does; a name or value the policy refuses stops the script
before any run.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from e2e.stack import DemoSettings, Reversals, demo_manifest, demo_traffic  # noqa: E402

from xpyd_api.errors import InputError  # noqa: E402
from xpyd_api.models import PDDeploymentSpec  # noqa: E402
from xpyd_controller.cli.simulate import parse_knobs  # noqa: E402
from xpyd_controller.control.setup import gpu_spec, limits, link_spec, model_spec, policy_context  # noqa: E402
from xpyd_controller.policy.context import configure  # noqa: E402
from xpyd_controller.policy.registry import make_policy  # noqa: E402
from xpyd_controller.policy.static import StaticPolicy  # noqa: E402
from xpyd_controller.policy.xpyd import XpydConfig  # noqa: E402
from xpyd_controller.sim.config import Control, Fleet, Hardware, Realism, SimConfig  # noqa: E402
from xpyd_controller.sim.native import run_events  # noqa: E402
from xpyd_controller.sim.traces.synthetic import Constant, synthesize  # noqa: E402

INTERVAL_ATTAINMENT = 0.9  # the demo's progress intervals count as within the SLO at this share
METRICS_LAG_S = 2.0
ROUTER_FOLLOW_S = 5.0


@dataclasses.dataclass(frozen=True)
class Row:
    requests: float
    intervals: float
    reversals: int
    conversions: int
    gpu_seconds: float


def run(seed: int, split: tuple[int, int] | None, knobs: dict[str, float], args: argparse.Namespace) -> Row:
    """One demo-shaped run: the xpyd policy (`split` None) or a fixed split."""
    settings = DemoSettings(seed=seed)
    manifest = demo_manifest("http://unused", settings)
    spec = PDDeploymentSpec.model_validate(manifest["spec"])
    lengths, slo = demo_traffic(manifest, settings)
    model, gpu = model_spec(spec.model), gpu_spec(spec.hardware)
    room = gpu.hbm_bytes - model.weight_footprint_bytes
    paged = dataclasses.replace(gpu, hbm_bytes=model.weight_footprint_bytes + args.kv_room * room)
    start = split or (spec.prefill.replicas, spec.decode.replicas)
    config = SimConfig(
        Hardware(model, paged, link_spec(spec.hardware)),
        Fleet("disagg", *start),
        Realism(
            kv_capacity=True,
            kv_memory_fraction=1.0,
            layerwise_transfer=True,
            decode_kv_reads=True,
            cold_start_s=args.cold_start,
            conversion_s=spec.conversion.kv_lease_seconds,
            drain_s=ROUTER_FOLLOW_S,
        ),
        slo,
        Control(settings.interval_s, settings.rate_window_s, METRICS_LAG_S, role_conversion=True),
    )
    duration = settings.minutes * 60.0
    trace = synthesize(seed, Constant(settings.rate), lengths, duration_s=duration)
    context = policy_context(spec)
    context = dataclasses.replace(
        context, initial_prefill=start[0], initial_decode=start[1], knobs={**context.knobs, **knobs}
    )
    policy = StaticPolicy(*start) if split else make_policy("xpyd", context)
    raw = run_events(config, trace, policy, limits(spec), None)
    arrival = np.asarray(trace.columns.arrival_s)
    first, finish = np.asarray(raw.first_token_s), np.asarray(raw.finish_s)
    outputs = np.asarray(trace.columns.output_tokens)
    tpot = np.where(outputs > 1, (finish - first) / np.maximum(outputs - 1, 1), 0.0)
    good = ((first - arrival) <= slo.ttft_s) & (tpot <= (slo.tpot_s or np.inf))
    done = finish <= duration
    bins = np.floor(finish[done] / 5.0).astype(int)
    shares = [good[done][bins == b].mean() for b in np.unique(bins)]
    reversals = Reversals(settings.swing_s)
    prefill, decode, decisions = start[0], start[1], list(raw.decisions)
    for tick in range(1, int(duration // 5.0) + 1):
        while decisions and decisions[0][0] <= 5.0 * tick:
            decision = decisions.pop(0)[1]
            prefill = decision.prefill if decision.prefill is not None else prefill
            decode = decision.decode if decision.decode is not None else decode
        reversals.add(5.0 * tick, prefill, decode)
    return Row(
        float(good[done].mean()),
        float(np.mean([share >= INTERVAL_ATTAINMENT for share in shares])),
        reversals.worst,
        raw.conversions,
        raw.gpu_seconds,
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    names = ", ".join(field.name for field in dataclasses.fields(XpydConfig))
    parser.add_argument(
        "--knob", action="append", default=[], metavar="NAME=VALUE", help=f"an xpyd knob: {names}"
    )
    parser.add_argument("--splits", nargs="*", default=["4:4", "5:3", "3:5"], help="fixed splits P:D to run")
    parser.add_argument("--cold-start", type=float, default=8.0, help="seconds until a new instance serves")
    parser.add_argument("--kv-room", type=float, default=1.5, help="KV room factor for paging (see above)")
    args = parser.parse_args(argv)
    try:
        knobs = parse_knobs(args.knob)
        configure("xpyd", XpydConfig(), knobs)
    except InputError as error:
        parser.error(str(error))
    label = " ".join(args.knob) or "defaults"
    rows: list[tuple[str, list[Row]]] = [(f"xpyd ({label})", [run(s, None, knobs, args) for s in args.seeds])]
    for split in args.splits:
        prefill, decode = (int(part) for part in split.split(":"))
        rows.append(
            (f"fixed {prefill}P + {decode}D", [run(s, (prefill, decode), {}, args) for s in args.seeds])
        )
    print(f"seeds {args.seeds}; medians (per seed in brackets)\n")
    print("| policy | requests within SLO | intervals within SLO | reversals (max) | conversions | GPU-s |")
    print("|---|---|---|---|---|---|")
    for name, runs in rows:

        def cell(values: list[float], fmt: str) -> str:
            each = " ".join(format(v, fmt) for v in values)
            return f"{format(statistics.median(values), fmt)} [{each}]"

        print(
            f"| {name} | {cell([r.requests for r in runs], '.1%')} | {cell([r.intervals for r in runs], '.0%')} "
            f"| {cell([float(r.reversals) for r in runs], '.0f')} | {cell([float(r.conversions) for r in runs], '.0f')} "
            f"| {cell([r.gpu_seconds for r in runs], '.0f')} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
