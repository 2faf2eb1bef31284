"""`xpyd plan`: size the prefill and decode pools for a model, GPU, link, workload and SLOs.

A thin edge over `xpyd_controller.model`: parse flags once into specs, call the vectorised
`size_pools`, print a table (or JSON) and optionally a plot. The flags are DESIGN.md's fixed contract.
Exit codes: 0 = a plan (every point of a sweep is reported, feasible or not); 1 = a single plan that
is infeasible (the reasons are printed); 2 = invalid input, including an SLO below its physical floor.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from xpyd_api.errors import InputError
from xpyd_controller.model.explain import explain, format_bytes, format_seconds, value_at
from xpyd_controller.model.presets import GPU_CALIBRATION, GPU_PRESETS, LINK_PRESETS, MODEL_PRESETS
from xpyd_controller.model.resolve import PresetError, resolve_gpu, resolve_link, resolve_model
from xpyd_controller.model.sizing import Plan, PoolConfig, Slo, Workload, size_pools
from xpyd_controller.model.specs import GpuSpec, LinkSpec, ModelSpec, SpecError

# Spec fields whose flag is not simply the field name with dashes.
FLAG_OF_FIELD = {
    "ttft": "--ttft-slo",
    "tpot": "--tpot-slo",
    "bandwidth": "--link-bandwidth",
    "overhead": "--link-overhead",
}
# Quantities `--sweep NAME=...` can vary (they are arrays in the sizing API).
SWEEPABLE = (
    "rate",
    "isl",
    "osl",
    "hit-rate",
    "isl-std",
    "osl-std",
    "ttft-slo",
    "tpot-slo",
    "transfer-budget",
    "prefill-gpus",
    "decode-gpus",
    "step-overhead",
    "remote-overhead",
)
MAX_SWEEP_POINTS = 10_000_000
MODEL_FLAGS = (
    "params",
    "layers",
    "kv_heads",
    "head_dim",
    "hidden_size",
    "kv_bytes",
    "weight_bytes",
    "kv_latent_dim",
    "rope_dim",
    "active_params",
)

if TYPE_CHECKING:
    from xpyd_controller.model.roofline import FloatArray, Numeric
GPU_FLAGS = ("peak_flops", "hbm_bandwidth", "hbm_bytes", "mfu", "mbu")


def flag_of(field: str) -> str:
    return FLAG_OF_FIELD.get(field, "--" + field.replace("_", "-"))


class PlanInputError(InputError):
    """Bad command-line input: the flag, its value and the rule, worded for the user."""


def register(subparsers: Any, help_text: str) -> None:
    parser = subparsers.add_parser(
        "plan",
        help=help_text,
        description=(
            "How many prefill and decode instances does this traffic need, which constraint sets each,\n"
            "and is the KV transfer feasible? All numbers are SI (seconds, bytes, bytes/s, FLOP/s);\n"
            "presets fill defaults and explicit flags override them.\n\n"
            "example:\n"
            "  xpyd plan --model llama-3.1-70b --gpu h100-sxm --link ib-400g --prefill-gpus 2 \\\n"
            "            --decode-gpus 2 --rate 4 --isl 8000 --osl 256 --ttft-slo 2 --tpot-slo 0.05\n\n"
            "exit codes: 0 plan printed, 1 single plan infeasible, 2 invalid input or SLO below its floor"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    model = parser.add_argument_group("model")
    model.add_argument("--model", choices=sorted(MODEL_PRESETS), help="model preset")
    model.add_argument("--params", type=float, help="parameter count (total, for MoE)")
    model.add_argument("--active-params", type=float, help="parameters active per token (MoE)")
    model.add_argument("--layers", type=int, help="transformer layers")
    model.add_argument("--kv-heads", type=int, help="KV heads (GQA)")
    model.add_argument("--head-dim", type=int, help="head dimension")
    model.add_argument("--hidden-size", type=int, help="d_model, for the attention factor 1 + L/L*")
    model.add_argument("--kv-bytes", type=float, help="bytes per KV element (2 = bf16)")
    model.add_argument("--weight-bytes", type=float, help="bytes per parameter (2 = bf16)")
    model.add_argument("--kv-latent-dim", type=int, help="MLA latent dim (with --rope-dim)")
    model.add_argument("--rope-dim", type=int, help="MLA decoupled RoPE dim (with --kv-latent-dim)")
    gpu = parser.add_argument_group("GPU (per GPU)")
    gpu.add_argument("--gpu", choices=sorted(GPU_PRESETS), default="h100-sxm", help="GPU preset (h100-sxm)")
    gpu.add_argument("--peak-flops", type=float, help="dense peak FLOP/s")
    gpu.add_argument("--mfu", type=float, help="achieved fraction of peak FLOP/s (the preset's calibrated)")
    gpu.add_argument("--hbm-bandwidth", type=float, help="HBM bytes/s")
    gpu.add_argument("--mbu", type=float, help="achieved fraction of HBM bandwidth (the preset's calibrated)")
    gpu.add_argument("--hbm-bytes", type=float, help="HBM capacity, bytes")
    link = parser.add_argument_group("KV link")
    link.add_argument("--link", choices=sorted(LINK_PRESETS), default="ib-400g", help="link preset (ib-400g)")
    link.add_argument("--link-bandwidth", type=float, help="bytes/s one request's KV transfer gets")
    link.add_argument("--link-overhead", type=float, help="fixed seconds per transfer (0)")
    traffic = parser.add_argument_group("workload")
    traffic.add_argument("--rate", type=float, required=True, help="arrivals, requests/s")
    traffic.add_argument("--isl", type=float, required=True, help="mean input tokens")
    traffic.add_argument("--osl", type=float, required=True, help="mean output tokens")
    traffic.add_argument("--hit-rate", type=float, default=0.0, help="prefix-cache hit rate in [0, 1) (0)")
    traffic.add_argument("--isl-std", type=float, default=0.0, help="input length std dev, tokens (0)")
    traffic.add_argument("--osl-std", type=float, default=0.0, help="output length std dev, tokens (0)")
    slo = parser.add_argument_group("SLO")
    slo.add_argument("--ttft-slo", type=float, default=2.0, help="time to first token, s (2)")
    slo.add_argument("--tpot-slo", type=float, default=0.05, help="time per output token, s (0.05)")
    slo.add_argument(
        "--transfer-budget", type=float, help="seconds of TTFT allowed for KV transfer (TTFT SLO)"
    )
    slo.add_argument(
        "--ttft-quantile",
        type=float,
        help="size prefill so this TTFT quantile (e.g. 0.9) meets the SLO with queueing",
    )
    slo.add_argument(
        "--context-quantile", type=float, help="size the decode batch so its KV fits with this probability"
    )
    pools = parser.add_argument_group("pools")
    pools.add_argument("--prefill-gpus", type=float, default=1, help="GPUs per prefill instance (1)")
    pools.add_argument("--decode-gpus", type=float, default=1, help="GPUs per decode instance (1)")
    pools.add_argument(
        "--step-overhead",
        type=float,
        help="fixed seconds per decode step (the GPU preset's calibrated, else 0)",
    )
    pools.add_argument(
        "--request-flow",
        choices=("decode-first", "prefill-first"),
        default="decode-first",
        help="when decode starts holding a request's KV: on arrival, before the remote prefill (decode-first:"
        " Dynamo, SGLang; session TTFT + L_out·TPOT) or on admission after prefill and KV transfer"
        " (prefill-first: vLLM's router and disagg proxy; session L_out·TPOT) (decode-first)",
    )
    pools.add_argument(
        "--no-layerwise-transfer",
        dest="layerwise_transfer",
        action="store_false",
        help="plan without layer-wise pipelining: the whole serialized KV transfer is on the TTFT path",
    )
    pools.add_argument(
        "--remote-overhead",
        type=float,
        default=0.0,
        help="fixed seconds of a remote prefill, for L_thresh (0)",
    )
    output = parser.add_argument_group("output")
    output.add_argument("--json", action="store_true", help="print one JSON object")
    output.add_argument(
        "--sweep",
        metavar="NAME=START:STOP[:STEP]|V1,V2,...",
        help=f"vary one quantity (inclusive range, step 1 by default): {', '.join(SWEEPABLE)}",
    )
    output.add_argument(
        "--plot", metavar="FILE.png", help="plot x, y against rate and the KV-transfer feasible region"
    )
    parser.set_defaults(func=run)


@dataclasses.dataclass(frozen=True)
class PlanInputs:
    """Everything `size_pools` takes, plus the names the output shows."""

    model: ModelSpec
    gpu: GpuSpec
    link: LinkSpec
    workload: Workload
    slo: Slo
    pools: PoolConfig
    model_name: str
    gpu_name: str
    link_name: str


def _overrides(args: argparse.Namespace, names: tuple[str, ...]) -> dict[str, Any]:
    return {name: getattr(args, name) for name in names if getattr(args, name) is not None}


def build_model(args: argparse.Namespace) -> ModelSpec:
    try:
        return resolve_model(args.model, _overrides(args, MODEL_FLAGS), "--model", flag_of)
    except PresetError as error:
        raise PlanInputError(error.field, error.value, error.rule, message=str(error)) from None


def spec_error_words(error: SpecError) -> str:
    """A SpecError in the command line's terms: every field it names (in the rule too) as its flag."""
    known = {*MODEL_FLAGS, *GPU_FLAGS, *FLAG_OF_FIELD, "rate", "isl", "osl", "hit_rate", "isl_std", "osl_std"}
    known |= {"transfer_budget", "ttft_quantile", "context_quantile", "prefill_gpus", "decode_gpus"}
    known |= {"step_overhead", "remote_overhead", "request_flow"}
    rule = re.sub(r"\b[a-z]+(?:_[a-z]+)*\b", lambda m: flag_of(m[0]) if m[0] in known else m[0], error.rule)
    value = "(not given)" if error.value is None else repr(error.value)
    return f"{flag_of(error.field)} {value}: {rule}"


