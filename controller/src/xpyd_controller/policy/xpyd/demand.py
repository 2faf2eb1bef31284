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
- Decode's KV per session pairs each answer with its own prompt. Answers are counted as they finish,
  one decode session after their prompts were: where the prompts grew within that session, the
  window's prompts belong to requests whose answers have not finished, and pairing them with the
  answers that did would size decode for long prompts with long answers that no request has (the
  switch from a long-output mix to a long-prompt one). Decode is then sized with the prompts of one
  session ago (`Demand.decode_lengths`); where they were not shorter, with the window's own.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Any

from xpyd_controller.model.sizing import std_from_quantile
from xpyd_controller.policy.forecast import RateForecast
from xpyd_controller.policy.lead_times import COLD_START, LeadTimes
from xpyd_controller.policy.state import JsonMap, StateError, rows, section, vector
from xpyd_controller.policy.types import Observation

LENGTH_QUANTILE = 0.9  # the observation's p90 lengths give the spread the sizing uses
MAX_HIT_RATE = 0.99
PROMPT_MEMORY_S = 600.0  # how far back the prompts of the answers finishing now are looked for
MAX_KEPT_PROMPTS = 64  # windows kept over that time, at least PROMPT_MEMORY_S / this apart (a small state)


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

    @property
    def prompt_work(self) -> float:
        """Prompt tokens prefill computes per request (the prefix hits are not computed)."""
        return self.isl * (1 - self.hit_rate)


def checked_lengths(values: tuple[float, ...], key: str) -> Lengths:
    """Lengths from a kept state's five numbers (`Lengths.as_list`), or a `StateError`."""
    isl, osl, isl_std, osl_std, hit = values
    if min(isl, osl) < 1 or min(isl_std, osl_std, hit) < 0 or hit > MAX_HIT_RATE:
        raise StateError(
            key, list(values), f"needs lengths >= 1, spreads >= 0, a hit rate in [0, {MAX_HIT_RATE}]"
        )
    return Lengths(isl, osl, isl_std, osl_std, hit)


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
    decode_lengths: Lengths | None = None  # answers paired with their own prompts; None: `lengths`

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
        self.prompts: deque[tuple[float, Lengths]] = deque()  # (time, lengths) of the windows seen

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
        per_request = lengths.prompt_work
        work = rate * per_request
        decode_lengths = None
        if not partial:
            self.work_forecast.add(observation.time_s, work)
            decode_lengths = self._answered(observation.time_s, lengths, observation.tpot_mean_s)
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
        return Demand(rate, rise, backlog, lengths, partial, lead, prefill_rise, decode_lengths)

    def _answered(self, time_s: float, lengths: Lengths, step_s: float | None) -> Lengths | None:
        """Keep this window's lengths; the window's answers with the prompts of one decode session ago
        (answers × measured step) where those were shorter, else None (see the module docstring)."""
        if not self.prompts or time_s - self.prompts[-1][0] >= PROMPT_MEMORY_S / MAX_KEPT_PROMPTS:
            self.prompts.append((time_s, lengths))
        while self.prompts[0][0] < time_s - PROMPT_MEMORY_S:
            self.prompts.popleft()
        if step_s is None or not _usable(step_s):
            return None
        since = time_s - lengths.osl * step_s
        then = next((kept for t, kept in reversed(self.prompts) if t <= since), self.prompts[0][1])
        if then.prompt_work >= lengths.prompt_work:
            return None
        return Lengths(then.isl, lengths.osl, then.isl_std, lengths.osl_std, then.hit_rate)

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
            "prompts": [[t, *kept.as_list()] for t, kept in self.prompts],
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
            lengths = checked_lengths(vector(data, "lengths", 5, low=0), "lengths")
        prompts: deque[tuple[float, Lengths]] = deque()
        if "prompts" in data:  # a state kept before prompts were has none: they are seen afresh
            kept = rows(data, "prompts", (False,) * 6, latest_s=latest_s)
            if len(kept) > MAX_KEPT_PROMPTS + 1:
                raise StateError("prompts", len(kept), f"must hold at most {MAX_KEPT_PROMPTS + 1} windows")
            for index, (t, *values) in enumerate(kept):
                prompts.append((t, checked_lengths(tuple(values), f"prompts[{index}]")))
        self.forecast, self.work_forecast = forecast, work_forecast
        self.lead_times, self.last_lengths, self.prompts = lead_times, lengths, prompts
