"""Fit the GPU presets' efficiencies (MFU, MBU, decode step overhead) to public measured profiles.

Sources (read from local copies; none is committed):
- splitwise-sim `data/perf_model.csv` (Mutinifni/splitwise-sim): Llama-2-70B measured on A100-80GB
  and H100-80GB at TP 2/4/8: prompt time by prompt size and batch, token time by batch. `--splitwise`.
- DistServe's fitted A100-80GB profile `simdistserve/estimators/profile_data/profiler-a100-80g.distserve.json`
  (LLMServe/DistServe): prefill ms = a + b·tokens + c·Σtokens², decode ms = a + b·context tokens +
  c·batch for OPT-13B/66B; evaluated on a grid of prompt lengths and batches. `--distserve`.
- Dynamo's published H200 profile (Llama-3.1-8B-Instruct-FP8, TP1), shipped in the ai-dynamo wheel
  as `dynamo/planner/tests/data/profiling_results/H200_TP1P_TP1D`: prefill TTFT by ISL, decode ITL by
  KV usage and context. Found in the installed wheel (`hack/dynamo-bench`) or `--dynamo-profile DIR`.

Per GPU the fit is least squares over each source's smallest tensor-parallel size (`--all-tp` for all), on relative error: MFU from prompts of ≥ 1024 tokens (where fixed
costs are small; xpyd's prefill has no fixed term; FP8 weights against the FP8 peak), step overhead and MBU from decode steps as
`t = ovh + bytes/(G·HBM bandwidth)/MBU` on memory-bound steps. Printed: the points, the fit, and the
median and largest relative error of the fitted roofline and of the old defaults on every point.

    .venv/bin/python benchmarks/calibrate_presets.py --splitwise perf_model.csv --distserve profiler.json
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from dataclasses import dataclass, replace
from importlib.util import find_spec
from pathlib import Path
from typing import TypeVar

import numpy as np

from xpyd_controller.model.presets import DATASHEET_GPUS
from xpyd_controller.model.roofline import decode_step_seconds, prefill_seconds
from xpyd_controller.model.specs import GpuSpec, ModelSpec

# Architectures from each model's config.json (Hugging Face model cards).
MODELS = {
    "llama2-70b": ModelSpec(params=68.98e9, layers=80, kv_heads=8, head_dim=128, hidden_size=8192),
    "facebook/opt-13b": ModelSpec(params=12.85e9, layers=40, kv_heads=40, head_dim=128, hidden_size=5120),
    "facebook/opt-66b": ModelSpec(params=65.7e9, layers=64, kv_heads=72, head_dim=128, hidden_size=9216),
    "llama-3.1-8b-fp8": ModelSpec(
        params=8.03e9, layers=32, kv_heads=8, head_dim=128, hidden_size=4096, weight_bytes=1.0
    ),
}
SPLITWISE_GPUS = {"a100-80gb": "a100-80g", "h100-80gb": "h100-sxm"}
DISTSERVE_TP = {"facebook/opt-13b": ("1", "2", "4"), "facebook/opt-66b": ("2", "4")}
OLD_DEFAULTS = (0.4, 1.0, 0.0)  # mfu, mbu, step overhead before this calibration


@dataclass(frozen=True)
class Prefill:
    source: str
    model: str
    gpus: int
    tokens: float  # per prompt
    prompts: int
    seconds: float


@dataclass(frozen=True)
class Decode:
    source: str
    model: str
    gpus: int
    batch: float
    context: float
    seconds: float


Point = TypeVar("Point", Prefill, Decode)


def splitwise(path: Path) -> dict[str, tuple[list[Prefill], list[Decode]]]:
    """Mean of the repeated measurements per (GPU, TP, prompt, batch); batch 64 is left out (its prompt
    time is 8x *below* batch 32's, i.e. not the same measurement)."""
    groups: dict[tuple[str, int, int, int, int], list[tuple[float, float]]] = {}
    with path.open(encoding="utf-8") as f:
        for r in csv.DictReader(f):
            if (
                r["model"] != "llama2-70b"
                or r["hardware"] not in SPLITWISE_GPUS
                or int(r["batch_size"]) >= 64
            ):
                continue
            key = (
                r["hardware"],
                int(r["tensor_parallel"]),
                int(r["prompt_size"]),
                int(r["batch_size"]),
                int(r["token_size"]),
            )
            groups.setdefault(key, []).append((float(r["prompt_time"]) / 1e3, float(r["token_time"]) / 1e3))
    out: dict[str, tuple[list[Prefill], list[Decode]]] = {}
    for (hw, tp, prompt, batch, tokens), values in sorted(groups.items()):
        prefills, decodes = out.setdefault(SPLITWISE_GPUS[hw], ([], []))
        prompt_s, token_s = (float(np.mean(v)) for v in zip(*values, strict=True))
        prefills.append(Prefill("splitwise", "llama2-70b", tp, prompt, batch, prompt_s))
        decodes.append(Decode("splitwise", "llama2-70b", tp, batch, prompt + tokens / 2, token_s))
    return out


def distserve(path: Path) -> tuple[list[Prefill], list[Decode]]:
    profile = json.loads(path.read_text(encoding="utf-8"))
    prefills, decodes = [], []
    for model, tps in DISTSERVE_TP.items():
        for tp in tps:
            params = profile[model][tp]
            a, b, c = params["prefill"]
            for length in (256, 512, 1024, 2048):
                prefills.append(
                    Prefill("distserve", model, int(tp), length, 1, (a + b * length + c * length**2) / 1e3)
                )
            for batch in (1, 2, 4, 8, 16, 32, 64):
                a, b, c = params[
                    "decoding_smallbs"
                    if batch < params["decoding_large_small_bs_threshold"]
                    else "decoding_largebs"
                ]
                context = 1024
                decodes.append(
                    Decode(
                        "distserve",
                        model,
                        int(tp),
                        batch,
                        context,
                        (a + b * batch * context + c * batch) / 1e3,
                    )
                )
    return prefills, decodes


def dynamo_h200(directory: Path) -> tuple[list[Prefill], list[Decode]]:
    pre = np.load(directory / "selected_prefill_interpolation" / "raw_data.npz")
    dec = np.load(directory / "selected_decode_interpolation" / "raw_data.npz")
    prefills = [
        Prefill("dynamo", "llama-3.1-8b-fp8", 1, float(isl), 1, float(ms) / 1e3)
        for isl, ms in zip(pre["prefill_isl"], pre["prefill_ttft"], strict=True)
    ]
    kv_tokens = dec["x_kv_usage"] * float(dec["max_kv_tokens"][0])
    decodes = [
        Decode("dynamo", "llama-3.1-8b-fp8", 1, max(1.0, float(kv / ctx)), float(ctx), float(ms) / 1e3)
        for kv, ctx, ms in zip(kv_tokens, dec["y_context_length"], dec["z_itl"], strict=True)
    ]
    return prefills, decodes


def default_dynamo_profile() -> Path | None:
    spec = find_spec("dynamo")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = (
        Path(next(iter(spec.submodule_search_locations)))
        / "planner/tests/data/profiling_results/H200_TP1P_TP1D"
    )
    return path if path.is_dir() else None


def for_weights(gpu: GpuSpec, model: str) -> GpuSpec:
    """FP8 weights run on the FP8 tensor cores: twice the dense BF16 peak (H100/H200 datasheets)."""
    return replace(gpu, peak_flops=gpu.peak_flops * 2) if MODELS[model].weight_bytes == 1.0 else gpu


def predicted_prefill(p: Prefill, gpu: GpuSpec) -> float:
    return p.prompts * float(prefill_seconds(MODELS[p.model], for_weights(gpu, p.model), p.tokens, p.gpus))


def predicted_decode(d: Decode, gpu: GpuSpec, overhead: float) -> float:
    model, hardware = MODELS[d.model], for_weights(gpu, d.model)
    return float(
        decode_step_seconds(model, hardware, d.batch, d.context, gpus=d.gpus, step_overhead=overhead)
    )


def smallest_tensor_parallel(points: list[Point]) -> list[Point]:
    """Each (source, model)'s smallest TP only: the roofline divides by the GPU count exactly, so an
    efficiency fitted across TP sizes would blend in the all-reduce losses of the larger ones."""
    smallest: dict[tuple[str, str], int] = {}
    for x in points:
        smallest[x.source, x.model] = min(x.gpus, smallest.get((x.source, x.model), x.gpus))
    return [x for x in points if x.gpus == smallest[x.source, x.model]]


@dataclass(frozen=True)
class Fit:
    mfu: float
    mbu: float
    step_overhead_s: float


def fit(gpu: GpuSpec, prefills: list[Prefill], decodes: list[Decode]) -> Fit:
    # MFU: relative least squares of t = k/mfu over the long prompts (k = time at MFU 1).
    long = [p for p in prefills if p.tokens * p.prompts >= 1024]
    k = np.asarray([predicted_prefill(p, replace(gpu, mfu=1.0)) for p in long])
    t = np.asarray([p.seconds for p in long])
    mfu = float(np.sum((k / t) ** 2) / np.sum(k / t))
    # Decode: t = ovh + m/mbu, linear in (ovh, 1/mbu), relative weights, on memory-bound steps.
    memory = np.asarray(
        [
            (
                MODELS[d.model].weight_footprint_bytes
                + d.batch * d.context * MODELS[d.model].kv_bytes_per_token
            )
            / (d.gpus * gpu.hbm_bandwidth)
            for d in decodes
        ]
    )
    compute = np.asarray(
        [
            2
            * MODELS[d.model].compute_params
            * d.batch
            / (d.gpus * for_weights(gpu, d.model).peak_flops * mfu)
            for d in decodes
        ]
    )
    bound = memory >= compute * 0.999
    t = np.asarray([d.seconds for d in decodes])
    a = np.column_stack([np.ones(bound.sum()), memory[bound]]) / t[bound, None]
    (overhead, inverse), *_ = np.linalg.lstsq(a, np.ones(bound.sum()), rcond=None)
    overhead = max(0.0, float(overhead))
    if overhead == 0.0:
        inverse = float(np.sum(memory[bound] / t[bound]) / np.sum((memory[bound] / t[bound]) ** 2))
    return Fit(mfu=min(1.0, mfu), mbu=min(1.0, 1.0 / float(inverse)), step_overhead_s=overhead)


def errors(
    gpu: GpuSpec, f: Fit, prefills: list[Prefill], decodes: list[Decode]
) -> tuple[np.ndarray, np.ndarray]:
    tuned = replace(gpu, mfu=f.mfu, mbu=f.mbu)
    pre = np.asarray([predicted_prefill(p, tuned) / p.seconds - 1 for p in prefills])
    dec = np.asarray([predicted_decode(d, tuned, f.step_overhead_s) / d.seconds - 1 for d in decodes])
    return pre, dec


def describe(errs: np.ndarray) -> str:
    return f"median {np.median(np.abs(errs)):.1%}, max {np.max(np.abs(errs)):.1%} ({len(errs)} points)"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--splitwise", type=Path, help="splitwise-sim data/perf_model.csv")
    parser.add_argument("--distserve", type=Path, help="DistServe profiler-a100-80g.distserve.json")
    parser.add_argument(
        "--dynamo-profile", type=Path, default=default_dynamo_profile(), help="H200_TP1P_TP1D dir"
    )
    parser.add_argument("--all-tp", action="store_true", help="fit every TP size, not only the smallest")
    args = parser.parse_args()
    data: dict[str, tuple[list[Prefill], list[Decode]]] = {}
    if args.splitwise:
        for gpu, (pre, dec) in splitwise(args.splitwise).items():
            data.setdefault(gpu, ([], []))[0].extend(pre)
            data[gpu][1].extend(dec)
    if args.distserve:
        pre, dec = distserve(args.distserve)
        data.setdefault("a100-80g", ([], []))[0].extend(pre)
        data["a100-80g"][1].extend(dec)
    if args.dynamo_profile:
        data["h200"] = dynamo_h200(args.dynamo_profile)
    if not data:
        parser.error("no source given (--splitwise, --distserve, --dynamo-profile)")
    print(
        "| GPU preset | sources | MFU | MBU | step overhead ms | prefill error (fit) | decode error (fit) | prefill error (old 0.4/1.0/0) | decode error (old) |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for name, (all_pre, all_dec) in data.items():
        gpu = DATASHEET_GPUS[name]
        pre = all_pre if args.all_tp else smallest_tensor_parallel(all_pre)
        dec = all_dec if args.all_tp else smallest_tensor_parallel(all_dec)
        f = fit(gpu, pre, dec)
        fit_pre, fit_dec = errors(gpu, f, pre, dec)
        old_pre, old_dec = errors(gpu, Fit(*OLD_DEFAULTS), pre, dec)
        sources = ", ".join(sorted({p.source for p in pre}))
        print(
            f"| {name} | {sources} | {f.mfu:.3f} | {f.mbu:.3f} | {f.step_overhead_s * 1e3:.1f} | "
            f"{describe(fit_pre)} | {describe(fit_dec)} | {describe(old_pre)} | {describe(old_dec)} |"
        )
        for source in sorted({p.source for p in pre}):
            sub_pre = [p for p in pre if p.source == source]
            sub_dec = [d for d in dec if d.source == source]
            sp, sd = errors(gpu, f, sub_pre, sub_dec)
            print(f"|   {name} on {source} only | | | | | {describe(sp)} | {describe(sd)} | | |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