def build_inputs(args: argparse.Namespace, sweep: dict[str, FloatArray] | None = None) -> PlanInputs:
    """Flags (and one swept quantity) → validated specs. Raises SpecError or PlanInputError."""
    values: dict[str, Numeric | None] = {key: getattr(args, key) for key in vars(args)}
    values.update(sweep or {})
    if values["step_overhead"] is None:
        fit = GPU_CALIBRATION.get(args.gpu)
        values["step_overhead"] = fit.step_overhead_s if fit else 0.0

    def number(name: str) -> Numeric:
        value = values[name]
        assert value is not None  # argparse defaults or required flags
        return value

    link = resolve_link(
        args.link,
        {"bandwidth": args.link_bandwidth, "overhead": args.link_overhead},
        "--link",
        {"bandwidth": "--link-bandwidth", "overhead": "--link-overhead"}.__getitem__,
    )
    custom_link = args.link_bandwidth is not None or args.link_overhead is not None
    return PlanInputs(
        model=build_model(args),
        gpu=resolve_gpu(args.gpu, _overrides(args, GPU_FLAGS), "--gpu", flag_of),
        link=link,
        workload=Workload(
            rate=number("rate"),
            isl=number("isl"),
            osl=number("osl"),
            hit_rate=number("hit_rate"),
            isl_std=number("isl_std"),
            osl_std=number("osl_std"),
        ),
        slo=Slo(
            ttft=number("ttft_slo"),
            tpot=number("tpot_slo"),
            transfer_budget=values["transfer_budget"],
            ttft_quantile=args.ttft_quantile,
            context_quantile=args.context_quantile,
        ),
        pools=PoolConfig(
            prefill_gpus=number("prefill_gpus"),
            decode_gpus=number("decode_gpus"),
            step_overhead=number("step_overhead"),
            remote_overhead=number("remote_overhead"),
            request_flow="prefill_first" if args.request_flow == "prefill-first" else "decode_first",
            layerwise_transfer=args.layerwise_transfer,
        ),
        model_name=(args.model or "custom model")
        + (" (modified)" if args.model and _overrides(args, MODEL_FLAGS) else ""),
        gpu_name=args.gpu + (" (modified)" if _overrides(args, GPU_FLAGS) else ""),
        link_name=args.link + (" (modified)" if custom_link else ""),
    )


