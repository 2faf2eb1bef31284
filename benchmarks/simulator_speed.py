"""Fleet simulator speed: the seed table's 8 runs and a 24 h day with the policy in the loop.

Engines timed side by side in the same run (seed-table runs interleaved, so all see the same load):
the compiled event loop (sim/engine.py built by hack/native, what `xpyd simulate` uses), the same
source interpreted, and a baseline: a straightforward simulator with one heap event per decode step
and per prefill chunk (the seed article's algorithm, re-expressed here and kept only here). All must
produce the same table, so the comparison is like for like.

    .venv/bin/python benchmarks/simulator_speed.py [--repeats 5] [--day-rate 30] [--against REV] [--write]

`--against REV` also times the seed table with sim/engine.py as committed at git revision REV,
interpreted (a before/after of the source under the same machine load).

`--write` replaces the "Fleet simulator speed" section of docs/BENCHMARKS.md with the results.

`--cli` instead times the seed table as a user gets it: 8 `xpyd simulate` processes (one per row)
against the article's own simulator run as published, in the same run (interleaved). The article's
code is read from the seed text (`--article`, default /work/shared/seeds/), never kept in this
repository; its text lost the listing's indentation, so ARTICLE_INDENT restores it, and the run's
table must equal the one printed under the listing. `--write` then updates its own subsection.
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import json
import math
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import types
from collections import deque
from collections.abc import Callable
from pathlib import Path

import numpy as np

from bench_docs import replace_section
from bench_processes import cached_bytecode_env
from xpyd_controller.model.roofline import decode_step_seconds, kv_transfer_seconds, prefill_seconds
from xpyd_controller.sim import engine, native
from xpyd_controller.sim.config import Fleet, SimConfig
from xpyd_controller.sim.engine import RawRun
from xpyd_controller.sim.policies import build_policy
from xpyd_controller.sim.results import summarise
from xpyd_controller.sim.scenarios import load_scenario
from xpyd_controller.sim.seed import SEED_GPUS, SEED_HARDWARE, SEED_SLO, seed_requests
from xpyd_controller.sim.stats import seed_percentile
from xpyd_controller.sim.traces import Trace

ROWS = [("colocated", 0), ("disagg", 1), ("disagg", 4), ("disagg", 6)]
RATES = (8.0, 28.0)
SECTION = "## Fleet simulator speed (`benchmarks/simulator_speed.py`)"
CLI_SUBSECTION = "### Seed table through the CLI (`benchmarks/simulator_speed.py --cli`)"
ARTICLE = Path("/work/shared/seeds/001_e9de87bc22c4d4ce.txt")
ARTICLE_FIRST_LINE = "import heapq, random"
# Indent level (× 4 spaces) of each line of the article's listing, from ARTICLE_FIRST_LINE on.
ARTICLE_INDENT = "0000000000001112211211111111122331223312223323323323312222334434423333233343233323344545544531010000011222222221"
CLI_SPLITS = {("colocated", 0): ["--mode", "colocated", "--split", "8"]}


def article_program(path: Path) -> tuple[str, list[str]]:
    """The article's listing, re-indented, and the table rows it printed beneath it."""
    lines = path.read_text(encoding="utf-8").splitlines()
    start = lines.index(ARTICLE_FIRST_LINE)
    listing = lines[start : start + len(ARTICLE_INDENT)]
    code = "\n".join("    " * int(level) + line for level, line in zip(ARTICLE_INDENT, listing, strict=True))
    printed = [
        line for line in lines[start + len(ARTICLE_INDENT) :] if line.startswith(("colocated", "disagg"))
    ]
    return code + "\n", printed[:8]


def article_row_values(line: str) -> tuple[float, float]:
    """(TTFT p50 in ms, goodput in %) of one printed row."""
    fields = line.split()
    return float(fields[3]), float(fields[6].rstrip("%"))


