"""Fleet simulator speed: the seed table's 8 runs and a 24 h day with the policy in the loop.

Baseline, in the same run: a straightforward simulator with one heap event per decode step and per
prefill chunk (the seed article's algorithm, re-expressed here and kept only here). It must produce
the same table, so the comparison is like for like.

    .venv/bin/python benchmarks/simulator_speed.py [--repeats 5] [--day-rate 30] [--against REV] [--write]

`--against REV` also times the seed table with sim/engine.py as committed at git revision REV,
interleaved with this tree's runs (a before/after under the same machine load).

`--write` replaces the "Fleet simulator speed" section of docs/BENCHMARKS.md with the results.
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import math
import platform
import statistics
import subprocess
import sys
import time
import types
from collections import deque
from collections.abc import Callable
from pathlib import Path

import numpy as np

from bench_docs import replace_section
from xpyd_controller.model.roofline import decode_step_seconds, kv_transfer_seconds, prefill_seconds
from xpyd_controller.sim.config import Fleet, SimConfig
from xpyd_controller.sim.engine import RawRun, run_events
from xpyd_controller.sim.policies import build_policy
from xpyd_controller.sim.results import summarise
from xpyd_controller.sim.runner import simulate
from xpyd_controller.sim.scenarios import load_scenario
from xpyd_controller.sim.seed import SEED_GPUS, SEED_HARDWARE, SEED_SLO, seed_requests
from xpyd_controller.sim.stats import seed_percentile
from xpyd_controller.sim.traces import Trace

ROWS = [("colocated", 0), ("disagg", 1), ("disagg", 4), ("disagg", 6)]
RATES = (8.0, 28.0)
SECTION = "## Fleet simulator speed (`benchmarks/simulator_speed.py`)"


def baseline_run(mode: str, prefill_gpus: int, trace: Trace) -> tuple[float, float, float]:
    """One event per step and per chunk; returns (TTFT p50, TTFT p99, goodput) for cross-checking."""
    hw = SEED_HARDWARE
    outputs = trace.output_tokens.tolist()
    arrivals = trace.arrival_s.tolist()
    chunk_time = (prefill_seconds(hw.model, hw.gpu, trace.prompt_tokens) / hw.prefill_chunks).tolist()
    full_time = prefill_seconds(hw.model, hw.gpu, trace.prompt_tokens).tolist()
    handoff = kv_transfer_seconds(hw.model, hw.link, trace.prompt_tokens).tolist()
    step_of = decode_step_seconds(
        hw.model, hw.gpu, np.arange(4096.0), 0, step_overhead=hw.step_overhead_s
    ).tolist()
    n = len(arrivals)
    order = itertools.count()
    events: list[tuple[float, int, str, int, int]] = [
        (a, next(order), "arrive", i, 0) for i, a in enumerate(arrivals)
    ]
    heapq.heapify(events)
    decode_gpus = SEED_GPUS - prefill_gpus
    queues: list[deque[int]] = [deque() for _ in range(max(prefill_gpus, decode_gpus))]
    prefill_busy = [False] * prefill_gpus
    batches: list[dict[int, int]] = [{} for _ in range(decode_gpus)]
    decode_busy = [False] * decode_gpus
    step_next = [True] * decode_gpus  # co-located: whose turn, a step (True) or a chunk
    chunks = [0] * n
    first = [math.nan] * n
    last = [0.0] * n
    worst_gap = [0.0] * n
    finished = 0

    def schedule(t: float, kind: str, who: int, what: int = 0) -> None:
        heapq.heappush(events, (t, next(order), kind, who, what))

    def kick_decode(t: float, g: int) -> None:
        if decode_busy[g]:
            return
        batch, queue = batches[g], queues[g] if mode == "colocated" else ()
        if batch and (not queue or step_next[g]):
            decode_busy[g] = True
            step_next[g] = False
            schedule(t + step_of[len(batch)], "step", g)
        elif queue:
            decode_busy[g] = True
            step_next[g] = True
            schedule(t + chunk_time[queue[0]], "chunk", g, queue[0])

    def kick_prefill(t: float, g: int) -> None:
        if queues[g] and not prefill_busy[g]:
            prefill_busy[g] = True
            schedule(t + full_time[queues[g][0]], "prefilled", g)

    t = 0.0
    while finished < n:
        t, _, kind, who, what = heapq.heappop(events)
        if kind == "arrive":
            if mode == "colocated":
                g = min(range(decode_gpus), key=lambda k: len(queues[k]) + len(batches[k]))
                queues[g].append(who)
                kick_decode(t, g)
            else:
                g = min(range(prefill_gpus), key=lambda k: len(queues[k]) + prefill_busy[k])
                queues[g].append(who)
                kick_prefill(t, g)
        elif kind == "prefilled":
            prefill_busy[who] = False
            request = queues[who].popleft()
            schedule(t + handoff[request], "landed", request)
            kick_prefill(t, who)
        elif kind == "landed":
            g = min(range(decode_gpus), key=lambda k: len(batches[k]))
            batches[g][who] = outputs[who]
            kick_decode(t, g)
        elif kind == "chunk":
            decode_busy[who] = False
            chunks[what] += 1
            if chunks[what] == hw.prefill_chunks:
                queues[who].popleft()
                batches[who][what] = outputs[what]
            kick_decode(t, who)
        else:  # a decode step finished: every member gets a token
            decode_busy[who] = False
            batch = batches[who]
            for request in list(batch):
                if math.isnan(first[request]):
                    first[request] = t
                else:
                    worst_gap[request] = max(worst_gap[request], t - last[request])
                last[request] = t
                batch[request] -= 1
                if batch[request] == 0:
                    del batch[request]
                    finished += 1
            kick_decode(t, who)
    ttft = np.asarray(first) - trace.arrival_s
    good = (ttft <= SEED_SLO.ttft_s) & (np.asarray(worst_gap) <= (SEED_SLO.max_token_gap_s or math.inf))
    return seed_percentile(ttft, 0.5), seed_percentile(ttft, 0.99), float(good.mean())


RunEvents = Callable[[SimConfig, Trace], RawRun]


def seed_table_fast(
    traces: dict[float, Trace], run: RunEvents = run_events
) -> list[tuple[float, float, float]]:
    rows = []
    for rate in RATES:
        for mode, prefill in ROWS:
            config = SimConfig(SEED_HARDWARE, Fleet(mode, prefill, SEED_GPUS - prefill), slo=SEED_SLO)  # type: ignore[arg-type]
            result = summarise(traces[rate], run(config, traces[rate]), config.slo, 60.0)
            rows.append((result.ttft_p50, result.ttft_p99, result.goodput))
    return rows


def engine_at(revision: str) -> RunEvents:
    """`run_events` of sim/engine.py as committed at `revision`, loaded beside the current one."""
    root = Path(__file__).resolve().parent.parent
    source = subprocess.run(
        ["git", "show", f"{revision}:controller/src/xpyd_controller/sim/engine.py"],
        cwd=root,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    module = types.ModuleType(f"xpyd_controller.sim.engine_at_{revision}")
    sys.modules[module.__name__] = module  # dataclasses look their module up while being created
    exec(compile(source, f"engine.py@{revision}", "exec"), module.__dict__)
    run: RunEvents = module.run_events
    return run


def seed_table_baseline(traces: dict[float, Trace]) -> list[tuple[float, float, float]]:
    return [baseline_run(mode, prefill, traces[rate]) for rate in RATES for mode, prefill in ROWS]


def timed(fn: Callable[[], object], repeats: int) -> tuple[list[float], object]:
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return times, result


def timed_pair(
    fn: Callable[[], object], other: Callable[[], object], repeats: int
) -> tuple[list[float], object, list[float], object]:
    """Time two variants alternately, so both see the same machine load."""
    times: list[float] = []
    other_times: list[float] = []
    result = other_result = None
    for _ in range(repeats):
        one, result = timed(fn, 1)
        two, other_result = timed(other, 1)
        times += one
        other_times += two
    return times, result, other_times, other_result


def day_run(rate: float, policy_name: str) -> tuple[float, int, float]:
    scenario = load_scenario("drift-day")
    trace = scenario.traffic.build(seed=1, rate=rate)
    policy = build_policy(policy_name, scenario.config, trace)
    start = time.perf_counter()
    result = simulate(scenario.config, trace, policy, limits=scenario.limits)
    return time.perf_counter() - start, result.requests, result.goodput


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--baseline-repeats", type=int, default=3)
    parser.add_argument("--day-rate", type=float, default=30.0)
    parser.add_argument("--day-repeats", type=int, default=3)
    parser.add_argument("--against", metavar="REV", help="also time sim/engine.py at git revision REV")
    parser.add_argument("--write", action="store_true", help="update docs/BENCHMARKS.md")
    args = parser.parse_args()

    traces = {rate: seed_requests(rate) for rate in RATES}
    previous_row = previous_note = ""
    if args.against:
        previous = engine_at(args.against)
        fast_times, fast_rows, previous_times, previous_rows = timed_pair(
            lambda: seed_table_fast(traces), lambda: seed_table_fast(traces, previous), args.repeats
        )
        previous_median = statistics.median(previous_times)
        same = previous_rows == fast_rows
        print(
            f"engine at {args.against}: {previous_median:.3f} s {[round(x, 3) for x in previous_times]}, "
            f"identical rows: {same}"
        )
        previous_row = (
            f"| seed table, engine at `{args.against}` (same run, interleaved) | "
            f"{previous_median:.3f} s | | |\n"
        )
        previous_note = (
            f" Engine at `{args.against}`, interleaved with this tree's runs: "
            f"{[round(x, 3) for x in previous_times]} s, identical table: {same}."
        )
    else:
        fast_times, fast_rows = timed(lambda: seed_table_fast(traces), args.repeats)
    base_times, base_rows = timed(lambda: seed_table_baseline(traces), args.baseline_repeats)
    assert isinstance(fast_rows, list) and isinstance(base_rows, list)
    agree = all(
        math.isclose(f[0], b[0], rel_tol=1e-6) and math.isclose(f[2], b[2], abs_tol=1e-9)
        for f, b in zip(fast_rows, base_rows, strict=True)
    )
    fast, base = statistics.median(fast_times), statistics.median(base_times)
    requests = sum(len(traces[rate]) for rate in RATES) * len(ROWS)
    print(f"seed table ({requests} requests): fast {fast:.3f} s, baseline {base:.3f} s, x{base / fast:.1f}")
    print(
        f"  fast runs {[round(x, 3) for x in fast_times]}, baseline runs {[round(x, 3) for x in base_times]}"
    )
    print(f"  same TTFT p50 and goodput in all 8 rows: {agree}")
    day = [day_run(args.day_rate, "xpyd") for _ in range(args.day_repeats)]
    day_wall = statistics.median(d[0] for d in day)
    day_requests = day[0][1]
    print(
        f"24 h drift day at {args.day_rate:g} req/s, xpyd policy in the loop: {day_wall:.1f} s wall, "
        f"{day_requests} requests, {day_requests / day_wall:,.0f} requests/s (runs {[round(d[0], 1) for d in day]})"
    )
    if args.write:
        body = f"""{SECTION}

Command: `{" ".join([".venv/bin/python", "benchmarks/simulator_speed.py", *sys.argv[1:]])}` on
{platform.machine()} / Python {platform.python_version()} (shared 2-core machine; medians).

| workload | this simulator | baseline (one event per step/chunk) | speed-up |
|---|---|---|---|
| seed table, 8 runs, {requests:,} requests | {fast:.3f} s ({requests / fast:,.0f} req/s) | {base:.3f} s ({requests / base:,.0f} req/s) | ×{base / fast:.1f} |
{previous_row}| 24 h drift day at {args.day_rate:g} req/s, xpyd policy in the loop, {day_requests:,} requests | {day_wall:.1f} s ({day_requests / day_wall:,.0f} req/s) | — (not run: hours) | |

Both simulators produce the same seed table (TTFT p50 and goodput identical in all 8 rows: {agree}).
Individual timings: fast {[round(x, 3) for x in fast_times]} s, baseline {[round(x, 3) for x in base_times]} s,
day {[round(d[0], 1) for d in day]} s.{previous_note} Targets: seed table < 0.5 s, day < 60 s.
"""
        replace_section(SECTION, body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
