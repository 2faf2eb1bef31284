"""`xpyd plan --plot`: x and y against the rate (or the swept quantity), and the KV-transfer region."""

from __future__ import annotations

import argparse
import dataclasses
from typing import TYPE_CHECKING, Any

import numpy as np

from xpyd_controller.cli.plan.arguments import PlanInputs
from xpyd_controller.cli.plan.sizing import SweepResult, size
from xpyd_controller.model.explain import format_seconds
from xpyd_controller.model.presets import LINK_PRESETS, MODEL_PRESETS
from xpyd_controller.model.sizing import Plan

if TYPE_CHECKING:
    from xpyd_controller.model.roofline import FloatArray

# Colours keep their meaning across both panels and every plot xpyd draws.
PREFILL_COLOUR, DECODE_COLOUR, TOTAL_COLOUR, INFEASIBLE_COLOUR = "tab:blue", "tab:orange", "0.35", "tab:red"
LINK_COLOURS = {
    "nvlink4": "tab:green",
    "ib-400g": "tab:purple",
    "roce-200g": "tab:brown",
    "pcie5": "tab:olive",
}


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


def _series(
    args: argparse.Namespace, inputs: PlanInputs, sweep: SweepResult | None
) -> tuple[FloatArray, Plan, str]:
    """The x axis, the plan along it and the axis label: the swept quantity's valid points, else the rate."""
    if sweep is not None:
        return sweep.values[sorted(sweep.plan_index)], sweep.plan, f"{sweep.flag} (swept)"
    rates = np.linspace(0.0, max(2.0 * float(args.rate), 1.0), 129)
    plan = size(dataclasses.replace(inputs, workload=dataclasses.replace(inputs.workload, rate=rates)))
    return rates, plan, "arrival rate λ (requests/s)"


def plot(path: str, args: argparse.Namespace, inputs: PlanInputs, sweep: SweepResult | None) -> None:
    """Two panels: x and y against the swept quantity (or the rate); the KV-transfer feasible region."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    axis_values, plan, axis_label = _series(args, inputs, sweep)
    figure, (pools_axis, region_axis) = plt.subplots(1, 2, figsize=(13, 5))
    gpus_axis = _draw_pools(pools_axis, axis_values, plan, inputs, sweep)
    pools_axis.set_xlabel(axis_label)
    pools_axis.set_title(
        f"{inputs.model_name} on {inputs.gpu_name}: ISL {args.isl:g}, OSL {args.osl:g}", fontsize=10
    )
    handles = [*pools_axis.get_legend_handles_labels()[0], *gpus_axis.get_legend_handles_labels()[0]]
    figure.legend(
        handles=handles, loc="lower left", bbox_to_anchor=(0.01, 0.0), ncol=3, fontsize=8, frameon=False
    )
    _draw_region(region_axis, float(np.asarray(plan.transfer_budget_seconds).flat[0]), args, inputs)
    figure.tight_layout(rect=(0, 0.08, 0.93, 1))
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _draw_pools(
    pools_axis: Any, axis_values: FloatArray, plan: Plan, inputs: PlanInputs, sweep: SweepResult | None
) -> Any:
    """x (and the seeds' throughput floor under it), y, the total GPUs on their own axis (returned), verdicts."""
    pools_axis.step(
        axis_values, plan.prefill_instances, where="post", color=PREFILL_COLOUR, label="prefill instances x"
    )
    if inputs.slo.ttft_quantile is not None:
        pools_axis.step(
            axis_values,
            plan.prefill_throughput_instances,
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
    pools_axis.set_ylabel("instances")
    pools_axis.set_ylim(bottom=0)
    pools_axis.grid(alpha=0.3)
    return gpus_axis


def _draw_region(region_axis: Any, budget: float, args: argparse.Namespace, inputs: PlanInputs) -> None:
    """kv_max = t_b·BW/L for every link preset (this plan's shaded) and every preset model's kv/token."""
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
