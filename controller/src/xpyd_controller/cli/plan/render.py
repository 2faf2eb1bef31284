"""`xpyd plan`'s output: the single plan's table, the sweep's table and the JSON objects.

Every output says how the pools were sized (`--sizing` and the TTFT quantile) and where the MFU, MBU
and step overhead in use came from: a flag, the GPU preset's calibration, or the default.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from xpyd_controller.cli.plan.arguments import PlanInputs, flag_of
from xpyd_controller.cli.plan.sizing import SweepResult
from xpyd_controller.model.explain import explain, format_bytes, format_seconds, value_at
from xpyd_controller.model.presets import GPU_CALIBRATION
from xpyd_controller.model.resolve import AssumptionSource
from xpyd_controller.model.sizing import Plan

if TYPE_CHECKING:
    from xpyd_controller.model.roofline import Numeric

Index = int | tuple[int, ...]
# `AssumptionSource` in the command line's terms (JSON values of `mfu_source`, `mbu_source`, ...).
SOURCE_NAMES: dict[AssumptionSource, str] = {
    "given": "flag",
    "calibration": "calibration",
    "default": "default",
}
# The peak each efficiency is calibrated against: giving it sets the efficiency back to its default.
PEAK_OF = {"mfu": "peak_flops", "mbu": "hbm_bandwidth", "step_overhead": "hbm_bandwidth"}


def _at(value: Numeric, index: Index) -> float:
    """One point's value of an input that is a number, or an array over a sweep's points."""
    array = np.asarray(value, np.float64)
    return float(array if array.ndim == 0 else array[index])


def assumptions_json(inputs: PlanInputs, index: Index = ()) -> dict[str, object]:
    """The sizing rule, its TTFT quantile, and each efficiency in use with its source."""
    used = inputs.assumptions
    fit = used.calibration
    return {
        "sizing": inputs.sizing,
        "ttft_quantile": inputs.slo.ttft_quantile,
        "mfu": used.gpu.mfu,
        "mfu_source": SOURCE_NAMES[used.mfu_source],
        "mbu": used.gpu.mbu,
        "mbu_source": SOURCE_NAMES[used.mbu_source],
        "step_overhead_seconds": _at(inputs.pools.step_overhead, index),
        "step_overhead_source": SOURCE_NAMES[used.step_overhead_source],
        "calibration_source": None if fit is None else fit.source,
    }


def scenario_json(plan: Plan, index: Index, inputs: PlanInputs) -> dict[str, object]:
    """One scenario as the JSON object `--json` prints (docs/cli.md lists its keys)."""
    words = explain(plan, index, link_name=inputs.link_name)
    return {
        **assumptions_json(inputs, index),
        **plan.as_dict(index),
        "binding": list(words.binding),
        "infeasible": list(words.infeasible),
        "notes": list(words.notes),
    }


def at_input(value: Numeric) -> str:
    return f"{float(np.asarray(value)):g}"


def ttft_statistic(inputs: PlanInputs) -> str:
    quantile = inputs.slo.ttft_quantile
    return "mean" if quantile is None else f"p{quantile * 100:g}"


def _source_words(name: str, source: AssumptionSource, inputs: PlanInputs) -> str:
    preset = inputs.gpu_name.removesuffix(" (modified)")
    if source == "given":
        return flag_of(name)
    if source == "calibration":
        return f"{preset} calibration"
    if preset in GPU_CALIBRATION:
        return f"default: {flag_of(PEAK_OF[name])} given"
    return f"default: no measured profile for {preset}"


def _assumption_lines(inputs: PlanInputs) -> list[str]:
    used = inputs.assumptions
    overhead = np.asarray(inputs.pools.step_overhead)
    overhead_text = "swept" if overhead.ndim else format_seconds(float(overhead))
    lines = [
        f"assumed   MFU {used.gpu.mfu:g} ({_source_words('mfu', used.mfu_source, inputs)}), "
        f"MBU {used.gpu.mbu:g} ({_source_words('mbu', used.mbu_source, inputs)}), step overhead "
        f"{overhead_text} ({_source_words('step_overhead', used.step_overhead_source, inputs)})"
    ]
    fit = used.calibration
    if fit is not None:
        lines.append(
            f"          calibration: {fit.source}; median error prefill {fit.prefill_error:.0%}, decode "
            f"{fit.decode_error:.0%} (docs/capacity-model.md, Calibration)"
        )
    return lines


def _sizing_line(inputs: PlanInputs) -> str:
    if inputs.sizing == "throughput":
        return (
            "sizing    the seeds' formulas: prefill ⌈λ·E[S]⌉, decode ⌈C/B_cap⌉; TTFT shown is the mean with "
            "queueing (--sizing throughput)"
        )
    return (
        f"sizing    each pool the smallest that meets its SLO: TTFT {ttft_statistic(inputs)} with queueing, "
        "TPOT and KV capacity bound the decode batch (--sizing slo)"
    )


def _header(inputs: PlanInputs) -> list[str]:
    gpu, link, model = inputs.gpu, inputs.link, inputs.model
    return [
        f"model     {inputs.model_name}: {model.params / 1e9:.4g}B params, KV {format_bytes(model.kv_bytes_per_token)}/token",
        f"hardware  {inputs.gpu_name}: {gpu.peak_flops / 1e12:.4g} TFLOP/s × MFU {gpu.mfu:g}, "
        f"{format_bytes(gpu.hbm_bandwidth)}/s × MBU {gpu.mbu:g}, {format_bytes(gpu.hbm_bytes)} HBM; "
        f"KV link {inputs.link_name}: {format_bytes(link.bandwidth)}/s + {format_seconds(link.overhead)}",
        *_assumption_lines(inputs),
        _sizing_line(inputs),
    ]


def _prefill_detail(plan: Plan, inputs: PlanInputs, index: Index = ()) -> str:
    """What set the prefill pool, beside the seeds' throughput floor."""
    floor = int(value_at(plan, "prefill_throughput_instances", index))
    if inputs.sizing == "throughput":
        return "throughput (the seeds' formula)"
    if str(np.asarray(plan.prefill_binding)[index]) == "ttft_quantile":
        return f"TTFT {ttft_statistic(inputs)} with queueing; throughput floor {floor}"
    return f"throughput floor {floor}, which meets TTFT {ttft_statistic(inputs)}"