def niced() -> str:
    """`nice -n N ` when this benchmark runs niced (part of the command to reproduce it)."""
    niceness = os.nice(0)
    return f"nice -n {niceness} " if niceness else ""


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed_process(argv: list[str], env: dict[str, str] | None = None) -> tuple[float, float, str]:
    """(wall s, CPU s, stdout) of one child process."""
    wall, cpu = time.perf_counter(), children_cpu()
    done = subprocess.run(argv, check=True, capture_output=True, text=True, env=env)
    return time.perf_counter() - wall, children_cpu() - cpu, done.stdout


def xpyd_seed_rows() -> list[tuple[str, list[str]]]:
    """The 8 rows as `xpyd simulate` command lines (label, argv)."""
    xpyd = str(Path(sys.executable).with_name("xpyd"))
    rows = []
    for rate in RATES:
        for mode, prefill in ROWS:
            split = CLI_SPLITS.get((mode, prefill), ["--split", f"{prefill}:{SEED_GPUS - prefill}"])
            argv = [xpyd, "simulate", "--scenario", "seed-8gpu", *split, "--rate", f"{rate:g}", "--json"]
            rows.append((f"{mode} {prefill} {rate:g}", argv))
    return rows


def cli_benchmark(args: argparse.Namespace) -> int:
    code, printed = article_program(args.article)
    with tempfile.TemporaryDirectory() as folder:
        script = Path(folder) / "article_simulator.py"
        script.write_text(code, encoding="utf-8")
        article_runs, xpyd_runs, agree = [], [], True
        env = cached_bytecode_env(Path(folder) / "bytecode")
        for _label, argv in xpyd_seed_rows()[:1]:
            timed_process(argv, env)  # warm-up: bytecode cached (the article's script is __main__)
        for _ in range(args.repeats):  # interleaved: both see the same machine load
            wall, cpu, out = timed_process([sys.executable, str(script)], env)
            ran = [line for line in out.splitlines() if line.startswith(("colocated", "disagg"))]
            if [line.split() for line in ran] != [line.split() for line in printed]:
                sys.exit("the article's simulator did not print the article's table: check ARTICLE_INDENT")
            article_runs.append((wall, cpu))
            total_wall = total_cpu = 0.0
            for (_label, argv), line in zip(xpyd_seed_rows(), printed, strict=True):
                wall, cpu, out = timed_process(argv, env)
                total_wall, total_cpu = total_wall + wall, total_cpu + cpu
                result = json.loads(out)
                ttft_ms, goodput_pct = article_row_values(line)
                agree &= round(result["ttft_p50"] * 1e3, 1) == ttft_ms
                agree &= round(result["goodput"] * 100, 1) == goodput_pct
            xpyd_runs.append((total_wall, total_cpu))
        floor_wall, floor_cpu, _ = timed_process([sys.executable, "-c", "pass"], env)
        numpy_wall, numpy_cpu, _ = timed_process([sys.executable, "-c", "import numpy"], env)
    article_wall = statistics.median(w for w, _ in article_runs)
    article_cpu = statistics.median(c for _, c in article_runs)
    xpyd_wall = statistics.median(w for w, _ in xpyd_runs)
    xpyd_cpu = statistics.median(c for _, c in xpyd_runs)
    engine_name = native.run_events_impl()[1]
    body = f"""{CLI_SUBSECTION}

Command: `{niced()}{" ".join([".venv/bin/python", "benchmarks/simulator_speed.py", *sys.argv[1:]])}` on
{platform.machine()} / Python {platform.python_version()}, {args.repeats} interleaved rounds (medians);
1-min load average {os.getloadavg()[0]:.1f} at the end (shared machine). The article's simulator is its
published listing read from `{args.article.name}` and run with the same interpreter; xpyd is 8
`xpyd simulate --scenario seed-8gpu --split X:Y --rate R --json` processes run one after another
(the co-located row `--mode colocated --split 8`), {engine_name} engine; every process with its
bytecode cached, as an installed package runs (benchmarks/bench_processes.py; one warm-up run).

| seed table, 8 rows × 6,000 requests | wall (median) | CPU (median) |
|---|---|---|
| the article's simulator, one process | {article_wall:.2f} s | {article_cpu:.2f} s |
| 8 `xpyd simulate` processes, one after another | {xpyd_wall:.2f} s | {xpyd_cpu:.2f} s |
| ratio | ×{article_wall / xpyd_wall:.1f} faster | ×{article_cpu / xpyd_cpu:.1f} less CPU |

Every row's TTFT p50 (0.1 ms) and goodput (0.1 %) equal the article's printed table: {agree}.
Per-process floor in this run: `python -c pass` {floor_wall:.3f} s wall / {floor_cpu:.3f} s CPU
(`python -c 'import numpy'`, which `xpyd simulate` no longer does on this path: {numpy_wall:.3f} s / {numpy_cpu:.3f} s).
Individual rounds: article {[(round(w, 2), round(c, 2)) for w, c in article_runs]},
xpyd {[(round(w, 2), round(c, 2)) for w, c in xpyd_runs]} (wall, CPU) s. Target: ×10.
"""
    print(body)
    if args.write:
        replace_section(SECTION, body, append=True)
    return 0 if agree else 1


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
Row = tuple[float, float, float]


