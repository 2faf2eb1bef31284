"""Words for one planned scenario: what set each pool's size, and what makes it infeasible.

Shared by `xpyd plan`, the controller's status (`status.autoscaler.reasons`) and the simulator's
reports, so the same constraint reads the same everywhere.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from xpyd_controller.model.sizing import Plan


@dataclass(frozen=True)
class Explanation:
    binding: tuple[str, ...]  # why each pool has the size it has
    infeasible: tuple[str, ...]  # empty when the plan can be built and meets its SLOs
    notes: tuple[str, ...]  # true but not disqualifying (exposed transfer, local-prefill threshold)


def format_bytes(value: float) -> str:
    """Decimal units, as link and HBM datasheets use them."""
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.3g} {unit}"
    return f"{value:.3g} B"


def format_seconds(value: float) -> str:
    if not math.isfinite(value):
        return "unbounded"
    if value == 0:
        return "0 s"
    if abs(value) >= 1:
        return f"{value:.3g} s"
    if abs(value) >= 1e-3:
        return f"{value * 1e3:.3g} ms"
    return f"{value * 1e6:.3g} µs"


# What a throughput-sized prefill pool that misses its TTFT needs: a size chosen for the TTFT itself.
_MORE_PREFILL = "sized by throughput; sizing for a TTFT quantile adds instances until it is met"


def _count(instances: int) -> str:
    return f"{instances} instance" + ("" if instances == 1 else "s")


def value_at(plan: Plan, name: str, index: int | tuple[int, ...] = ()) -> float:
    """One scenario's value of a numeric `Plan` field or property, as a float."""
    return float(np.asarray(getattr(plan, name))[index])


def explain(plan: Plan, index: int | tuple[int, ...] = (), *, link_name: str = "the link") -> Explanation:
    """Explain scenario `index` of `plan` (an int or tuple index into its arrays; `()` for scalars)."""

    def at(name: str) -> float:
        return value_at(plan, name, index)

    return Explanation(
        tuple(_binding(plan, index, at)),
        tuple(_infeasible(plan, index, at, link_name)),
        tuple(_notes(plan, index, at, link_name)),
    )


def _binding(plan: Plan, index: int | tuple[int, ...], at: Callable[[str], float]) -> list[str]:
    """What sized each pool."""
    binding: list[str] = []
    x, load = int(at("prefill_instances")), at("prefill_load")
    if str(np.asarray(plan.prefill_binding)[index]) == "ttft_quantile":
        binding.append(
            f"prefill: {_count(x)} to meet the TTFT quantile with queueing "
            f"(throughput alone needs {math.ceil(load)}; utilisation {at('prefill_utilisation'):.0%})"
        )
    else:
        binding.append(
            f"prefill: {_count(x)} sized by throughput ({load:.3g} busy instances of prefill work, "
            f"utilisation {at('prefill_utilisation'):.0%})"
        )
    bound = str(np.asarray(plan.decode_batch_bound)[index])
    bound_words = {
        "kv_capacity": "KV capacity (HBM left after weights / KV per session)",
        "tpot_bandwidth": "TPOT bandwidth (weights + KV read within the TPOT SLO)",
        "tpot_compute": "TPOT compute (2·P FLOPs per token within the TPOT SLO)",
    }[bound]
    swings = str(np.asarray(plan.decode_binding)[index]) == "context_quantile"
    measured = {
        "predicted": "",
        "measured_tpot": " (sessions timed with the pool's measured TPOT, slower than the roofline's)",
        "measured_sessions": " (at least the requests running or waiting on decode now)",
    }[str(np.asarray(plan.decode_session_source)[index])]
    binding.append(
        f"decode: {_count(int(at('decode_instances')))} for {at('concurrency'):.3g} concurrent sessions"
        + (f" of {format_seconds(at('decode_session_seconds'))}{measured}" if measured else "")
        + (" and their Poisson swings at the context quantile" if swings else "")
        + f", batch cap {int(at('decode_batch_cap'))} per instance bound by {bound_words}"
    )
    return binding


