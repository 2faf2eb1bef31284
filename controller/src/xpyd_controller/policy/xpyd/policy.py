"""The xpyd policy: one capacity model, fed what is measured, behind the HPA's rails.

Each decision, in order:
1. supply: each pool's ready + starting instances (starting ones presumed stuck once the pool has
   not moved for `in_flight_timeout_s`); a pool with instances starting or draining may grow but not
   shrink;
2. demand (`demand.py`): the window's arrivals plus the forecast rise over the lead time, the prefill
   backlog to drain within `backlog_drain_s`, the window's lengths (decode's answers paired with their
   own prompts);
3. correction (`correction.py`): the factor on prefill load that makes the model's TTFT p90 match
   the measured one on the serving pool;
4. need (`need.py`): the capacity model's floor and the size to shrink to, for both pools;
5. proposals (`choose.py`): up to the floor, down to the band, one more decode where TPOT missed;
   after a fast fall below the usual load, no smaller than the fleet before it (`returning.py`);
6. the HPA rails (`layers.py`): stabilisation windows, min/max and the GPU budget, rate limits; the
   down window holds what the arrivals need, not growth for the backlog (it drains once) nor a
   size held only while instances start;
7. conversion: a pool above its floor releases instances to a pool that grows now, keeping what it
   was asked to hold over the last conversion's lead time.

A missing arrival rate holds everything; lengths missing scale up on the last known ones, never down.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from xpyd_controller.model.sizing import PoolConfig, Slo
from xpyd_controller.model.specs import GpuSpec
from xpyd_controller.policy.context import PolicyContext
from xpyd_controller.policy.layers import InFlightGuard, Layered, ScalingLayers, resume_parts
from xpyd_controller.policy.lead_times import COLD_START, CONVERSION
from xpyd_controller.policy.limits import validate_limits
from xpyd_controller.policy.state import JsonMap, envelope, section
from xpyd_controller.policy.types import Decision, Limits, Observation
from xpyd_controller.policy.xpyd.choose import (
    ROLES,
    Pools,
    hold_for_return,
    missed_slos,
    recommend,
    release_for_conversion,
)
from xpyd_controller.policy.xpyd.config import XpydConfig
from xpyd_controller.policy.xpyd.correction import DecodeCorrection, Hardware, PrefillCorrection
from xpyd_controller.policy.xpyd.demand import Demand, DemandEstimator
from xpyd_controller.policy.xpyd.need import Need, decode_measurement, pool_need
from xpyd_controller.policy.xpyd.returning import ReturnHold


class XpydPolicy:
    """`Policy`, `Resumable` and `Recalibrable`; every piece of state it keeps is in `state()`."""

    name = "xpyd"

    def __init__(self, context: PolicyContext, config: XpydConfig) -> None:
        self.context = context
        self.config = config
        self._hardware = Hardware(
            context.model,
            context.gpu,
            context.link,
            Slo(ttft=context.ttft_slo_s, tpot=context.tpot_slo_s, ttft_quantile=config.ttft_quantile),
            PoolConfig(
                prefill_gpus=context.prefill_gpus_per_instance,
                decode_gpus=context.decode_gpus_per_instance,
                step_overhead=context.step_overhead_s,
                request_flow=context.request_flow,
            ),
        )
        self._fresh()

    def _fresh(self) -> None:
        """Every stateful part as a new policy has it."""
        parts = self._new_parts()
        self._layers, self._guards, self._demand, self._correction, self._kv_correction, self._hold = parts

    def _new_parts(
        self,
    ) -> tuple[
        ScalingLayers,
        tuple[InFlightGuard, InFlightGuard],
        DemandEstimator,
        PrefillCorrection,
        DecodeCorrection,
        ReturnHold,
    ]:
        config, context = self.config, self.context
        return (
            ScalingLayers(
                config.behavior(), context.prefill_gpus_per_instance, context.decode_gpus_per_instance
            ),
            (InFlightGuard(config.in_flight_timeout_s), InFlightGuard(config.in_flight_timeout_s)),
            DemandEstimator(config.lead_time_s, config.backlog_drain_s, config.in_flight_timeout_s),
            PrefillCorrection(config.calibration_s),
            DecodeCorrection(config.calibration_s),
            ReturnHold(config.return_hold_s),
        )

    def use_gpu(self, gpu: GpuSpec) -> None:
        """Size with these efficiencies from the next decision on; all state is kept."""
        self.context = dataclasses.replace(self.context, gpu=gpu)
        self._hardware = dataclasses.replace(self._hardware, gpu=gpu)

    def _pools(self, observation: Observation) -> tuple[Pools, list[str]]:
        supply, in_flight, reasons = [], [], []
        for role, guard, pool in zip(
            ROLES, self._guards, (observation.prefill, observation.decode), strict=True
        ):
            count, held, why = guard.supply(observation.time_s, pool)
            supply.append(count)
            in_flight.append(held)
            reasons.append(why and role + why)
        return Pools((supply[0], supply[1]), (in_flight[0], in_flight[1])), reasons

    def decide(self, observation: Observation, limits: Limits) -> Decision:
        ctx = self.context
        validate_limits(limits, ctx.prefill_gpus_per_instance, ctx.decode_gpus_per_instance)
        pools, reasons = self._pools(observation)
        demand = self._demand.observe(observation)
        if isinstance(demand, str):
            return Decision(None, None, binding="missing_data", reasons=(demand, *filter(None, reasons)))
        need, learned = self._need(observation, demand)
        missed = missed_slos(observation, ctx.tpot_slo_s)
        recommended, proposed = recommend(pools, need, partial=demand.partial, missed=missed)
        # What the down window holds: the arrivals' need, not growth for the backlog (it drains once)
        # nor a pool held at its supply while instances start or drain.
        settled = Pools(pools.supply, (False, False))
        kept, _ = recommend(settled, need.drained(), partial=demand.partial, missed=missed)
        regrowth_s = self._demand.cold_start_s(observation.time_s) + observation.window_s
        had = (min(kept[0], pools.supply[0]), min(kept[1], pools.supply[1]))  # held: had and still needed
        held = self._hold.observe(observation.time_s, demand.arrival_rate, regrowth_s, had)
        hold_for_return(recommended, kept, proposed, held)
        layered = self._layers.apply(
            observation.time_s,
            pools.supply,
            (recommended[0], recommended[1]),
            limits,
            settle_s=self.config.down_window_s,  # the HPA's first recommendation: the replicas it finds
            kept=(kept[0], kept[1]),
        )
        decided, released = self._release(
            observation.time_s, pools, need, demand, limits, recommended=recommended, layered=layered
        )
        self._demand.lead_times.asked(observation.time_s, pools.supply, decided)
        if demand.rise > 0 or demand.prefill_rise > 0:
            reasons.append("SizedForForecastLoad")
        if demand.backlog_rate > 0:
            reasons.append("PrefillBacklog")
        return Decision(
            prefill=decided[0],
            decode=decided[1],
            binding=layered.bound or need.binding,
            reasons=tuple(r for r in (*reasons, *need.reasons, *proposed, *layered.reasons, released) if r),
            details=self._details(demand, need, pools) | learned | self._hold.details(),
        )

    def _need(self, observation: Observation, demand: Demand) -> tuple[Need, dict[str, float]]:
        """Both corrections updated from this window, then the pools' need sized with them; also the
        corrections' values (and the targets this window proposed) for the decision's details."""
        target = self._correction.target(observation, demand.lengths, self._hardware)
        self._correction.update(observation.time_s, target)
        measured = decode_measurement(observation, self._kv_correction.factor)
        need = pool_need(self._hardware, demand, self._correction.factor, self.config.tolerance, measured)
        kv_target = None
        if "decode_kv_capacity_cap" in need.details:
            model_cap = need.details["decode_kv_capacity_cap"] / self._kv_correction.factor
            kv_target = self._kv_correction.target(observation, model_cap)
        self._kv_correction.update(observation.time_s, kv_target)
        learned = {
            "prefill_correction": self._correction.factor,
            "decode_kv_correction": measured.kv_scale or 1.0,
        }
        if target is not None:
            learned["prefill_correction_target"] = target
        if kv_target is not None:
            learned["decode_kv_correction_target"] = kv_target
        return need, learned

    def _release(
        self,
        time_s: float,
        pools: Pools,
        need: Need,
        demand: Demand,
        limits: Limits,
        *,
        recommended: Sequence[int],
        layered: Layered,
    ) -> tuple[tuple[int, int], str]:
        """The layered sizes after a shrinking pool gives instances to a growing one for conversion
        (same instance shape, full lengths only: what the GPU budget denied the growing pool is what
        it may take), and the reason when it did."""
        ctx = self.context
        decided = [layered.prefill, layered.decode]
        if ctx.prefill_gpus_per_instance != ctx.decode_gpus_per_instance or demand.partial:
            return (decided[0], decided[1]), ""
        maxima = (limits.prefill_max, limits.decode_max)
        budget_bound = layered.bound == "gpu_budget"
        denied = tuple(
            max(0, min(want, high) - got) if budget_bound else 0
            for want, high, got in zip(recommended, maxima, decided, strict=True)
        )
        # A conversion pays off only if the giver's surplus outlasts it: the giver keeps the largest size
        # recommended to it over the last measured conversion's lead time (none until one is measured).
        since = time_s - self._demand.lead_times.seconds.get(CONVERSION, 0.0)
        released = release_for_conversion(
            pools,
            need,
            decided,
            recent=self._layers.largest_since(since),
            limits=limits,
            denied=(denied[0], denied[1]),
            cold_start_faster=self._demand.lead_times.cold_start_faster(),
        )
        return (decided[0], decided[1]), released

    def _details(self, demand: Demand, need: Need, pools: Pools) -> dict[str, float]:
        lead = self._demand.lead_times.seconds
        details = {
            "arrival_rate": demand.arrival_rate,
            "sized_arrival_rate": demand.rate,
            "backlog_rate": demand.backlog_rate,
            "lead_time_seconds": demand.lead_time_s,
            "prefill_forecast_rise": demand.prefill_rise,
            "prefill_supply": float(pools.supply[0]),
            "decode_supply": float(pools.supply[1]),
            "prefill_floor": float(need.floor[0]),
            "decode_floor": float(need.floor[1]),
            "prefill_down_target": float(need.keep[0]),
            "decode_down_target": float(min(need.keep[1], 1 << 20)),
            **need.details,
        }
        lengths = self._demand.last_lengths
        if lengths is not None:
            details |= {"mean_input_tokens": lengths.isl, "mean_output_tokens": lengths.osl}
            details["prefix_hit_rate"] = lengths.hit_rate
        for kind, key in (
            (COLD_START, "measured_cold_start_seconds"),
            (CONVERSION, "measured_conversion_seconds"),
        ):
            if kind in lead:
                details[key] = lead[kind]
        return details

    # ---- Resumable ------------------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        return envelope(
            self.name,
            self._layers.time_s,
            {
                "layers": self._layers.state(),
                "inFlight": {role: guard.state() for role, guard in zip(ROLES, self._guards, strict=True)},
                "demand": self._demand.state(),
                "correction": self._correction.state(),
                "kvCorrection": self._kv_correction.state(),
                "returnHold": self._hold.state(),
            },
        )

    def resume(self, state: Mapping[str, Any] | None, now_s: float) -> str:
        return resume_parts(self, state, now_s)

    def restore_parts(self, parts: JsonMap, latest_s: float) -> None:
        """All parts from a kept state, or none (a `StateError` before anything is replaced)."""
        layers, guards, demand, correction, kv_correction, hold = self._new_parts()
        layers.restore(section(parts, "layers"), latest_s)
        kept_guards = section(parts, "inFlight")
        for role, guard in zip(ROLES, guards, strict=True):
            guard.restore(section(kept_guards, role), latest_s)
        demand.restore(section(parts, "demand"), latest_s)
        correction.restore(section(parts, "correction"), latest_s)
        kv_correction.restore(section(parts, "kvCorrection"), latest_s)
        if "returnHold" in parts:  # a state kept before the hold existed has none: it starts afresh
            hold.restore(section(parts, "returnHold"), latest_s)
        self._layers, self._guards, self._demand = layers, guards, demand
        self._correction, self._kv_correction, self._hold = correction, kv_correction, hold

    def forget(self) -> None:
        """The kept state is lost: start afresh, holding the found fleet for a down window."""
        self._fresh()
        self._layers.forget()
