"""`xpyd plan`'s output: the single plan's table, the sweep's table and the JSON objects."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from xpyd_controller.cli.plan.arguments import PlanInputs
from xpyd_controller.cli.plan.sizing import SweepResult
from xpyd_controller.model.explain import explain, format_bytes, format_seconds, value_at
from xpyd_controller.model.presets import GPU_CALIBRATION, GPU_PRESETS
from xpyd_controller.model.sizing import Plan
from xpyd_controller.model.specs import GpuSpec

if TYPE_CHECKING:
    from xpyd_controller.model.roofline import Numeric


def scenario_json(plan: Plan, index: int | tuple[int, ...], link_name: str) -> dict[str, object]:
    words = explain(plan, index, link_name=link_name)
    return {
        **plan.as_dict(index),
        "binding": list(words.binding),
        "infeasible": list(words.infeasible),
        "notes": list(words.notes),
    }


def at_input(value: Numeric) -> str:
    return f"{float(np.asarray(value)):g}"


def _header(inputs: PlanInputs) -> list[str]:
    gpu, link, model = inputs.gpu, inputs.link, inputs.model
    return [
        f"model     {inputs.model_name}: {model.params / 1e9:.4g}B params, KV {format_bytes(model.kv_bytes_per_token)}/token",
        f"hardware  {inputs.gpu_name}: {gpu.peak_flops / 1e12:.4g} TFLOP/s × MFU {gpu.mfu:g}, "
        f"{format_bytes(gpu.hbm_bandwidth)}/s × MBU {gpu.mbu:g}, {format_bytes(gpu.hbm_bytes)} HBM; "
        f"KV link {inputs.link_name}: {format_bytes(link.bandwidth)}/s + {format_seconds(link.overhead)}",
        f"sources   {efficiency_source(inputs.gpu_name, gpu)}",
    ]


def efficiency_source(gpu_name: str, gpu: GpuSpec) -> str:
    """Where the MFU and MBU in use come from: given flags, the calibrated preset, or the seeds' defaults."""
    preset = gpu_name.removesuffix(" (modified)")
    base = GPU_PRESETS.get(preset)
    fit = GPU_CALIBRATION.get(preset)
    if base is None or (gpu.mfu, gpu.mbu) != (base.mfu, base.mbu):
        used = "MFU/MBU as given"
    elif fit is None:
        return f"MFU/MBU: the seeds' defaults, no measured profile for {preset} (peaks: NVIDIA datasheet)"
    else:
        used = "MFU/MBU calibrated"
    if fit is None:
        return f"{used}; no measured profile for {preset} (peaks: NVIDIA datasheet)"
    return (
        f"{used}; {preset}'s measured profiles fit MFU {fit.mfu:g}, MBU {fit.mbu:g}, step overhead "
        f"{format_seconds(fit.step_overhead_s)} ({fit.source}; median error prefill {fit.prefill_error:.0%}, "
        f"decode {fit.decode_error:.0%}; docs/capacity-model.md, Calibration)"
    )


