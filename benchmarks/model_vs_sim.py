"""Capacity model vs simulator: is the model's x:y as good as the best split found by brute force?

For each workload of a grid (rate × mean prompt × mean output, uniform lengths ±50 %, Poisson), the
capacity model (`size_pools`, TTFT sized at its 99th percentile with queueing, decode for the 99th
percentile of its sessions' KV, the simulator's KV memory fraction and its prefill-first request flow:
decode holds a request's KV from admission after prefill and transfer) picks x prefill and y
decode instances. The baseline is the same model with the seeds' decode-first session time
(TTFT + L_out·TPOT). The simulator then runs every split with x' + y' ≤ x + y + 2 and finds the best goodput
(TTFT and TPOT SLOs). The model "agrees" when its pick is within 2 points of that best goodput, at
no more GPUs. Also reported: the cheapest split reaching 99 % goodput, to show over-provisioning.

    .venv/bin/python benchmarks/model_vs_sim.py [--requests 3000] [--runs 3] [--write]

`--write` replaces this benchmark's subsection of the "Autoscaling policies" section of docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import itertools
import platform
import sys
import time
from dataclasses import dataclass
from statistics import median

from bench_docs import publish
from xpyd_controller.model.presets import GPU_PRESETS, LINK_PRESETS, MODEL_PRESETS
from xpyd_controller.model.sizing import PoolConfig, RequestFlow, Slo, Workload, size_pools
from xpyd_controller.sim.config import Fleet, GoodputSlo, Hardware, Realism, SimConfig
from xpyd_controller.sim.runner import simulate
from xpyd_controller.sim.traces import Trace, UniformLengths, poisson

HARDWARE = Hardware(
    MODEL_PRESETS["llama-3.1-8b"], GPU_PRESETS["h100-sxm"], LINK_PRESETS["ib-400g"], step_overhead_s=5e-3
)
REALISM = Realism(kv_capacity=True, layerwise_transfer=True, decode_kv_reads=True)
SLO = GoodputSlo(ttft_s=0.6, tpot_s=0.03, max_token_gap_s=None)
RATES = (4.0, 12.0, 24.0)
PROMPTS = (1000, 6000)
OUTPUTS = (150, 600)
BEYOND = 2  # GPUs searched past the model's pick, to find the cheapest split when it under-provisions
TOLERANCE = 0.02
TARGET = 0.99
SECTION = "## Autoscaling policies (`benchmarks/autoscaling.py`)"
SUBSECTION = "### Capacity model vs simulator (`benchmarks/model_vs_sim.py`)"


@dataclass(frozen=True)
class Row:
    rate: float
    prompt: int
    output: int
    model_split: tuple[int, int]
    model_goodput: float
    baseline_split: tuple[int, int]  # baseline: decode-first session time (the seeds), otherwise as above
    baseline_goodput: float
    sessions: tuple[float, float]  # decode concurrency the model sizes for: prefill-first, decode-first
    best_split: tuple[int, int]
    best_goodput: float
    cheapest_at_target: tuple[int, int] | None

    @property
    def surplus(self) -> str:
        if self.cheapest_at_target is None:
            return f"< -{BEYOND}"
        return f"{sum(self.model_split) - sum(self.cheapest_at_target):+d}"

    @property
    def agrees(self) -> bool:
        return self.model_goodput >= self.best_goodput - TOLERANCE


def model_split(rate: float, prompt: int, output: int, flow: RequestFlow) -> tuple[int, int, float]:
    """x, y and the decode concurrency the model sizes for."""
    spread = 1 / 12**0.5  # uniform on [m/2, 3m/2]: std = m/√12
    plan = size_pools(
        HARDWARE.model,
        HARDWARE.gpu,
        HARDWARE.link,
        Workload(rate=rate, isl=prompt, osl=output, isl_std=prompt * spread, osl_std=output * spread),
        # Goodput counts every request against both SLOs, so both sides are sized for the same
        # quantile: TTFT with queueing, and decode for the swings of its sessions and their KV.
        Slo(
            ttft=SLO.ttft_s,
            tpot=SLO.tpot_s or 0.05,
            ttft_quantile=TARGET,
            context_quantile=TARGET,
        ),
        pools=PoolConfig(
            step_overhead=HARDWARE.step_overhead_s,
            kv_memory_fraction=REALISM.kv_memory_fraction,
            request_flow=flow,
        ),
    )
    return int(plan.prefill_instances), int(plan.decode_instances), float(plan.concurrency)


def goodput(split: tuple[int, int], trace: Trace) -> float:
    config = SimConfig(HARDWARE, Fleet("disagg", *split), REALISM, SLO)
    return simulate(config, trace).goodput


def evaluate(rate: float, prompt: int, output: int, requests: int, seeds: range) -> Row:
    """Every split's median goodput over one Poisson trace per seed."""
    *picked_xy, sessions = model_split(rate, prompt, output, "prefill_first")
    *baseline_xy, baseline_sessions = model_split(rate, prompt, output, "decode_first")
    picked, baseline = (picked_xy[0], picked_xy[1]), (baseline_xy[0], baseline_xy[1])
    budget = max(2, sum(picked), sum(baseline))
    lengths = UniformLengths(prompt // 2, prompt * 3 // 2, max(1, output // 2), output * 3 // 2)
    traces = [poisson(seed, rate, lengths, count=requests) for seed in seeds]
    results = {}
    for total in range(2, budget + BEYOND + 1):
        for x in range(1, total):
            results[(x, total - x)] = median(goodput((x, total - x), trace) for trace in traces)
    model_good = results.get(picked) if min(picked) >= 1 else 0.0
    baseline_good = results.get(baseline) if min(baseline) >= 1 else 0.0
    affordable = [s for s in results if sum(s) <= max(2, sum(picked))]
    best = max(affordable, key=lambda s: (results[s], -sum(s)))
    meeting = [s for s in results if results[s] >= TARGET]
    cheapest = min(meeting, key=lambda s: (sum(s), -results[s])) if meeting else None
    return Row(
        rate,
        prompt,
        output,
        picked,
        model_good or 0.0,
        baseline,
        baseline_good or 0.0,
        (sessions, baseline_sessions),
        best,
        results[best],
        cheapest,
    )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--runs", type=int, default=3, help="seeds per workload; goodputs are medians")
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    started = time.perf_counter()
    rows = []
    for rate, prompt, output in itertools.product(RATES, PROMPTS, OUTPUTS):
        row = evaluate(rate, prompt, output, args.requests, range(args.seed, args.seed + args.runs))
        rows.append(row)
        print(row, flush=True)
    agree = sum(r.agrees for r in rows)
    baseline_agree = sum(r.baseline_goodput >= r.best_goodput - TOLERANCE for r in rows)
    lines = [
        SUBSECTION,
        "",
        f"Command: `.venv/bin/python benchmarks/model_vs_sim.py {' '.join(sys.argv[1:])}` on {platform.machine()} / "
        f"Python {platform.python_version()}; {args.requests} Poisson requests per run, "
        f"median goodput of {args.runs} runs (seeds {args.seed}–{args.seed + args.runs - 1}); "
        f"8B on H100, 400G link, KV capacity ({REALISM.kv_memory_fraction:.0%} of HBM), layer-wise "
        f"transfer and per-step KV reads on; SLO TTFT ≤ {SLO.ttft_s} s, "
        f"TPOT ≤ {SLO.tpot_s} s; {time.perf_counter() - started:.0f} s wall.",
        "",
        f"**The model's x:y is within {TOLERANCE:.0%} of the best goodput at no more GPUs in "
        f"{agree} of {len(rows)} workloads** (baseline, the seeds' decode-first session time TTFT + L_out·TPOT: "
        f"{baseline_agree} of {len(rows)}; GPUs {sum(sum(r.model_split) for r in rows)} vs "
        f"{sum(sum(r.baseline_split) for r in rows)} over all workloads).",
        "",
        f"Over-provisioned (model's GPUs minus the cheapest split reaching {TARGET:.0%}): "
        f"{', '.join(str(r.surplus) for r in rows)} GPUs per workload (negative: the model under-provisions).",
        "",
        "| rate | mean prompt | mean output | sessions (model / baseline) | model x:y | its goodput "
        "| baseline x:y | its goodput "
        f"| best x:y (≤ model's GPUs) | best goodput | cheapest x:y at {TARGET:.0%} | agrees |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        cheapest = (
            f"{r.cheapest_at_target[0]}:{r.cheapest_at_target[1]}"
            if r.cheapest_at_target
            else "none ≤ budget"
        )
        lines.append(
            f"| {r.rate:g} | {r.prompt} | {r.output} | {r.sessions[0]:.1f} / {r.sessions[1]:.1f} "
            f"| {r.model_split[0]}:{r.model_split[1]} | {r.model_goodput:.2%} "
            f"| {r.baseline_split[0]}:{r.baseline_split[1]} | {r.baseline_goodput:.2%} "
            f"| {r.best_split[0]}:{r.best_split[1]} | {r.best_goodput:.2%} | {cheapest} | {'yes' if r.agrees else 'no'} |"
        )
    text = "\n".join(lines) + "\n"
    return publish(SECTION, text, args.write, append=True)


if __name__ == "__main__":
    sys.exit(main())
