"""Hindsight oracles: policies that know the whole trace in advance (benchmark references only).

Both size each window of the trace with the capacity model, fed the window's *actual* rate and
length statistics (no forecasting error, no measurement lag):

- `window`: per window, the cheapest allocation the model says meets the SLOs, requested one cold
  start (plus a scrape) ahead so it is ready when the window begins;
- `static`: the peak over all windows, held for the whole run (the peak-provisioned static split).

They isolate what forecasting and stabilisation cost a live policy; they inherit the capacity
model's own errors (benchmarks/model_vs_sim.py measures those separately).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from xpyd_controller.model.sizing import PoolConfig, Slo, Workload, size_pools
from xpyd_controller.policy.types import Decision, Limits, Observation
from xpyd_controller.sim.config import SimConfig
from xpyd_controller.sim.traces import Trace

IntArray = npt.NDArray[np.int64]
ORACLE_WINDOW_S = 300.0
# Size prefill for this TTFT quantile (with queueing): the benchmark's goodput target is 99 %.
ORACLE_TTFT_QUANTILE = 0.99


@dataclass(frozen=True)
class WindowPlan:
    """The model's allocation for each window of a trace."""

    window_s: float
    prefill: IntArray
    decode: IntArray


def plan_windows(trace: Trace, config: SimConfig, window_s: float = ORACLE_WINDOW_S) -> WindowPlan:
    """Size every window of `trace` from its actual arrivals (one vectorised model call)."""
    count = int(float(trace.arrival_s[-1]) // window_s) + 1
    index = np.minimum((trace.arrival_s // window_s).astype(np.int64), count - 1)
    weights = np.bincount(index, minlength=count).astype(np.float64)
    present = np.maximum(weights, 1.0)

    def window_mean(values: np.ndarray) -> np.ndarray:
        result: np.ndarray = np.bincount(index, weights=values.astype(np.float64), minlength=count) / present
        return result

    prompt, output = trace.prompt_tokens, trace.output_tokens
    isl, osl = window_mean(prompt), window_mean(output)
    isl_std = np.sqrt(np.maximum(window_mean(prompt.astype(np.float64) ** 2) - isl**2, 0.0))
    osl_std = np.sqrt(np.maximum(window_mean(output.astype(np.float64) ** 2) - osl**2, 0.0))
    hits = window_mean(trace.prefix_hit_tokens) / np.maximum(isl, 1.0)
    if not config.realism.prefix_cache:
        hits = np.zeros(count)
    hw, slo = config.hardware, config.slo
    tpot = slo.tpot_s if slo.tpot_s is not None else slo.max_token_gap_s
    assert tpot is not None  # GoodputSlo always has one of them in practice; the seed has the gap
    plan = size_pools(
        hw.model,
        hw.gpu,
        hw.link,
        Workload(
            rate=weights / window_s,
            isl=np.maximum(isl, 1.0),
            osl=np.maximum(osl, 1.0),
            hit_rate=np.minimum(hits, 0.99),
            isl_std=isl_std,
            osl_std=osl_std,
        ),
        Slo(ttft=slo.ttft_s, tpot=tpot, ttft_quantile=ORACLE_TTFT_QUANTILE),
        pools=PoolConfig(
            prefill_gpus=hw.gpus_per_instance,
            decode_gpus=hw.gpus_per_instance,
            step_overhead=hw.step_overhead_s,
            request_flow="prefill_first",  # the simulator admits to decode after prefill and transfer
        ),
    )
    return WindowPlan(
        window_s, np.asarray(plan.prefill_instances, np.int64), np.asarray(plan.decode_instances, np.int64)
    )


class HindsightWindowOracle:
    """Per window, what the model says the *coming* traffic needs, asked for a lead time early."""

    name = "oracle-window"

    def __init__(self, plan: WindowPlan, lead_s: float) -> None:
        self.plan = plan
        self.lead_s = lead_s

    def decide(self, observation: Observation, limits: Limits) -> Decision:
        plan = self.plan
        first = int(observation.time_s // plan.window_s)
        last = int((observation.time_s + self.lead_s) // plan.window_s)
        span = slice(min(first, len(plan.prefill) - 1), min(last, len(plan.prefill) - 1) + 1)
        prefill = int(plan.prefill[span].max())
        decode = int(plan.decode[span].max())
        return _bounded(prefill, decode, limits, "hindsight_window")


class HindsightStaticOracle:
    """The peak of the per-window plan, for the whole run: peak-provisioned, never rescaled."""

    name = "oracle-static"

    def __init__(self, plan: WindowPlan) -> None:
        self.prefill = int(plan.prefill.max())
        self.decode = int(plan.decode.max())

    def decide(self, observation: Observation, limits: Limits) -> Decision:
        return _bounded(self.prefill, self.decode, limits, "hindsight_peak")


def _bounded(prefill: int, decode: int, limits: Limits, binding: str) -> Decision:
    return Decision(
        prefill=min(limits.prefill_max, max(limits.prefill_min, prefill)),
        decode=min(limits.decode_max, max(limits.decode_min, decode)),
        binding=binding,
        reasons=("Hindsight",),
    )


def make_oracle(name: str, trace: Trace, config: SimConfig) -> HindsightWindowOracle | HindsightStaticOracle:
    """`oracle-window` or `oracle-static` for this trace and fleet."""
    plan = plan_windows(trace, config)
    if name == "oracle-static":
        return HindsightStaticOracle(plan)
    if name == "oracle-window":
        lead = config.realism.cold_start_s + config.control.scrape_interval_s
        return HindsightWindowOracle(plan, lead)
    raise ValueError(f"policy = {name!r}: not an oracle (oracle-static, oracle-window)")


ORACLES = ("oracle-static", "oracle-window")