def seed_table(traces: dict[float, Trace], run: RunEvents) -> list[Row]:
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


def baseline_table(traces: dict[float, Trace]) -> list[Row]:
    return [baseline_run(mode, prefill, traces[rate]) for rate in RATES for mode, prefill in ROWS]


def timed_interleaved(
    variants: dict[str, Callable[[], list[Row]]], repeats: int
) -> dict[str, tuple[list[float], list[Row]]]:
    """Time each variant once per round, `repeats` rounds, so all see the same machine load."""
    times: dict[str, list[float]] = {name: [] for name in variants}
    results: dict[str, list[Row]] = {}
    for _ in range(repeats):
        for name, fn in variants.items():
            start = time.perf_counter()
            results[name] = fn()
            times[name].append(time.perf_counter() - start)
    return {name: (times[name], results[name]) for name in variants}


def same_table(one: list[Row], other: list[Row]) -> bool:
    return all(
        math.isclose(a[0], b[0], rel_tol=1e-6) and math.isclose(a[2], b[2], abs_tol=1e-9)
        for a, b in zip(one, other, strict=True)
    )


def day_run(rate: float, run: native.RunEvents, policy_name: str = "xpyd") -> tuple[float, int, float]:
    scenario = load_scenario("drift-day")
    trace = scenario.traffic.build(seed=1, rate=rate)
    policy = build_policy(policy_name, scenario.config, trace)
    start = time.perf_counter()
    raw = run(scenario.config, trace, policy, scenario.limits)
    result = summarise(trace, raw, scenario.config.slo, 60.0)
    return time.perf_counter() - start, result.requests, result.goodput


