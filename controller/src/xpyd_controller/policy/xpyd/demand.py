"""What the pools must serve by the time a change made now takes effect: rate, backlog and lengths.

- The rate is the window's arrivals (not completions: a step is seen at the next scrape), plus the
  rise the load forecast expects over the lead time of the cheaper way to grow (a cold start or a
  conversion, as measured; `lead_time_s` until one is; never shorter than a start under way has
  waited). Prefill's load is forecast as work (prompt tokens to compute per second), not as
  requests: a mix drifting to longer prompts at a flat rate grows prefill's work as surely as more
  requests do. A forecast only ever adds: it never scales in.
- The backlog is work already late: requests queued for prefill beyond one per ready instance (what
  a pool sized for a TTFT quantile holds in passing) are sized to drain within `backlog_drain_s` on
  top of the arrivals, so a pool that fell behind (after a drop to near zero and
  back, a flash crowd) grows by what it owes, not one instance per decision.
- Lengths are the window's own (prompts counted at arrival, answers at completion): a window mixes the
  request classes in the proportion they arrive, and both pools' needs are linear in that mix. Without
  lengths the last known ones stand in, and the decision may then scale up but never down.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from xpyd_controller.model.sizing import std_from_quantile
from xpyd_controller.policy.forecast import RateForecast
from xpyd_controller.policy.lead_times import COLD_START, LeadTimes
from xpyd_controller.policy.state import JsonMap, StateError, section, vector
from xpyd_controller.policy.types import Observation

LENGTH_QUANTILE = 0.9  # the observation's p90 lengths give the spread the sizing uses
MAX_HIT_RATE = 0.99


@dataclass(frozen=True)
class Lengths:
    """Mean and spread of prompt and answer tokens, and the prefix-hit share of prompt tokens."""

    isl: float
    osl: float
    isl_std: float = 0.0
    osl_std: float = 0.0
    hit_rate: float = 0.0

    def as_list(self) -> list[float]:
        return [self.isl, self.osl, self.isl_std, self.osl_std, self.hit_rate]


@dataclass(frozen=True)
class Demand:
    """The load to size for; `partial` when the lengths are an earlier window's (no scale-in then)."""

    arrival_rate: float  # measured
    rise: float  # the request rate's forecast rise over the lead time (>= 0)
    backlog_rate: float  # prefill requests queued beyond one per ready instance / backlog_drain_s
    lengths: Lengths
    partial: bool = False
    lead_time_s: float = 0.0
    prefill_rise: float = 0.0  # prefill work's forecast rise over the lead time, in requests/s (>= 0)

    @property
    def rate(self) -> float:
        """Requests/s decode is sized for."""
        return self.arrival_rate + self.rise

    @property
    def prefill_rate(self) -> float:
        """Requests/s of the window's prompts that prefill is sized for, before its backlog."""
        return self.arrival_rate + self.prefill_rise


def _usable(value: float | None) -> bool:
    return value is not None and math.isfinite(value) and value > 0


def window_lengths(observation: Observation) -> Lengths | None:
    """The window's lengths; None when it has no finite means of at least one token."""
    isl, osl = observation.mean_input_tokens, observation.mean_output_tokens
    if isl is None or osl is None or not (_usable(isl) and _usable(osl)) or min(isl, osl) < 1:
        return None
    p90_in, p90_out, hit = (
        observation.p90_input_tokens,
        observation.p90_output_tokens,
        observation.prefix_hit_rate,
    )
    return Lengths(
        isl,
        osl,
        std_from_quantile(isl, p90_in, LENGTH_QUANTILE) if p90_in is not None and _usable(p90_in) else 0.0,
        std_from_quantile(osl, p90_out, LENGTH_QUANTILE) if p90_out is not None and _usable(p90_out) else 0.0,
        min(max(hit, 0.0), MAX_HIT_RATE) if hit is not None and math.isfinite(hit) else 0.0,
    )