def parse_sweep(text: str) -> tuple[str, FloatArray]:
    """`rate=1:64`, `rate=1:64:0.5` (inclusive) or `rate=1,2,4` → (argparse dest, values)."""
    name, sep, spec = text.partition("=")
    name = name.strip().replace("_", "-")
    if not sep or name not in SWEEPABLE:
        rule = f"expected NAME=START:STOP[:STEP] with NAME one of {', '.join(SWEEPABLE)}"
        raise PlanInputError("--sweep", text, rule, message=f"--sweep: {text!r}: {rule}")
    try:
        if ":" in spec:
            parts = [float(part) for part in spec.split(":")]
            if len(parts) not in (2, 3):
                raise ValueError
            start, stop, step = (*parts, 1.0) if len(parts) == 2 else parts
            if not (np.isfinite([start, stop, step]).all() and step > 0 and stop >= start):
                raise ValueError
            count = int(np.floor((stop - start) / step + 1e-9)) + 1
            if count > MAX_SWEEP_POINTS:
                rule = f"{count} points, at most {MAX_SWEEP_POINTS}"
                raise PlanInputError("--sweep", text, rule, message=f"--sweep: {text!r}: {rule}")
            values = start + step * np.arange(count, dtype=np.float64)
        else:
            values = np.array([float(part) for part in spec.split(",")], dtype=np.float64)
    except ValueError:
        rule = "values must be START:STOP[:STEP] with STOP >= START and STEP > 0, or V1,V2,..."
        raise PlanInputError("--sweep", text, rule, message=f"--sweep: {text!r}: {rule}") from None
    return name.replace("-", "_"), values