def _infeasible(
    plan: Plan, index: int | tuple[int, ...], at: Callable[[str], float], link_name: str
) -> list[str]:
    """Every constraint no pool size meets, with by how much."""
    kv = plan.kv_bytes_per_token
    x = int(at("prefill_instances"))
    infeasible: list[str] = []
    for side in ("prefill", "decode"):
        if not bool(np.asarray(getattr(plan, f"{side}_weights_fit"))[index]):
            needed = math.floor(plan.weight_bytes / plan.gpu_hbm_bytes) + 1
            infeasible.append(
                f"{side}: weights ({format_bytes(plan.weight_bytes)}) do not fit in {at(f'{side}_gpus'):g} "
                f"× {format_bytes(plan.gpu_hbm_bytes)} of HBM: needs {needed} or more GPUs per {side} instance "
                f"(--{side}-gpus)"
            )
    if bool(np.asarray(plan.decode_weights_fit)[index]) and at("decode_batch_cap") < 1:
        if at("decode_tpot_cap") < 1:
            floor = at("tpot_floor_seconds")
            infeasible.append(
                f"decode: the TPOT SLO {format_seconds(at('tpot_slo_seconds'))} leaves no batch: one step "
                f"already takes {format_seconds(floor)} (step overhead + weight read W/β), "
                f"{format_seconds(floor - at('tpot_slo_seconds'))} over it"
            )
        else:
            infeasible.append(
                f"decode: one session's KV ({format_bytes(kv * at('decode_context_tokens'))}) does not fit "
                "in the HBM left after the weights: more GPUs per decode instance (--decode-gpus)"
            )
    ttft, predicted = at("ttft_slo_seconds"), at("predicted_ttft_seconds")
    if bool(np.asarray(plan.prefill_weights_fit)[index]) and predicted > ttft:
        if not math.isfinite(predicted):
            infeasible.append(
                f"prefill: {_count(x)} run at utilisation {at('prefill_utilisation'):.0%}: the queue grows "
                f"without bound and TTFT misses the {format_seconds(ttft)} SLO ({_MORE_PREFILL})"
            )
        elif (floor := at("ttft_floor_seconds")) > ttft:
            infeasible.append(
                f"prefill: TTFT floor {format_seconds(floor)} (prefill + exposed transfer + first step, no "
                f"queueing) is {format_seconds(floor - ttft)} over the {format_seconds(ttft)} SLO: no pool "
                "size meets it; more GPUs per prefill instance or a faster GPU"
            )
        else:
            infeasible.append(
                f"prefill: predicted TTFT {format_seconds(predicted)} with queueing is over the "
                f"{format_seconds(ttft)} SLO at utilisation {at('prefill_utilisation'):.0%} ({_MORE_PREFILL})"
            )
    transfer, budget = at("transfer_seconds"), at("transfer_budget_seconds")
    exposed = at("exposed_transfer_seconds")
    if exposed > budget:
        hidden = (
            f" and leaves {format_seconds(exposed)} exposed even pipelined layer by layer"
            if plan.layerwise_transfer
            else " (serialized: layer-wise pipelining off)"
        )
        infeasible.append(
            f"KV transfer of {format_bytes(at('transfer_bytes'))} takes {format_seconds(transfer)} on "
            f"{link_name}{hidden}: {format_seconds(exposed - budget)} over the {format_seconds(budget)} budget; "
            "needs NVLink or KV compression "
            f"(serialized, at most {format_bytes(at('kv_max_bytes_per_token'))}/token at this length, model has "
            f"{format_bytes(kv)})"
        )
    demand, capacity = at("link_demand_bytes_per_second"), at("link_capacity_bytes_per_second")
    if demand > capacity and at("decode_instances") > 0:
        smaller = min(x * at("prefill_gpus"), at("decode_instances") * at("decode_gpus"))
        needed = math.ceil(demand / (capacity / smaller))
        infeasible.append(
            f"aggregate KV traffic {format_bytes(demand)}/s exceeds {link_name} capacity "
            f"{format_bytes(capacity)}/s by {format_bytes(demand - capacity)}/s (one link per GPU on the "
            f"smaller side): latency can be hidden, bandwidth cannot; carrying it takes the links of "
            f"{needed} GPUs on each side, or a faster link"
        )
    return infeasible


def _notes(plan: Plan, index: int | tuple[int, ...], at: Callable[[str], float], link_name: str) -> list[str]:
    """How the KV transfer and the local-prefill threshold come out."""
    transfer, budget = at("transfer_seconds"), at("transfer_budget_seconds")
    exposed = at("exposed_transfer_seconds")
    notes: list[str] = []
    if not plan.layerwise_transfer:
        notes.append(
            f"layer-wise pipelining off: the whole {format_seconds(transfer)} transfer is on the TTFT path "
            "and is judged against the budget"
        )
    elif not bool(np.asarray(plan.overlap_feasible)[index]):
        notes.append(
            f"layer-wise overlap fails on {link_name} (kv/BW > 2P/π_eff per token): "
            f"{format_seconds(exposed)} of the {format_seconds(transfer)} transfer stays on the TTFT path "
            "and is judged against the budget"
        )
    else:
        notes.append(
            f"layer-wise overlap holds: the {format_seconds(transfer)} transfer (serialized) leaves "
            f"{format_seconds(exposed)} exposed, which is what the budget is judged on"
        )
    if transfer > budget >= exposed:
        notes.append(
            f"serialized, the transfer ({format_seconds(transfer)}) would be over the {format_seconds(budget)} "
            "budget: it fits only because it overlaps the prefill (--no-layerwise-transfer to plan without)"
        )
    threshold = at("local_prefill_threshold_tokens")
    if not math.isfinite(threshold):
        notes.append(f"remote prefill never beats local prefill on {link_name} (kv/BW ≥ 2P/(k_P·π_eff))")
    elif threshold == 0:
        notes.append("no fixed remote-prefill overhead given: remote prefill wins at every prompt length")
    else:
        notes.append(f"prompts under {threshold:.0f} tokens are faster prefilled locally (L_thresh)")
    return notes
