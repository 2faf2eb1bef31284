"""The capacity model's answer: instances each pool needs for a demand, and the size it may shrink to.

One `size_pools` call sizes six rows: prefill at its load (arrivals grown by the forecast of its
work, and the backlog, times the learned correction) and at that load × (1 + tolerance), decode at the
arrival rate (with its forecast rise) and at that rate × (1 + tolerance), with its sessions' own prompts
(`Demand.decode_lengths`), and prefill's two again
without the backlog. The first of each pair is the floor (below it the pool misses its SLO), the second
the size a pool above it shrinks to (so N−1 still meets the SLO with the tolerance to spare, and noise
does not flap it); the backlog-free pair is what the arrivals alone need (`Need.drained`). Decode's sessions are floored by the requests it
holds now (`DecodeMeasurement`), so a pool whose answers got longer than the lengths say still grows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np

from xpyd_controller.model.sizing import DecodeMeasurement, Workload, size_pools
from xpyd_controller.policy.types import Observation
from xpyd_controller.policy.xpyd.correction import Hardware
from xpyd_controller.policy.xpyd.demand import Demand

# Model predictions copied into `Decision.details` (Plan field names) from prefill's and decode's rows.
PREFILL_PREDICTIONS = ("prefill_load", "prefill_utilisation", "predicted_ttft_seconds", "ttft_floor_seconds")
DECODE_PREDICTIONS = (
    "concurrency",
    "decode_session_seconds",
    "decode_batch_cap",
    "decode_kv_capacity_cap",
    "decode_step_seconds",
)
SESSION_REASONS = {
    "measured_tpot": "DecodeSessionsFromMeasuredTpot",
    "measured_sessions": "DecodeSessionsMeasured",
}
INFEASIBLE = 1 << 30  # a decode pool that cannot be built is never shrunk because of that


@dataclass(frozen=True)
class Need:
    """Per pool (prefill, decode): the floor that meets the demand and the size to shrink to."""

    floor: tuple[int, int]
    keep: tuple[int, int]
    binding: str
    reasons: tuple[str, ...] = ()
    details: dict[str, float] = field(default_factory=dict)
    prefill_drained: tuple[int, int] | None = None  # prefill's (floor, keep) without the backlog

    def drained(self) -> Need:
        """The need once the backlog has drained: the arrivals' alone."""
        if self.prefill_drained is None:
            return self
        (floor, keep) = self.prefill_drained
        return replace(self, floor=(floor, self.floor[1]), keep=(keep, self.keep[1]), prefill_drained=None)


def decode_measurement(observation: Observation, kv_scale: float) -> DecodeMeasurement:
    """The decode pool's measured step time, the requests on it now (running + waiting), and the
    learned factor on its KV room (`correction.DecodeCorrection`)."""
    step, running, waiting = observation.tpot_mean_s, observation.decode_running, observation.decode_waiting
    sessions = None
    if running is not None and math.isfinite(running) and running >= 0:
        sessions = running + (
            waiting if waiting is not None and math.isfinite(waiting) and waiting > 0 else 0.0
        )
    usable_step = step if step is not None and math.isfinite(step) and step > 0 else None
    return DecodeMeasurement(step_seconds=usable_step, sessions=sessions, kv_scale=kv_scale)


def _by_row(prefill: float, decode: float) -> np.ndarray:
    """One value per sized row: prefill's four, decode's two (rows 2 and 3)."""
    return np.array([prefill, prefill, decode, decode, prefill, prefill])


def pool_need(
    hardware: Hardware, demand: Demand, correction: float, tolerance: float, measured: DecodeMeasurement
) -> Need:
    """What the capacity model says each pool needs for `demand` (see the module docstring)."""
    if demand.rate == 0 and demand.backlog_rate == 0:
        return Need((0, 0), (0, 0), "zero_traffic", ("ZeroTraffic",))
    prefill_rate = (demand.prefill_rate + demand.backlog_rate) * correction
    arrivals_only = demand.prefill_rate * correction
    lengths = demand.lengths
    rates = np.array(
        [
            prefill_rate,
            prefill_rate * (1 + tolerance),
            demand.rate,
            demand.rate * (1 + tolerance),
            arrivals_only,
            arrivals_only * (1 + tolerance),
        ]
    )
    paired = demand.decode_lengths or lengths
    workload = Workload(  # decode's rows (2, 3) hold its sessions' prompts, paired with their answers
        rates,
        _by_row(lengths.isl, paired.isl),
        lengths.osl,
        _by_row(lengths.hit_rate, paired.hit_rate),
        _by_row(lengths.isl_std, paired.isl_std),
        lengths.osl_std,
    )
    plan = size_pools(
        hardware.model,
        hardware.gpu,
        hardware.link,
        workload,
        hardware.slo,
        pools=hardware.pools,
        measured=measured,
    )
    floor = (int(plan.prefill_instances[0]), int(plan.decode_instances[2]))
    keep = (int(plan.prefill_instances[1]), int(plan.decode_instances[3]))
    details = {key: float(getattr(plan, key)[0]) for key in PREFILL_PREDICTIONS}
    details |= {key: float(getattr(plan, key)[2]) for key in DECODE_PREDICTIONS}
    details["predicted_tpot_seconds"] = details.pop("decode_step_seconds")
    reasons = [SESSION_REASONS.get(str(plan.decode_session_source[2]), "")]
    if not plan.ttft_feasible[0]:
        reasons.append("TtftSloBelowModelFloor")
    if not plan.decode_feasible[2]:
        reasons.append("DecodeInfeasible")
        floor, keep = (floor[0], 0), (keep[0], INFEASIBLE)
    binding = f"prefill_{plan.prefill_binding[0]}+decode_{plan.decode_batch_bound[2]}"
    drained = (int(plan.prefill_instances[4]), int(plan.prefill_instances[5]))
    return Need(floor, keep, binding, tuple(r for r in reasons if r), details, drained)