def physical_floor_errors(plan: Plan, inputs: PlanInputs) -> dict[int, str]:
    """SLOs no amount of GPUs can meet, by flat scenario index: the flag, the value and the floor."""
    errors: dict[int, str] = {}

    def flag(mask: npt.NDArray[np.bool_], message: Callable[[int], str]) -> None:
        for index in np.flatnonzero(np.broadcast_to(mask, np.shape(plan.prefill_instances))):
            errors.setdefault(int(index), message(int(index)))

    def flat(array: object, index: int) -> float:
        return float(np.ravel(np.broadcast_to(np.asarray(array), np.shape(plan.prefill_instances)))[index])

    decode_fits = np.asarray(plan.decode_weights_fit)
    flag(
        decode_fits & (plan.tpot_slo_seconds <= plan.tpot_floor_seconds),
        lambda i: (
            f"--tpot-slo {flat(plan.tpot_slo_seconds, i):g}: below the physical floor "
            f"{format_seconds(flat(plan.tpot_floor_seconds, i))} per decode step (step overhead + weight read W/β of "
            f"{format_bytes(inputs.model.weight_footprint_bytes)} at {format_bytes(inputs.gpu.effective_bandwidth)}/s per GPU)"
        ),
    )
    ttft_floor = plan.prefill_seconds + plan.exposed_transfer_seconds + plan.tpot_floor_seconds
    flag(
        np.asarray(plan.prefill_weights_fit) & (plan.ttft_slo_seconds <= ttft_floor),
        lambda i: (
            f"--ttft-slo {flat(plan.ttft_slo_seconds, i):g}: below the physical floor "
            f"{format_seconds(flat(ttft_floor, i))} (prefill of the mean prompt + exposed "
            "KV transfer + one decode step, before any queueing)"
        ),
    )
    flag(
        plan.transfer_budget_seconds <= inputs.link.overhead,
        lambda i: (
            f"--transfer-budget {flat(plan.transfer_budget_seconds, i):g}: at or below the "
            f"link's fixed overhead {format_seconds(inputs.link.overhead)}, so no transfer fits"
        ),
    )
    return errors


