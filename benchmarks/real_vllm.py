"""Real vLLM on CPU: engine start-up, CPU, TTFT through vllm-router vs. direct, KV transfer time.

The stack is the real-vLLM test's (e2e/harness/vllm_stack.py): one prefill and one decode vLLM CPU
engine (NixlConnector over UCX on DRAM, each pinned to one core) started from the pod specs xpyd
renders, the real vllm-router in front, inference-perf as the users. After the test's load through the
router, the same load goes straight to one engine (no PD: it prefills and decodes locally) for the
"direct" row. One stack per run: vLLM takes minutes to start on 2 cores.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from e2e.harness.vllm_engine import vllm_env_dir  # noqa: E402
from e2e.harness.vllm_stack import (  # noqa: E402
    KV_LEASE_S,
    LoadSpec,
    RealStack,
    metric_sum,
    real_stack,
    run_inference_perf,
)

from bench_docs import publish  # noqa: E402

SECTION = "## Real vLLM on CPU (`benchmarks/real_vllm.py`)"


def ttft(report: dict[str, Any]) -> dict[str, float]:
    stats = report["successes"]["latency"]["time_to_first_token"]
    return {"p50": float(stats["median"]), "p90": float(stats["p90"])}


def transfer(stack: RealStack) -> tuple[float, float]:
    """Mean NIXL transfer time (s) and bytes per transfer, from decode's counters."""
    text = next(e for e in stack.engines if str(e.role) == "decode").metrics_text()
    count = metric_sum(text, "vllm:nixl_xfer_time_seconds_count")
    seconds = metric_sum(text, "vllm:nixl_xfer_time_seconds_sum")
    moved = metric_sum(text, "vllm:nixl_bytes_transferred_sum")
    return seconds / count, moved / count


def _ms(seconds: float | None) -> str:
    return "n/a" if seconds is None else f"{seconds * 1000:.0f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="replace this benchmark's section of docs")
    args = parser.parse_args()
    env_dir = vllm_env_dir()
    spec = LoadSpec()
    with tempfile.TemporaryDirectory(prefix="xpyd-real-vllm-") as tmp, real_stack(Path(tmp)) as stack:
        routed = ttft(stack.load.report)
        prefill = next(e for e in stack.engines if str(e.role) == "prefill")
        config = spec.inference_perf_config(prefill.process.url, env_dir / "model", Path(tmp) / "direct")
        direct = ttft(run_inference_perf(env_dir / "loadgen", config, Path(tmp), timeout_s=600))
        xfer_s, xfer_bytes = transfer(stack)
        controller = stack.controller_answers["ttft_p90"]
        legs = stack.ttft_legs
        users = stack.load
        stalls = stack.stalled_pulls
    load = os.getloadavg()[0]
    lines = [
        SECTION,
        "",
        f"Command: `nice -n 15 .venv/bin/python benchmarks/real_vllm.py --write` on {platform.machine()} / Python "
        f"{platform.python_version()} (shared 2-core machine, 1-min load average {load:.2f} at the end; "
        "one stack, medians and p90s over its requests).",
        "",
        f"vLLM CPU 0.32.0, the tiny random Llama of hack/vllm-env, {spec.requests} streaming requests of "
        f"{spec.prompt_tokens} prompt + {spec.output_tokens} output tokens at concurrency {spec.concurrency} "
        "(inference-perf 0.7.0); the same load through vllm-router 0.1.17 (1 prefill + 1 decode, KV over "
        f"NIXL, the engines' KV lease {KV_LEASE_S:g} s from the PDDeployment's conversion.kvLeaseSeconds) and "
        "straight to one engine. A load in which a NIXL pull stalled until the prefill's lease expired "
        "(vLLM 0.32 on CPU, docs/controller.md) is run once more, as in the test; the figures are the last "
        "load's.",
        "",
        "| figure | value |",
        "|---|---|",
        f"| engine start-up, both in parallel (imports, weights, KV cache; --enforce-eager) | "
        f"{stack.timings['engine_startup_s']:.0f} s |",
    ]
    for role, cores in stack.cpu_cores.items():
        lines.append(
            f"| CPU of the {role} engine, idle / under load (cores) | {cores['idle']:.2f} / {cores['load']:.2f} |"
        )
    lines += [
        f"| NIXL pulls stalled until the lease expired, per load | {', '.join(map(str, stalls))} |",
        f"| TTFT through the router, p50 / p90 / p99 (users' clock) | {routed['p50'] * 1000:.0f} / "
        f"{routed['p90'] * 1000:.0f} / {users.ttft_p99_s * 1000:.0f} ms |",
        f"| TTFT direct to one engine, p50 / p90 | {direct['p50'] * 1000:.0f} / {direct['p90'] * 1000:.0f} ms |",
        f"| the controller's TTFT p90 under vllm-router (prefill's and decode's TTFT as two legs + the "
        f"router's mean time outside prefill's clock, Prometheus) | "
        f"{(controller or float('nan')) * 1000:.0f} ms |",
        f"| of it, means: prefill's TTFT / decode's TTFT / the router's time until decode responds | "
        f"{_ms(legs['prefill_ttft_mean'])} / {_ms(legs['decode_ttft_mean'])} / "
        f"{_ms(legs['router_until_decode_responds_mean'])} ms |",
        f"| KV transfer (vllm:nixl_xfer_time_seconds), mean per request | {xfer_s * 1000:.1f} ms for "
        f"{xfer_bytes / 1024:.0f} KiB |",
        "",
        "On a shared machine the latencies are mostly CPU starvation and the stalls, not the model (one "
        "engine alone on a quiet core decodes at ~80 tok/s, see the real-data-plane note); the comparisons "
        "within the run hold. An idle NIXL worker busy-polls (nixl's Python API sets no progress-thread "
        "delay): 0.45-0.53 of a core in a run without nice, less when a loaded machine gives it less.",
        "",
        "Environment (`hack/vllm-env`, cached in ~/.cache/xpyd/vllm-cpu-…): cold 5 min 48 s with an empty "
        "download cache (vLLM venv 6.2 GB incl. CUDA torch and nvidia wheels, inference-perf venv 0.5 GB, "
        "model 6.6 MB; of it ~95 s to build the tiny model and tokenizer), 1 min 44 s re-created from "
        "uv's download cache, 0.05 s warm.",
    ]
    return publish(SECTION, "\n".join(lines) + "\n", args.write)


if __name__ == "__main__":
    sys.exit(main())