class DemandEstimator:
    """Turns each observation into a `Demand`; keeps the forecast, the lead times and the last lengths."""

    def __init__(self, lead_time_s: float, backlog_drain_s: float, in_flight_timeout_s: float) -> None:
        self.prior_lead_s = lead_time_s
        self.backlog_drain_s = backlog_drain_s
        self.forecast = RateForecast(lead_time_s)
        self.work_forecast = RateForecast(lead_time_s)  # prompt tokens to compute per second
        self.lead_times = LeadTimes(in_flight_timeout_s)
        self.last_lengths: Lengths | None = None

    def lead_time_s(self, time_s: float) -> float:
        """Seconds until growth asked for now serves: the faster of the ways measured (else the prior),
        each at least as long as its growth still waiting has waited (a slower start than the prior
        or the last one shows before it ends)."""
        estimates = self.lead_times.seconds or {COLD_START: self.prior_lead_s}
        waited = self.lead_times.waited_s(time_s)
        return min(max(seconds, waited.get(kind, 0.0)) for kind, seconds in estimates.items())

    def cold_start_s(self, time_s: float) -> float:
        """Seconds a new instance takes to serve: as measured (else the prior), at least as long as the
        one still starting has waited; how long regrowing takes."""
        waited = self.lead_times.waited_s(time_s).get(COLD_START, 0.0)
        return max(self.lead_times.seconds.get(COLD_START, self.prior_lead_s), waited)

    def observe(self, observation: Observation) -> Demand | str:
        """The demand, or the CamelCase reason there is nothing trustworthy to size for."""
        rate = observation.arrival_rate
        if rate is None or not math.isfinite(rate) or rate < 0:
            return "MissingArrivalRate"
        self.lead_times.observe(observation.time_s, (observation.prefill.ready, observation.decode.ready))
        self.forecast.add(observation.time_s, rate)
        lengths, partial = window_lengths(observation), False
        if lengths is None:
            if rate > 0 and self.last_lengths is None:
                return "MissingRequestLengths"
            lengths, partial = self.last_lengths or Lengths(1.0, 1.0), rate > 0
        self.last_lengths = lengths
        per_request = lengths.isl * (1 - lengths.hit_rate)
        work = rate * per_request
        if not partial:
            self.work_forecast.add(observation.time_s, work)
        lead = self.lead_time_s(observation.time_s)
        rise = self._ahead(self.forecast, lead) if rate > 0 else 0.0
        # the work's rise in requests of this window's prompts (never a division by a vanishing rate)
        prefill_rise = self._ahead(self.work_forecast, lead) / per_request if work > 0 else 0.0
        queue = observation.prefill_queue
        backlog = (
            max(queue - observation.prefill.ready, 0.0) / self.backlog_drain_s
            if queue is not None and math.isfinite(queue)
            else 0.0
        )
        return Demand(rate, rise, backlog, lengths, partial, lead, prefill_rise)

    @staticmethod
    def _ahead(forecast: RateForecast, lead_s: float) -> float:
        """The forecast's rise over the lead time, or 0 (never a fall: no forecast scales in)."""
        rise = forecast.rise()
        return 0.0 if rise is None else max(0.0, rise * lead_s / forecast.horizon_s)

    def state(self) -> dict[str, Any]:
        return {
            "forecast": self.forecast.state(),
            "workForecast": self.work_forecast.state(),
            "leadTimes": self.lead_times.state(),
            "lengths": None if self.last_lengths is None else self.last_lengths.as_list(),
        }

    def restore(self, data: JsonMap, latest_s: float) -> None:
        """Continue from `state()`'s output (a `StateError` leaves this unchanged)."""
        forecast, lead_times = RateForecast(self.forecast.horizon_s), LeadTimes(self.lead_times.timeout_s)
        work_forecast = RateForecast(self.forecast.horizon_s)
        forecast.restore(section(data, "forecast"), latest_s)
        work_forecast.restore(section(data, "workForecast"), latest_s)
        lead_times.restore(section(data, "leadTimes"), latest_s)
        lengths = None
        if data.get("lengths") is not None:
            isl, osl, isl_std, osl_std, hit = vector(data, "lengths", 5, low=0)
            if min(isl, osl) < 1 or hit > MAX_HIT_RATE:
                raise StateError(
                    "lengths", data["lengths"], f"needs lengths >= 1, a hit rate <= {MAX_HIT_RATE}"
                )
            lengths = Lengths(isl, osl, isl_std, osl_std, hit)
        self.forecast, self.work_forecast = forecast, work_forecast
        self.lead_times, self.last_lengths = lead_times, lengths