def _floor_error(message: str) -> PlanInputError:
    """A physical_floor_errors() message ("--flag value: rule") as the error carrying its three parts."""
    head, _, rule = message.partition(": ")
    flag, _, value = head.partition(" ")
    return PlanInputError(flag, value, rule, message=message)


def check_physical_floors(plan: Plan, inputs: PlanInputs) -> None:
    """An SLO no amount of GPUs can meet is an input error (a single plan stops there)."""
    errors = physical_floor_errors(plan, inputs)
    if errors:
        raise _floor_error(errors[min(errors)])


def _scenario_json(plan: Plan, index: int | tuple[int, ...], link_name: str) -> dict[str, object]:
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


@dataclasses.dataclass(frozen=True)
class SweepResult:
    """A sweep's plan over its valid points, and why each other point is invalid."""

    name: str  # argparse dest of the swept quantity
    values: FloatArray  # every swept value, in order
    plan: Plan  # over the valid values only
    inputs: PlanInputs
    plan_index: dict[int, int]  # swept position → index into `plan`
    invalid: dict[int, str]  # swept position → the input error, in words

    @property
    def flag(self) -> str:
        return self.name.replace("_", "-")


MAX_CHECKED_ONE_BY_ONE = 100_000  # points validated one at a time when the whole sweep is rejected


def _input_error_words(error: SpecError | PlanInputError) -> str:
    return spec_error_words(error) if isinstance(error, SpecError) else str(error)


def run_sweep(args: argparse.Namespace, name: str, values: FloatArray) -> SweepResult:
    """Size every swept point; a point the specs or the physical floors reject becomes a marked row.

    Raises the error when no point is valid (or the rejection is not about the swept value).
    """
    invalid: dict[int, str] = {}
    try:
        inputs = build_inputs(args, {name: values})
        valid = np.arange(values.size)
    except (SpecError, PlanInputError) as whole:
        if values.size > MAX_CHECKED_ONE_BY_ONE:
            raise
        for i in range(values.size):
            try:
                build_inputs(args, {name: values[i : i + 1]})
            except (SpecError, PlanInputError) as error:
                invalid[i] = _input_error_words(error)
        valid = np.array([i for i in range(values.size) if i not in invalid], dtype=np.int64)
        if valid.size == 0:
            raise whole from None
        inputs = build_inputs(args, {name: values[valid]})
    plan = size_pools(inputs.model, inputs.gpu, inputs.link, inputs.workload, inputs.slo, pools=inputs.pools)
    for j, message in physical_floor_errors(plan, inputs).items():
        invalid[int(valid[j])] = message
    if len(invalid) == values.size:
        raise _floor_error(invalid[0])
    return SweepResult(name, values, plan, inputs, {int(i): j for j, i in enumerate(valid)}, invalid)


# Colours keep their meaning across both panels and every plot xpyd draws.
PREFILL_COLOUR, DECODE_COLOUR, TOTAL_COLOUR, INFEASIBLE_COLOUR = "tab:blue", "tab:orange", "0.35", "tab:red"
LINK_COLOURS = {
    "nvlink": "tab:green",
    "ib-400g": "tab:purple",
    "roce-200g": "tab:brown",
    "pcie5": "tab:olive",
}


