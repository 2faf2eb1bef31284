"""Cross-check xpyd's fleet simulator against NVIDIA Dynamo's mocker on the same trace and cost model.

Dynamo's mocker (`dynamo._core.run_mocker_trace_replay`, PyPI ai-dynamo-runtime 1.6.1) is a
disaggregation-aware engine simulator of its own: it schedules prefill and decode workers, chunks and
batches, transfers KV and reports per-request latencies. Both simulators get the same requests (the
seed article's draws, written as a Mooncake trace) and the same timing: xpyd's roofline tabulated as
a Dynamo profile (`prefill_isl → prefill_ttft_ms`, `(decode_active_kv_tokens, decode_context_length)
→ decode_itl`) for the mocker, the roofline itself for xpyd. Prefix caching is off in both, each
prefill worker runs one prompt at a time (as xpyd's prefill instances do), the mocker's KV router
places by load (xpyd's placement is least-loaded; `--router round_robin` shows what that costs), and
the KV link is the seed's 50 GB/s. Per row: TTFT p50/p90/p99 and TPOT p50/p99 from each, their relative difference, and
requests simulated per CPU-second by each.

    "$(hack/dynamo-bench)" benchmarks/peer_simulators.py [--runs 3] [--write]

Exits 1, naming the row and the metric, when any difference exceeds `TOLERANCE`: the two simulators
model the same fleet, so a larger gap is a bug in one of them (or a changed cost model), not noise.
`--write` replaces the "Peer simulators" section of docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bench_docs import publish
from xpyd_controller.model.roofline import decode_step_seconds, prefill_seconds
from xpyd_controller.sim.config import Fleet, SimConfig
from xpyd_controller.sim.results import time_per_output_token
from xpyd_controller.sim.runner import run_events
from xpyd_controller.sim.seed import SEED_HARDWARE, SEED_SLO, seed_requests
from xpyd_controller.sim.traces import Trace

SECTION = "## Peer simulators: xpyd vs Dynamo's mocker (`benchmarks/peer_simulators.py`)"
BLOCK_SIZE = 64  # tokens per KV block in the mocker; the trace's hash ids count blocks
# Largest relative difference allowed per metric (|mocker − xpyd| / xpyd). TPOT is one step time
# in both, so it must agree closely; TTFT adds queueing, where the two schedulers differ in detail
# (the mocker emits the first token after decode's first step, xpyd when prefill and transfer end).
TOLERANCE = {"ttft_p50": 0.10, "ttft_p90": 0.10, "ttft_p99": 0.15, "tpot_p50": 0.05, "tpot_p99": 0.05}
METRICS = tuple(TOLERANCE)


@dataclass(frozen=True)
class Row:
    rate: float
    prefill: int
    decode: int
    count: int = 6000

    @property
    def label(self) -> str:
        return f"seed λ={self.rate:g}, {self.prefill}P:{self.decode}D"


ROWS = (Row(20, 4, 4), Row(28, 5, 3), Row(28, 6, 2), Row(36, 6, 2))


def percentiles(ttft_s: np.ndarray, tpot_s: np.ndarray) -> dict[str, float]:
    return {
        "ttft_p50": float(np.percentile(ttft_s, 50)),
        "ttft_p90": float(np.percentile(ttft_s, 90)),
        "ttft_p99": float(np.percentile(ttft_s, 99)),
        "tpot_p50": float(np.percentile(tpot_s, 50)),
        "tpot_p99": float(np.percentile(tpot_s, 99)),
    }


def timed(run: Callable[[], dict[str, float]]) -> tuple[dict[str, float], float]:
    started = time.process_time()
    result = run()
    return result, time.process_time() - started


def run_xpyd(row: Row, trace: Trace) -> dict[str, float]:
    config = SimConfig(SEED_HARDWARE, Fleet("disagg", row.prefill, row.decode), slo=SEED_SLO)
    raw = run_events(config, trace, None, None)
    multi = trace.output_tokens > 1
    ttft = np.asarray(raw.first_token_s) - trace.arrival_s
    return percentiles(ttft, np.asarray(time_per_output_token(trace, raw))[multi])


def write_profile(path: Path, max_prompt: int, max_batch: int) -> None:
    """xpyd's seed roofline as the mocker's profile: prefill time by ISL, decode step by (KV, context)."""
    hw = SEED_HARDWARE
    isl = np.linspace(1, max_prompt, 400)
    ttft_ms = prefill_seconds(hw.model, hw.gpu, isl, hw.gpus_per_instance) * 1e3
    context = np.linspace(1, max_prompt + 500, 60)
    kv = np.linspace(0, max_batch * (max_prompt + 500), 400)
    batch = np.maximum(1.0, kv[:, None] / context[None, :])
    # The seed's step reads no KV (context 0): the time depends on the batch only.
    itl_ms = decode_step_seconds(hw.model, hw.gpu, batch, 0.0, step_overhead=hw.step_overhead_s) * 1e3
    np.savez(
        path,
        prefill_isl=isl,
        prefill_ttft_ms=ttft_ms,
        decode_active_kv_tokens=kv,
        decode_context_length=context,
        decode_itl=itl_ms,
    )


def write_mooncake(path: Path, trace: Trace) -> None:
    """Mooncake JSONL: arrival in ms, lengths, and distinct block hashes (nothing shared, no cache hits)."""
    next_block = 0
    with path.open("w", encoding="utf-8") as out:
        for arrival, prompt, output in zip(
            trace.arrival_s, trace.prompt_tokens, trace.output_tokens, strict=True
        ):
            blocks = -(-int(prompt) // BLOCK_SIZE)
            record = {
                "timestamp": float(arrival) * 1e3,
                "input_length": int(prompt),
                "output_length": int(output),
                "hash_ids": list(range(next_block, next_block + blocks)),
            }
            next_block += blocks
            out.write(json.dumps(record) + "\n")


def run_mocker(row: Row, trace_path: Path, profile: Path, router: str) -> dict[str, float]:
    from dynamo._core import run_mocker_trace_replay

    hw = SEED_HARDWARE
    kv_blocks = int(
        (hw.gpu.hbm_bytes - hw.model.weight_footprint_bytes) / hw.model.kv_bytes_per_token / BLOCK_SIZE
    )
    timing = {"type": "external", "provider": "dynamo_profile", "config": {"path": str(profile)}}

    def engine(role: str, **limits: int) -> dict[str, object]:
        return {
            "engine": {
                "worker_type": role,
                "block_size": BLOCK_SIZE,
                "num_gpu_blocks": kv_blocks,
                "enable_prefix_caching": False,
                "kv_transfer_bandwidth": hw.link.bandwidth / 1e9,
                "kv_transfer_bytes_per_token": int(hw.model.kv_bytes_per_token),
                "timing_model": timing,
                **limits,
            }
        }

    result = run_mocker_trace_replay(
        [str(trace_path)],
        prefill_engine_args=engine("prefill", max_num_seqs=1),
        decode_engine_args=engine("decode", max_num_seqs=4096),
        num_prefill_workers=row.prefill,
        num_decode_workers=row.decode,
        trace_block_size=BLOCK_SIZE,
        router_mode=router,
        capture_per_request=True,
    )
    done = [r for r in result.per_request or [] if r["terminal_status"] == "completed"]
    if len(done) != row.count:
        raise RuntimeError(f"{row.label}: the mocker completed {len(done)} of {row.count} requests")
    ttft = np.asarray([r["ttft_ms"] for r in done]) / 1e3
    tpot = np.asarray([r["itl_ms"] for r in done if r["output_length"] > 1]) / 1e3
    return percentiles(ttft, tpot)


@dataclass(frozen=True)
class Measured:
    row: Row
    xpyd: dict[str, float]
    mocker: dict[str, float]
    xpyd_cpu_s: float
    mocker_cpu_s: float

    def difference(self, metric: str) -> float:
        return (self.mocker[metric] - self.xpyd[metric]) / self.xpyd[metric]


def measure(row: Row, runs: int, router: str, workdir: Path) -> Measured:
    trace = seed_requests(row.rate, row.count)
    trace_path, profile = workdir / f"trace-{row.rate:g}.jsonl", workdir / "profile.npz"
    write_mooncake(trace_path, trace)
    write_profile(profile, int(trace.prompt_tokens.max()), max_batch=512)
    xpyd_runs = [timed(lambda: run_xpyd(row, trace)) for _ in range(runs)]
    mocker_runs = [timed(lambda: run_mocker(row, trace_path, profile, router)) for _ in range(runs)]
    return Measured(
        row,
        xpyd_runs[0][0],
        mocker_runs[0][0],
        statistics.median(cpu for _, cpu in xpyd_runs),
        statistics.median(cpu for _, cpu in mocker_runs),
    )


def markdown(results: list[Measured], args: argparse.Namespace, failures: list[str]) -> str:
    lines = [
        SECTION,
        "",
        f'Command: `"$(hack/dynamo-bench)" benchmarks/peer_simulators.py {" ".join(sys.argv[1:])}` on '
        f"{platform.machine()} / Python {platform.python_version()}; ai-dynamo-runtime 1.6.1; "
        f"mocker router `{args.router}`; CPU seconds are the median of {args.runs} runs (process time).",
        "",
        "Each cell: xpyd / mocker (difference). TTFT in s, TPOT in ms.",
        "",
        "| row | requests | "
        + " | ".join(METRICS)
        + " | xpyd req/CPU-s | mocker req/CPU-s | mocker CPU ÷ xpyd |",
        "|---" * (len(METRICS) + 5) + "|",
    ]
    for m in results:
        cells = []
        for metric in METRICS:
            scale = 1e3 if metric.startswith("tpot") else 1.0
            fmt = "{:.1f}" if scale > 1 else "{:.3f}"
            cells.append(
                f"{fmt.format(m.xpyd[metric] * scale)} / {fmt.format(m.mocker[metric] * scale)} "
                f"({m.difference(metric):+.1%})"
            )
        lines.append(
            f"| {m.row.label} | {m.row.count:,} | "
            + " | ".join(cells)
            + f" | {m.row.count / m.xpyd_cpu_s:,.0f} | {m.row.count / m.mocker_cpu_s:,.0f} | "
            f"{m.mocker_cpu_s / m.xpyd_cpu_s:.1f}× |"
        )
    bounds = ", ".join(f"{k} {v:.0%}" for k, v in TOLERANCE.items())
    lines += ["", f"Tolerance (|mocker − xpyd| / xpyd): {bounds}."]
    lines += [f"- OUT OF TOLERANCE: {f}" for f in failures] if failures else ["All rows within tolerance."]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=3, help="timed runs per simulator and row")
    parser.add_argument(
        "--router",
        choices=("kv_router", "round_robin"),
        default="kv_router",
        help="the mocker's router; kv_router weighs worker load, as xpyd's least-loaded placement does",
    )
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="xpyd-peers-") as tmp:
        results = [measure(row, args.runs, args.router, Path(tmp)) for row in ROWS]
    failures = [
        f"{m.row.label} {metric}: xpyd {m.xpyd[metric]:.4g} s, mocker {m.mocker[metric]:.4g} s "
        f"({m.difference(metric):+.1%}, bound ±{TOLERANCE[metric]:.0%})"
        for m in results
        for metric in METRICS
        if abs(m.difference(metric)) > TOLERANCE[metric]
    ]
    publish(SECTION, markdown(results, args, failures), args.write)
    for failure in failures:
        print(f"FAILED: {failure}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
