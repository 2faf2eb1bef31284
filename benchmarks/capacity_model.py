"""Capacity-model speed: one vectorised call over 10^6 scenarios, and `xpyd plan` as a process.

Baselines run in the same process, side by side, so machine load cancels out of the ratios:
- the same scenarios sized one at a time through the scalar API (a sample, extrapolated to 10^6);
- the Python interpreter starting with numpy imported (the floor under any `xpyd plan` run).

    .venv/bin/python benchmarks/capacity_model.py [--scenarios 1000000] [--runs 5] [--write docs/BENCHMARKS.md]

`--write` replaces the body of the "Capacity model" section of that file with the results.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np

from bench_processes import cached_bytecode_env
from xpyd_controller.model.presets import GPU_PRESETS, LINK_PRESETS, MODEL_PRESETS
from xpyd_controller.model.sizing import PoolConfig, Slo, Workload, size_pools

MODEL, GPU, LINK = MODEL_PRESETS["llama-3.1-70b"], GPU_PRESETS["h200"], LINK_PRESETS["ib-400g"]
POOLS = PoolConfig(prefill_gpus=2, decode_gpus=2, step_overhead=0.005, remote_overhead=0.03)
SCALAR_SAMPLE = 300
PLAN_COMMAND = [
    str(Path(sys.executable).with_name("xpyd")),
    *("plan", "--model", "llama-3.1-70b", "--gpu", "h200", "--link", "ib-400g"),
    *("--prefill-gpus", "2", "--decode-gpus", "2", "--rate", "4", "--isl", "8000", "--osl", "256"),
    *("--ttft-quantile", "0.9", "--ttft-slo", "3", "--json"),
]
SECTION = "## Capacity model (`benchmarks/capacity_model.py`)"


def scenarios(count: int, seed: int = 1) -> tuple[Workload, Slo, Slo]:
    """Random but valid workloads and SLOs: rates 0.1–100 req/s, prompts 128–64K, outputs 16–4K."""
    rng = np.random.default_rng(seed)
    isl = np.exp(rng.uniform(np.log(128), np.log(65536), count))
    workload = Workload(
        rate=np.exp(rng.uniform(np.log(0.1), np.log(100), count)),
        isl=isl,
        osl=np.exp(rng.uniform(np.log(16), np.log(4096), count)),
        hit_rate=rng.uniform(0, 0.9, count),
        isl_std=isl * rng.uniform(0, 0.5, count),
    )
    ttft = rng.uniform(2.0, 20.0, count)
    tpot = rng.uniform(0.03, 0.2, count)
    mean_slo = Slo(ttft=ttft, tpot=tpot)
    quantile_slo = Slo(ttft=ttft, tpot=tpot, ttft_quantile=0.9, context_quantile=0.9)
    return workload, mean_slo, quantile_slo


@dataclass(frozen=True)
class Timing:
    """Medians of wall time and of CPU time (this process, or the child for subprocesses).

    CPU time is what the work costs; wall time also holds the waits for the shared machine's cores.
    """

    wall: float
    cpu: float


def median_timing(action: Callable[[], object], runs: int, cpu_clock: Callable[[], float]) -> Timing:
    walls, cpus = [], []
    for _ in range(runs):
        wall, cpu = time.perf_counter(), cpu_clock()
        action()
        walls.append(time.perf_counter() - wall)
        cpus.append(cpu_clock() - cpu)
    return Timing(statistics.median(walls), statistics.median(cpus))


def children_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def scalar_loop_timing(workload: Workload, slo: Slo) -> Timing:
    """Size the first SCALAR_SAMPLE scenarios one call each; seconds per scenario."""
    columns = {
        name: np.asarray(getattr(workload, name)) for name in ("rate", "isl", "osl", "hit_rate", "isl_std")
    }
    ttft, tpot = np.asarray(slo.ttft), np.asarray(slo.tpot)

    def loop() -> None:
        for i in range(SCALAR_SAMPLE):
            one = Workload(**{name: float(values[i]) for name, values in columns.items()})
            one_slo = Slo(
                ttft=float(ttft[i]),
                tpot=float(tpot[i]),
                ttft_quantile=slo.ttft_quantile,
                context_quantile=slo.context_quantile,
            )
            size_pools(MODEL, GPU, LINK, one, one_slo, pools=POOLS)

    total = median_timing(loop, 1, time.process_time)
    return Timing(total.wall / SCALAR_SAMPLE, total.cpu / SCALAR_SAMPLE)


def process_timing(command: list[str], runs: int, bytecode: Path) -> Timing:
    """Each process with its bytecode cached under `bytecode`, as an installed package runs."""
    env = cached_bytecode_env(bytecode)

    def once() -> None:
        subprocess.run(command, check=True, capture_output=True, env=env)

    once()  # warm the page cache and the bytecode
    return median_timing(once, runs, children_cpu_seconds)


def measure(count: int, runs: int) -> str:
    workload, mean_slo, quantile_slo = scenarios(count)
    lines = [
        "| measurement | wall (median) | CPU (median) | baseline in the same run: wall / CPU | CPU ratio |",
        "|---|---|---|---|---|",
    ]
    for label, slo in (
        ("seed formulas (mean sizing)", mean_slo),
        ("TTFT p90 with queueing + context p90", quantile_slo),
    ):
        call = partial(size_pools, MODEL, GPU, LINK, workload, slo, pools=POOLS)
        vectorised = median_timing(call, runs, time.process_time)
        each = scalar_loop_timing(workload, slo)
        lines.append(
            f"| {count:,} scenarios, one vectorised call, {label} | {vectorised.wall:.3f} s "
            f"| {vectorised.cpu:.3f} s | one scalar call per scenario: {each.wall * 1e3:.2f} / "
            f"{each.cpu * 1e3:.2f} ms each, {each.cpu * count:.0f} s CPU for {count:,} "
            f"| {each.cpu * count / vectorised.cpu:.0f}× less |"
        )
    xpyd = PLAN_COMMAND[0]
    floor_command = [sys.executable, "-c", "import numpy"]
    commands = {
        "`xpyd plan` process, start to exit": PLAN_COMMAND,
        "`xpyd --help` process": [xpyd, "--help"],
        "`xpyd version` process": [xpyd, "version"],
    }
    timings: dict[str, list[Timing]] = {label: [] for label in [*commands, "floor"]}
    with tempfile.TemporaryDirectory(prefix="xpyd-bytecode-") as bytecode:
        for _ in range(runs):  # interleaved, so every command sees the same machine load
            timings["floor"].append(process_timing(floor_command, 1, Path(bytecode)))
            for label, command in commands.items():
                timings[label].append(process_timing(command, 1, Path(bytecode)))
    floor = Timing(
        statistics.median(t.wall for t in timings["floor"]),
        statistics.median(t.cpu for t in timings["floor"]),
    )
    for label in commands:
        run = Timing(
            statistics.median(t.wall for t in timings[label]),
            statistics.median(t.cpu for t in timings[label]),
        )
        lines.append(
            f"| {label} | {run.wall:.3f} s | {run.cpu:.3f} s "
            f"| `python -c 'import numpy'`: {floor.wall:.3f} / {floor.cpu:.3f} s "
            f"| {run.cpu / floor.cpu:.2f}× its CPU (target ≤ 1.3×) |"
        )
    command = " ".join(["xpyd", *PLAN_COMMAND[1:]])
    return "\n".join(
        [
            f"Machine: {os.cpu_count()} cores {platform.machine()}, Python {platform.python_version()}, "
            f"numpy {np.__version__}; 1-min load average {os.getloadavg()[0]:.1f} when done (the machine "
            f"is shared); medians of {runs} runs.",
            "",
            f"Command: `{' '.join(['.venv/bin/python', 'benchmarks/capacity_model.py', *sys.argv[1:]])}`",
            "",
            "Scenarios: llama-3.1-70b on H200 (2 GPUs per instance), ib-400g; log-uniform rate 0.1–100 req/s,",
            "ISL 128–64K (std up to half the mean), OSL 16–4K; hit rate 0–0.9; TTFT 2–20 s, TPOT 30–200 ms.",
            f"The scalar baseline sizes {SCALAR_SAMPLE} of them one `size_pools` call each.",
            f"The `xpyd plan` run: `{command}`.",
            "Every process runs with its bytecode cached, as an installed package does (one warm-up run",
            "each, PYTHONPYCACHEPREFIX in a temporary folder, PYTHONDONTWRITEBYTECODE dropped).",
            "",
            *lines,
        ]
    )


def write_section(path: Path, body: str) -> None:
    text = path.read_text()
    pattern = re.compile(re.escape(SECTION) + r"\n.*?(?=\n## |\Z)", re.DOTALL)
    if not pattern.search(text):
        raise SystemExit(f"{path}: section {SECTION!r} not found")
    path.write_text(pattern.sub(lambda _: f"{SECTION}\n\n{body}\n", text, count=1))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--scenarios", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--write", type=Path, help="markdown file whose Capacity model section to replace")
    args = parser.parse_args()
    body = measure(args.scenarios, args.runs)
    print(body)
    if args.write:
        write_section(args.write, body)


if __name__ == "__main__":
    main()