def verdict_heading(plan: Plan, index: Index = ()) -> str:
    """How the table heads a plan's unmet constraints: no pool size meets them, or this size misses."""
    if bool(np.asarray(plan.slo_attainable)[index]):
        return "SLO MISSED at this size (the default --sizing slo sizes prefill to meet it):"
    return "INFEASIBLE (no pool size meets it):"


def render_table(plan: Plan, inputs: PlanInputs) -> str:
    """The single-scenario report: sizes, predictions, binding constraint and infeasibilities in words."""
    words = explain(plan, link_name=inputs.link_name)

    def at(name: str) -> float:
        return value_at(plan, name)

    def seconds(name: str) -> str:
        return format_seconds(at(name))

    def text(name: str) -> str:
        return str(np.asarray(getattr(plan, name))[()]).replace("_", " ")

    ttft_kind = ttft_statistic(inputs)
    threshold = at("local_prefill_threshold_tokens")
    rows = [
        (
            "prefill instances",
            f"{at('prefill_instances'):g} × {at('prefill_gpus'):g} GPU",
            _prefill_detail(plan, inputs),
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
        lines += [verdict_heading(plan), *(f"  {text}" for text in words.infeasible)]
    lines += ["notes:", *(f"  {text}" for text in words.notes)]
    return "\n".join(lines)


def render_sweep(sweep: SweepResult, inputs: PlanInputs) -> str:
    """One row per swept value; an invalid or infeasible point is a row that says why."""
    lines = [*_header(inputs), ""]
    ttft_title = f"TTFT {ttft_statistic(inputs)}"
    lines.append(
        f"{sweep.flag:>12} {'prefill':>8} {'(floor)':>7} {'decode':>7} {'GPUs':>6} {'D/P':>5} {'batch cap':>9}  "
        f"{'bound':<15} {ttft_title:>10}  feasible"
    )
    for i, value in enumerate(sweep.values):
        if i in sweep.invalid:
            dashes = f"{'-':>8} {'-':>7} {'-':>7} {'-':>6} {'-':>5} {'-':>9}  {'-':<15} {'-':>10}"
            lines.append(f"{value:>12g} {dashes}  invalid: {sweep.invalid[i]}")
            continue
        j = sweep.plan_index[i]
        row = sweep.plan.as_dict(j)
        ttft = row["predicted_ttft_seconds"]
        lines.append(
            f"{value:>12g} {row['prefill_instances']:>8} {row['prefill_throughput_instances']:>7} "
            f"{row['decode_instances']:>7} {row['total_gpus']:>6g} {row['decode_prefill_ratio']:>5.2f} "
            f"{row['decode_batch_cap']:>9}  {row['decode_batch_bound']!s:<15} "
            f"{format_seconds(float(ttft)) if isinstance(ttft, float) else 'unbounded':>10}  "
            f"{_sweep_verdict(sweep.plan, j, inputs)}"
        )
    return "\n".join(lines)


def _sweep_verdict(plan: Plan, index: int, inputs: PlanInputs) -> str:
    """`yes`; `missed: ...` where a larger prefill pool meets the SLO; `no: ...` where no pool size does."""
    if bool(np.asarray(plan.feasible)[index]):
        return "yes"
    reasons = "; ".join(explain(plan, index, link_name=inputs.link_name).infeasible)
    return ("missed: " if bool(np.asarray(plan.slo_attainable)[index]) else "no: ") + reasons