def render_table(plan: Plan, inputs: PlanInputs) -> str:
    """The single-scenario report: sizes, predictions, binding constraint and infeasibilities in words."""
    words = explain(plan, link_name=inputs.link_name)

    def at(name: str) -> float:
        return value_at(plan, name)

    def seconds(name: str) -> str:
        return format_seconds(at(name))

    def text(name: str) -> str:
        return str(np.asarray(getattr(plan, name))[()]).replace("_", " ")

    ttft_kind = "mean" if inputs.slo.ttft_quantile is None else f"p{inputs.slo.ttft_quantile * 100:g}"
    threshold = at("local_prefill_threshold_tokens")
    rows = [
        (
            "prefill instances",
            f"{at('prefill_instances'):g} × {at('prefill_gpus'):g} GPU",
            text("prefill_binding"),
        ),
        (
            "decode instances",
            f"{at('decode_instances'):g} × {at('decode_gpus'):g} GPU",
            f"batch cap {at('decode_batch_cap'):g}, bound: {text('decode_batch_bound')}",
        ),
        ("total GPUs", f"{at('total_gpus'):g}", f"D/P (article formula) {at('decode_prefill_ratio'):.2f}"),
        (
            "prefill, mean prompt",
            seconds("prefill_seconds"),
            f"attention factor {at('attention_factor'):.3f}",
        ),
        (
            f"TTFT ({ttft_kind}, queued)",
            seconds("predicted_ttft_seconds"),
            f"SLO {seconds('ttft_slo_seconds')}",
        ),
        (
            "decode step (TPOT)",
            seconds("decode_step_seconds"),
            f"SLO {seconds('tpot_slo_seconds')}, floor {seconds('tpot_floor_seconds')}",
        ),
        (
            "concurrency",
            f"{at('concurrency'):.4g}",
            "sessions: λ·(TTFT + L_out·TPOT), decode-first"
            if plan.request_flow == "decode_first"
            else "sessions: λ·L_out·TPOT, prefill-first",
        ),
        (
            "KV transfer (serialized)",
            seconds("transfer_seconds"),
            f"{format_bytes(at('transfer_bytes'))} at {format_bytes(inputs.link.bandwidth)}/s",
        ),
        (
            "KV transfer exposed",
            seconds("exposed_transfer_seconds"),
            f"budget {seconds('transfer_budget_seconds')}: "
            + ("feasible" if at("transfer_feasible") else "INFEASIBLE")
            + (
                ", layer-wise overlap " + ("holds" if at("overlap_feasible") else "fails")
                if plan.layerwise_transfer
                else ", no layer-wise pipelining"
            ),
        ),
        (
            "kv_max (serialized)",
            f"{format_bytes(at('kv_max_bytes_per_token'))}/token",
            f"largest kv/token whose whole transfer fits {seconds('transfer_budget_seconds')}",
        ),
        (
            "link demand λ·L·kv",
            f"{format_bytes(at('link_demand_bytes_per_second'))}/s",
            f"capacity {format_bytes(at('link_capacity_bytes_per_second'))}/s: "
            + ("feasible" if at("link_feasible") else "INFEASIBLE (bandwidth cannot be hidden)"),
        ),
        ("local prefill below", f"{threshold:.0f} tokens" if np.isfinite(threshold) else "never", "L_thresh"),
    ]
    workload = inputs.workload
    lines = [
        *_header(inputs),
        f"workload  {at_input(workload.rate)} req/s, ISL {at_input(workload.isl)}, OSL {at_input(workload.osl)}, "
        f"hit rate {at_input(workload.hit_rate)}",
        "",
    ]
    lines += [f"  {label:<24} {value:>16}   {detail}" for label, value, detail in rows]
    lines += ["", "binding:", *(f"  {text}" for text in words.binding)]
    if words.infeasible:
        lines += ["INFEASIBLE:", *(f"  {text}" for text in words.infeasible)]
    lines += ["notes:", *(f"  {text}" for text in words.notes)]
    return "\n".join(lines)


def render_sweep(sweep: SweepResult, inputs: PlanInputs) -> str:
    """One row per swept value; an invalid or infeasible point is a row that says why."""
    ttft_kind = "mean" if inputs.slo.ttft_quantile is None else f"p{inputs.slo.ttft_quantile * 100:g}"
    lines = [*_header(inputs), ""]
    ttft_title = f"TTFT {ttft_kind}"
    lines.append(
        f"{sweep.flag:>12} {'prefill':>8} {'decode':>7} {'GPUs':>6} {'batch cap':>9}  {'bound':<15} "
        f"{ttft_title:>10}  feasible"
    )
    for i, value in enumerate(sweep.values):
        if i in sweep.invalid:
            lines.append(
                f"{value:>12g} {'-':>8} {'-':>7} {'-':>6} {'-':>9}  {'-':<15} {'-':>10}  invalid: {sweep.invalid[i]}"
            )
            continue
        j = sweep.plan_index[i]
        row = sweep.plan.as_dict(j)
        ttft = row["predicted_ttft_seconds"]
        feasible = (
            "yes"
            if row["feasible"]
            else "no: " + "; ".join(explain(sweep.plan, j, link_name=inputs.link_name).infeasible)
        )
        lines.append(
            f"{value:>12g} {row['prefill_instances']:>8} {row['decode_instances']:>7} {row['total_gpus']:>6g} "
            f"{row['decode_batch_cap']:>9}  {row['decode_batch_bound']!s:<15} "
            f"{format_seconds(float(ttft)) if isinstance(ttft, float) else 'unbounded':>10}  {feasible}"
        )
    return "\n".join(lines)
