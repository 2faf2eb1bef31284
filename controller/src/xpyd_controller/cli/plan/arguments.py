"""`xpyd plan`'s flags: the parser, and the parse of its arguments into the capacity model's specs.

The flags are the fixed CLI contract (docs/cli.md); every error names the flag the user typed.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
from typing import TYPE_CHECKING, Any, Literal, get_args

import numpy as np

from xpyd_api.errors import InputError
from xpyd_controller.model.presets import GPU_PRESETS, LINK_PRESETS, MODEL_PRESETS
from xpyd_controller.model.resolve import (
    GpuAssumptions,
    PresetError,
    resolve_gpu_assumptions,
    resolve_link,
    resolve_model,
)
from xpyd_controller.model.sizing import DEFAULT_TTFT_QUANTILE, PoolConfig, Slo, Workload
from xpyd_controller.model.specs import GpuSpec, LinkSpec, ModelSpec, SpecError

if TYPE_CHECKING:
    from xpyd_controller.model.roofline import FloatArray, Numeric

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

GPU_FLAGS = ("peak_flops", "hbm_bandwidth", "hbm_bytes", "mfu", "mbu")
# How `--sizing` chooses the pools: each the smallest meeting its SLO, or the seeds' throughput formulas.
SizingRule = Literal["slo", "throughput"]
SIZING_RULES: tuple[SizingRule, ...] = get_args(SizingRule)


def flag_of(field: str) -> str:
    return FLAG_OF_FIELD.get(field, "--" + field.replace("_", "-"))


class PlanInputError(InputError):
    """Bad command-line input: the flag, its value and the rule, worded for the user."""


def add_parser(subparsers: Any, help_text: str) -> argparse.ArgumentParser:
    """The `plan` subcommand's parser: every flag, grouped as `--help` shows them."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "plan",
        help=help_text,
        description=(
            "How many prefill and decode instances does this traffic need, which constraint sets each,\n"
            "and is the KV transfer feasible? Each pool gets the smallest count that meets its SLO with\n"
            f"queueing (TTFT at p{DEFAULT_TTFT_QUANTILE * 100:g} unless --ttft-quantile says otherwise; TPOT and KV "
            "capacity bound the\ndecode batch), shown beside the seeds' throughput floor and the article's "
            "D/P ratio;\n--sizing throughput gives the seeds' formulas alone. All numbers are SI (seconds, "
            "bytes,\nbytes/s, FLOP/s); presets fill defaults and explicit flags override them.\n\n"
            "example:\n"
            "  xpyd plan --model llama-3.1-70b --gpu h100-sxm --link ib-400g --prefill-gpus 4 \\\n"
            "            --decode-gpus 4 --rate 10 --isl 8000 --osl 400 --ttft-slo 2 --tpot-slo 0.05\n\n"
            "exit codes: 0 a plan (for a sweep: every point, whatever its verdict); 1 no pool size meets the\n"
            "SLOs (TTFT floor over the SLO, TPOT under the weight-read floor, weights over HBM, transfer\n"
            "over budget, link over capacity; each named with the gap); 2 invalid input"
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
    gpu.add_argument(
        "--mfu",
        type=float,
        help="achieved fraction of peak FLOP/s (the preset's calibration while --peak-flops is not given, else 0.4)",
    )
    gpu.add_argument("--hbm-bandwidth", type=float, help="HBM bytes/s")
    gpu.add_argument(
        "--mbu",
        type=float,
        help="achieved fraction of HBM bandwidth (the preset's calibration while --hbm-bandwidth is not "
        "given, else 1)",
    )
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
        "--sizing",
        choices=SIZING_RULES,
        default="slo",
        help="slo: each pool the smallest that meets its SLO with queueing; throughput: the seeds' "
        "formulas alone, x = ⌈λ·E[S]⌉, to reproduce them (slo)",
    )
    slo.add_argument(
        "--ttft-quantile",
        type=float,
        help=f"the TTFT quantile --sizing slo meets with queueing, in [0.5, 1) ({DEFAULT_TTFT_QUANTILE:g})",
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
        help="fixed seconds per decode step (the preset's calibration while --hbm-bandwidth is not given, "
        "else 0)",
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
    return parser


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
    sizing: SizingRule
    assumptions: GpuAssumptions  # where MFU, MBU and the step overhead came from


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
    assumptions = resolve_gpu_assumptions(
        args.gpu, _overrides(args, GPU_FLAGS), "--gpu", flag_of, step_overhead=values["step_overhead"]
    )
    values["step_overhead"] = assumptions.step_overhead

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
        gpu=assumptions.gpu,
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
            ttft_quantile=ttft_quantile(args),
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
        sizing=args.sizing,
        assumptions=assumptions,
    )


def ttft_quantile(args: argparse.Namespace) -> float | None:
    """The quantile prefill is sized for: the flag's or the default under `--sizing slo`, none otherwise."""
    if args.sizing == "throughput":
        if args.ttft_quantile is not None:
            rule = "sizes for a TTFT quantile, which --sizing throughput does not (leave one of them out)"
            raise PlanInputError(
                "--ttft-quantile",
                args.ttft_quantile,
                rule,
                message=f"--ttft-quantile {args.ttft_quantile}: {rule}",
            )
        return None
    return DEFAULT_TTFT_QUANTILE if args.ttft_quantile is None else float(args.ttft_quantile)


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