def rounded(times: list[float], digits: int = 3) -> list[float]:
    return [round(x, digits) for x in times]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=5, help="seed-table rounds (compiled, source)")
    parser.add_argument("--baseline-repeats", type=int, default=3)
    parser.add_argument("--day-rate", type=float, default=30.0)
    parser.add_argument("--day-repeats", type=int, default=3, help="24 h runs on the compiled engine")
    parser.add_argument("--day-source-repeats", type=int, default=1, help="24 h runs on the source engine")
    parser.add_argument("--against", metavar="REV", help="also time sim/engine.py at git revision REV")
    parser.add_argument("--write", action="store_true", help="update docs/BENCHMARKS.md")
    parser.add_argument(
        "--cli", action="store_true", help="only the seed table as xpyd processes vs the article"
    )
    parser.add_argument("--article", type=Path, default=ARTICLE, help="the seed article's text (for --cli)")
    args = parser.parse_args()
    if args.cli:
        return cli_benchmark(args)

    try:
        compiled = native.compiled_run_events()
    except native.NativeEngineError as error:
        sys.exit(str(error))
    traces = {rate: seed_requests(rate) for rate in RATES}
    variants: dict[str, Callable[[], list[Row]]] = {
        "compiled": lambda: seed_table(traces, compiled),
        "source": lambda: seed_table(traces, engine.run_events),
    }
    if args.against:
        previous = engine_at(args.against)
        variants[f"source at {args.against}"] = lambda: seed_table(traces, previous)
    timed_runs = timed_interleaved(variants, args.repeats)
    base_times, base_rows = timed_interleaved(
        {"baseline": lambda: baseline_table(traces)}, args.baseline_repeats
    )["baseline"]
    base = statistics.median(base_times)
    requests = sum(len(traces[rate]) for rate in RATES) * len(ROWS)
    compiled_median = statistics.median(timed_runs["compiled"][0])
    lines = []
    for name, (times, rows) in timed_runs.items():
        median = statistics.median(times)
        agree = same_table(rows, base_rows)
        print(
            f"seed table ({requests} requests), {name}: {median:.3f} s {rounded(times)}, "
            f"baseline x{base / median:.1f}, same table as baseline: {agree}"
        )
        lines.append(
            f"| seed table, 8 runs, {requests:,} requests | {name} | {median:.3f} s ({requests / median:,.0f} req/s) "
            f"| ×{median / compiled_median:.2f} | ×{base / median:.1f} | {agree} |"
        )
    print(f"seed table, baseline: {base:.3f} s {rounded(base_times)}")
    days = {
        "compiled": [day_run(args.day_rate, compiled) for _ in range(args.day_repeats)],
        "source": [day_run(args.day_rate, engine.run_events) for _ in range(args.day_source_repeats)],
    }
    day_requests = days["compiled"][0][1]
    compiled_day = statistics.median(d[0] for d in days["compiled"])
    day_notes = []
    for name, runs in days.items():
        if not runs:
            continue
        wall = statistics.median(d[0] for d in runs)
        print(
            f"24 h drift day at {args.day_rate:g} req/s, xpyd in the loop, {name}: {wall:.1f} s "
            f"{rounded([d[0] for d in runs], 1)}, {day_requests / wall:,.0f} requests/s, goodput {runs[0][2]:.4f}"
        )
        lines.append(
            f"| 24 h drift day at {args.day_rate:g} req/s, xpyd in the loop, {day_requests:,} requests | {name} "
            f"| {wall:.1f} s ({day_requests / wall:,.0f} req/s) | ×{wall / compiled_day:.2f} | — (hours) | "
            f"{runs[0][2] == days['compiled'][0][2]} |"
        )
        day_notes.append(f"{name} {rounded([d[0] for d in runs], 1)} s")
    if args.write:
        table = "\n".join(lines)
        seed_notes = ", ".join(f"{name} {rounded(times)} s" for name, (times, _) in timed_runs.items())
        body = f"""{SECTION}

Command: `{niced()}{" ".join([".venv/bin/python", "benchmarks/simulator_speed.py", *sys.argv[1:]])}` on
{platform.machine()} / Python {platform.python_version()} (shared 2-core machine; medians).
"compiled" is sim/engine.py built by `hack/native` (mypyc), which `xpyd simulate` and the benchmarks
use; "source" is the same file interpreted. Seed-table runs of the engines were interleaved.

| workload | engine | wall time | vs compiled | baseline (one event per step/chunk) speed-up | same results |
|---|---|---|---|---|---|
{table}

"Same results": the seed table's TTFT p50 and goodput equal the baseline's in all 8 rows; the day's
goodput equals the compiled run's. Baseline seed table: {base:.3f} s median.
Individual timings: seed table {seed_notes}, baseline {rounded(base_times)} s; day {"; ".join(day_notes)}.
Targets: seed table < 0.5 s, day < 60 s.
"""
        replace_section(SECTION, body, keep_from=CLI_SUBSECTION)
    return 0


if __name__ == "__main__":
    sys.exit(main())