def _at_points(sweep: SweepResult, points: list[int]) -> tuple[Workload, Slo, PoolConfig]:
    """The sweep's workload, SLO and pools with the swept quantity at the given plan indices only."""
    index = np.asarray(points, dtype=np.int64)

    def pick(value: Any) -> Any:
        return np.asarray(value)[index] if np.ndim(value) == 1 else value

    inputs = sweep.inputs
    return tuple(  # type: ignore[return-value]
        dataclasses.replace(part, **{f.name: pick(getattr(part, f.name)) for f in dataclasses.fields(part)})
        for part in (inputs.workload, inputs.slo, inputs.pools)
    )


def _spread_labels(values: list[float], min_ratio: float) -> list[float]:
    """Label heights on a log axis, each at least `min_ratio` above the one below (no overlaps)."""
    placed: list[float] = []
    for value in sorted(values):
        placed.append(max(value, placed[-1] * min_ratio) if placed else value)
    order = sorted(range(len(values)), key=values.__getitem__)
    heights = [0.0] * len(values)
    for rank, index in enumerate(order):
        heights[index] = placed[rank]
    return heights


def plot(path: str, args: argparse.Namespace, inputs: PlanInputs, sweep: SweepResult | None) -> None:
    """Two panels: x and y against the swept quantity (or the rate); the KV-transfer feasible region."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if sweep is not None:
        shown = [i for i in sorted(sweep.plan_index) if i not in sweep.invalid]
        axis_values = sweep.values[shown]
        plan = size_pools(  # the valid points only, in swept order
            sweep.inputs.model,
            sweep.inputs.gpu,
            sweep.inputs.link,
            *_at_points(sweep, [sweep.plan_index[i] for i in shown])[:2],
            pools=_at_points(sweep, [sweep.plan_index[i] for i in shown])[2],
        )
        axis_label = f"{sweep.flag} (swept)"
    else:
        axis_values = np.linspace(0.0, max(2.0 * float(args.rate), 1.0), 129)
        plan = size_pools(
            inputs.model,
            inputs.gpu,
            inputs.link,
            dataclasses.replace(inputs.workload, rate=axis_values),
            inputs.slo,
            pools=inputs.pools,
        )
        axis_label = "arrival rate λ (requests/s)"
    figure, (pools_axis, region_axis) = plt.subplots(1, 2, figsize=(13, 5))
    pools_axis.step(
        axis_values, plan.prefill_instances, where="post", color=PREFILL_COLOUR, label="prefill instances x"
    )
    if inputs.slo.ttft_quantile is not None:
        pools_axis.step(
            axis_values,
            np.ceil(plan.prefill_load),
            where="post",
            linestyle="--",
            color=PREFILL_COLOUR,
            alpha=0.6,
            label="x by throughput alone (seed formula)",
        )
    pools_axis.step(
        axis_values, plan.decode_instances, where="post", color=DECODE_COLOUR, label="decode instances y"
    )
    gpus_axis = pools_axis.twinx()
    gpus_axis.step(
        axis_values, plan.total_gpus, where="post", linestyle=":", color=TOTAL_COLOUR, label="total GPUs"
    )
    gpus_axis.set_ylabel("GPUs (dotted)")
    gpus_axis.set_ylim(bottom=0)
    infeasible = ~np.asarray(plan.feasible)
    if infeasible.any():
        pools_axis.scatter(
            axis_values[infeasible],
            np.asarray(plan.prefill_instances)[infeasible],
            marker="x",
            color=INFEASIBLE_COLOUR,
            zorder=5,
            label="infeasible",
        )
    if sweep is not None and sweep.invalid:
        for i in sweep.invalid:
            pools_axis.axvline(sweep.values[i], color=INFEASIBLE_COLOUR, alpha=0.25, linewidth=3)
        pools_axis.plot([], [], color=INFEASIBLE_COLOUR, alpha=0.25, linewidth=3, label="invalid input")
    pools_axis.set_xlabel(axis_label)
    pools_axis.set_ylabel("instances")
    pools_axis.set_ylim(bottom=0)
    pools_axis.set_title(
        f"{inputs.model_name} on {inputs.gpu_name}: ISL {args.isl:g}, OSL {args.osl:g}", fontsize=10
    )
    pools_axis.grid(alpha=0.3)
    handles = [*pools_axis.get_legend_handles_labels()[0], *gpus_axis.get_legend_handles_labels()[0]]
    figure.legend(
        handles=handles, loc="lower left", bbox_to_anchor=(0.01, 0.0), ncol=3, fontsize=8, frameon=False
    )

    budget = float(np.asarray(plan.transfer_budget_seconds).flat[0])
    lengths = np.logspace(np.log10(512), np.log10(2**21), 200)
    links = {**LINK_PRESETS, inputs.link_name: inputs.link}
    for name, spec in links.items():
        colour = LINK_COLOURS.get(name, "black")
        kv_max = np.maximum(budget - spec.overhead, 0) * spec.bandwidth / lengths
        region_axis.loglog(lengths, kv_max, color=colour, label=f"kv_max on {name}")
        if spec is inputs.link:
            region_axis.fill_between(lengths, 1e3, kv_max, color=colour, alpha=0.12)
    names_by_kv: dict[float, list[str]] = {}
    for name, preset in MODEL_PRESETS.items():
        names_by_kv.setdefault(preset.kv_bytes_per_token, []).append(name)
    kvs = list(names_by_kv)
    for kv, height in zip(kvs, _spread_labels(kvs, 1.6), strict=True):  # spread so no two labels overlap
        region_axis.axhline(kv, color="grey", linewidth=0.6, linestyle="--")
        region_axis.annotate(
            ", ".join(names_by_kv[kv]),
            (lengths[-1], height),
            xytext=(4, 0),
            textcoords="offset points",
            fontsize=7,
            va="center",
            annotation_clip=False,
        )
    region_axis.scatter(
        [args.isl], [inputs.model.kv_bytes_per_token], color="black", zorder=5, label="this plan"
    )
    region_axis.set_ylim(1e3, 1e8)
    region_axis.set_xlabel("prompt length L (tokens)")
    region_axis.set_ylabel("KV bytes per token")
    region_axis.set_title(
        f"serialized transfer feasible (shaded): L·kv/BW ≤ {format_seconds(budget)}", fontsize=10
    )
    region_axis.grid(alpha=0.3, which="both")
    region_axis.legend(fontsize=7, loc="lower left")
    figure.tight_layout(rect=(0, 0.08, 0.93, 1))
    figure.savefig(path, dpi=110)
    plt.close(figure)


def run(args: argparse.Namespace) -> int:
    sweep: SweepResult | None = None
    try:
        if args.sweep:
            sweep = run_sweep(args, *parse_sweep(args.sweep))
            inputs, plan = sweep.inputs, sweep.plan
        else:
            inputs = build_inputs(args)
            plan = size_pools(
                inputs.model, inputs.gpu, inputs.link, inputs.workload, inputs.slo, pools=inputs.pools
            )
            check_physical_floors(plan, inputs)
    except SpecError as err:
        print(f"xpyd plan: error: {spec_error_words(err)}", file=sys.stderr)
        return 2
    except PlanInputError as err:
        print(f"xpyd plan: error: {err}", file=sys.stderr)
        return 2
    emit: Callable[[str], None] = print
    if sweep is None:
        row = _scenario_json(plan, (), inputs.link_name)
        emit(json.dumps(row, indent=2) if args.json else render_table(plan, inputs))
        status = 0 if row["feasible"] else 1
    else:
        if args.json:
            points = [
                {"invalid_input": sweep.invalid[i], "feasible": False}
                if i in sweep.invalid
                else {**_scenario_json(plan, sweep.plan_index[i], inputs.link_name), "invalid_input": None}
                for i in range(sweep.values.size)
            ]
            emit(
                json.dumps({"sweep": sweep.name, "values": sweep.values.tolist(), "plans": points}, indent=2)
            )
        else:
            emit(render_sweep(sweep, inputs))
        status = 0
    if args.plot:
        plot(args.plot, args, inputs, sweep)
    return status
