"""`xpyd`: the capacity model sets a floor, HPA-style layers keep it calm, conversion does the rest.

Layers, in order: the capacity-model floor (`size_pools` with TTFT-percentile prefill sizing and KV/TPOT
decode sizing, on the window's arrival rate and smoothed lengths) → a tolerance band on demand (scale up
to the floor when supply is below it; scale down only to the size the model gives for demand × (1 +
tolerance), so N−1 still meets the SLO with margin; one more instance when the measured p90 misses the
SLO at the floor, in the pool the miss is blamed on; under a GPU budget, headroom for the other end
of a mix swing seen) → stabilisation windows (fast up, slow down) → min/max and the GPU budget → rate
limits → the in-flight guard (a pool with instances starting or draining holds until they finish or a
timeout; starting instances count as supply; growth to the floor beyond them is let through) →
pairing (a pool above its need releases instances to a pool that grows now, unless cold starts were measured
to serve sooner than conversions and the budget has room). The policy only says how many of each role;
the driver converts instances when one pool shrinks while the other grows. docs/tuning.md lists every
knob.

While the load forecast falls beyond the rate's scatter, scale-ins skip the down window and keep two
scatters to spare instead of the whole tolerance band.

The prompt spread the sizing reads from mean and p90 (normal lengths) is multiplied by a factor in
[`spread_floor`, 1] learned from the measured TTFT p90 against the model's on the serving prefill pool
(`policy/prompt_spread.py`, `_calibrate_spread`); a TTFT p90 above the SLO puts the full spread back.

Field rules: a missing arrival rate holds everything; partial data (rate but no lengths) may scale up
on the last known lengths but never down; a rate of exactly 0 is zero demand and scales to the minimum.
"""

from __future__ import annotations

import dataclasses
import math
from collections import deque
from dataclasses import dataclass, field
from typing import TypeGuard

import numpy as np

from xpyd_controller.model.sizing import (
    DecodeMeasurement,
    Plan,
    PoolConfig,
    Slo,
    Workload,
    prefill_ttft_quantile,
    size_pools,
    std_from_quantile,
)
from xpyd_controller.model.specs import GpuSpec
from xpyd_controller.policy.context import PolicyConfigError, PolicyContext, configure
from xpyd_controller.policy.forecast import RateForecast
from xpyd_controller.policy.layers import (
    InFlightGuard,
    LayeredPolicy,
    ScalingBehavior,
    enforce_limits,
    require_in,
)
from xpyd_controller.policy.lead_times import COLD_START, CONVERSION, LeadTimes
from xpyd_controller.policy.limits import validate_limits
from xpyd_controller.policy.prompt_spread import CALIBRATION_QUANTILE, SpreadCalibration
from xpyd_controller.policy.types import Decision, Limits, Observation

LENGTH_QUANTILE = 0.9  # the observation's p90 lengths give the spread the sizing uses
# The coupling of answer to prompt length is fitted only from this many windows' weight on, and only
# while each length has moved by more than this share of its mean (else there is no line to fit).
MIN_COUPLING_WINDOWS = 5.0
MOVED_SHARE = 0.05
COUPLING_REACH_SD = 2.0  # predict only within this many standard deviations of the prompt lengths seen
# A window enters the fit only when both its lengths are within this share of the window before's:
# in a swing the prompt length (counted at arrival) moves first and the answer length (at completion)
# a session later, so a moving window pairs the new prompts with the old answers.
STEADY_SHARE = 0.1
# On a falling load a scale-in keeps this many times the rate's scatter around the forecast to spare
# (when less than the tolerance band): a window reads that far above the trend about once in forty.
FALLING_MARGIN_SCATTERS = 2.0
# Below this utilisation (model load over instances) prefill's queue under requests waiting on decode
# is decode's back-pressure, not prefill's shortage.
BUSY_SHARE = 0.5
# Model predictions copied into `Decision.details` (Plan field names), from prefill's and decode's plan.
PREFILL_PREDICTIONS = ("prefill_load", "prefill_utilisation", "predicted_ttft_seconds", "ttft_floor_seconds")
DECODE_PREDICTIONS = ("concurrency", "decode_session_seconds", "decode_batch_cap", "decode_step_seconds")
# Reasons naming which measurement timed the decode sessions (`DecodeMeasurement`), by Plan source label.
SESSION_REASONS = {
    "measured_tpot": "DecodeSessionsFromMeasuredTpot",
    "measured_sessions": "DecodeSessionsMeasured",
}


@dataclass(frozen=True)
class XpydConfig(ScalingBehavior):
    """Every knob of the xpyd policy; docs/tuning.md says when to change each."""

    ttft_quantile: float = 0.99  # size prefill so this quantile of TTFT (with queueing) meets the SLO
    context_quantile: float = 0.0  # > 0: size decode batches so their KV fits with this probability
    tolerance: float = 0.1  # scale down only to the size needed at demand × (1 + tolerance)
    length_smoothing_s: float = 300.0  # time constant of the moving average of lengths and hit rate
    # r² of the windows' answer length on their prompt length (over length_smoothing_s) from which a
    # window's prompt length sets the mix at once: its own prompt length, the answer length on the line;
    # 0 = off (always the averaged lengths)
    length_coupling_r2: float = 0.6
    # 1 = under a GPU budget, GPUs the current mix leaves unused go to the pool the other end of the
    # mix seen over length_smoothing_s would need (a swing then finds capacity, not a drain or a cold
    # start), and to prefill (then decode) while the mix has not shown two ends; 0 = off. Needs a
    # budget.
    swing_headroom: float = 1.0
    # 1 = prefill is sized on the window's own prompt lengths (counted at arrival: the work prefill
    # sees now), decode on the smoothed ones; 0 = both on the smoothed lengths
    prefill_window_lengths: float = 1.0
    # 1 = a pool grows by cold starts, not by converting the other pool's surplus, while the GPU budget
    # has room and cold starts have been measured to serve sooner than conversions; 0 = always pair
    measured_growth: float = 1.0
    in_flight_timeout_s: float = 600.0
    # size for the window's rate plus its damped-trend rise over this horizon (the time an instance
    # added now needs to serve); 0 = the window's rate only
    forecast_horizon_s: float = 180.0
    # the load counts as falling (scale-ins skip the down window) while the forecast's fall over
    # forecast_horizon_s exceeds this many times the rate's scatter around the forecast; 0 = never
    falling_load_scatter: float = 0.5
    # the lowest factor on the prompt spread the TTFT sizing uses, learned from the measured TTFT p90
    # against the model's at the serving pool (policy/prompt_spread.py); 1 = off (the full spread)
    spread_floor: float = 0.7
    spread_calibration_s: float = 900.0  # time constant of that factor's way down (up: four times faster)
    latency_feedback: float = 1.0  # measured p90 above this × SLO adds one instance over the floor; 0 = off
    decode_kv_full: float = 0.95  # a TTFT miss at this decode KV usage or above is decode's; 0 = prefill's
    # at this decode KV usage or above (over its serving instances), decode's batch per instance is at
    # most what its running requests measure to fit (running / full instances' worth of KV); 0 = off
    decode_measured_kv: float = 0.9
    remote_overhead_s: float = 0.0
    transfer_budget_s: float = 0.0  # seconds of TTFT for the KV transfer; 0 = the whole TTFT SLO

    def __post_init__(self) -> None:
        self.check_behavior("xpyd")
        for name in ("ttft_quantile", "context_quantile"):
            value = getattr(self, name)
            if not (value == 0 or 0.5 <= value < 1):
                raise PolicyConfigError("xpyd", name, value, "must be 0 (mean sizing) or in [0.5, 1)")
        for name in ("decode_kv_full", "decode_measured_kv"):
            value = getattr(self, name)
            if not (value == 0 or 0.5 <= value <= 1):
                raise PolicyConfigError("xpyd", name, value, "must be 0 (off) or in [0.5, 1]")
        require_in("xpyd", "tolerance", self.tolerance, 0, 0.99)
        require_in("xpyd", "spread_floor", self.spread_floor, 0, 1, open_low=True)
        require_in("xpyd", "length_coupling_r2", self.length_coupling_r2, 0, 1)
        for name in ("swing_headroom", "prefill_window_lengths", "measured_growth"):
            if getattr(self, name) not in (0, 1):
                raise PolicyConfigError("xpyd", name, getattr(self, name), "must be 0 (off) or 1 (on)")
        require_in("xpyd", "in_flight_timeout_s", self.in_flight_timeout_s, 0, open_low=True)
        if self.latency_feedback != 0:
            require_in("xpyd", "latency_feedback", self.latency_feedback, 1)
        for name in (
            "remote_overhead_s",
            "transfer_budget_s",
            "forecast_horizon_s",
            "length_smoothing_s",
            "falling_load_scatter",
            "spread_calibration_s",
        ):
            require_in("xpyd", name, getattr(self, name), 0)


@dataclass(frozen=True)
class _Demand:
    rate: float  # what the pools are sized for: the window's rate, or the forecast when above it
    measured_rate: float
    isl: float
    osl: float
    isl_std: float
    osl_std: float
    hit_rate: float
    partial: bool  # lengths came from an earlier window: may scale up, never down
    coupling_r2: float | None = None  # set when the window's prompt length set the lengths
    # the (prompt, answer) lengths at both ends of the mix seen over length_smoothing_s, on the line
    ends: tuple[tuple[float, float], ...] = ()
    # the prompt length and spread prefill is sized on, when not `isl`/`isl_std` (the window's own)
    prefill_isl: tuple[float, float] | None = None
    newest: bool = False  # prefill_isl is the newest arrivals' prompt length (`_newest_prompts`)
    falling: _Falling | None = None  # set while the load forecast falls beyond the rate's scatter


@dataclass(frozen=True)
class _Falling:
    """The load forecast's fall over the horizon (req/s, positive) and the rate's scatter around it."""

    fall: float
    scatter: float


def _usable(value: float | None) -> TypeGuard[float]:
    """A measured length: present, finite and positive (anything else is missing data)."""
    return value is not None and math.isfinite(value) and value > 0


@dataclass
class _Smoothed:
    """An exponentially weighted moving average over time (time constant `tau_s`; 0 = latest value)."""

    tau_s: float
    value: tuple[float, ...] | None = None
    _time_s: float = 0.0

    def update(self, time_s: float, sample: tuple[float, ...]) -> None:
        if self.value is None or self.tau_s == 0:
            self.value = sample
        else:
            weight = 1.0 - math.exp(-max(time_s - self._time_s, 0.0) / self.tau_s)
            self.value = tuple(
                old + weight * (new - old) for old, new in zip(self.value, sample, strict=True)
            )
        self._time_s = time_s


@dataclass(frozen=True)
class _Line:
    """Answer length as a line in prompt length, fitted over windows."""

    r2: float
    slope: float
    mean_isl: float
    mean_osl: float
    isl_sd: float

    def reaches(self, isl: float) -> bool:
        """Whether `isl` lies within the prompt lengths the line was fitted on (else it says nothing
        about that window: a swing to a mix not seen yet)."""
        return abs(isl - self.mean_isl) <= COUPLING_REACH_SD * self.isl_sd

    def osl_at(self, isl: float) -> float:
        """The answer length on the line, for a prompt length inside the reach of those seen."""
        reach = COUPLING_REACH_SD * self.isl_sd
        inside = min(max(isl, self.mean_isl - reach), self.mean_isl + reach)
        return max(1.0, self.mean_osl + self.slope * (inside - self.mean_isl))


@dataclass
class _LengthCoupling:
    """How the windows' mean answer length moved with their mean prompt length over the last `tau_s`
    (exponentially weighted least squares).

    With two request classes (long prompts with short answers, short prompts with long answers) each
    window's means lie on the line between the two classes' means, whatever the mix. A window's prompt
    length, counted at arrival, says the mix at once; its answer length, counted at completion, trails
    by a session; averaging both over minutes describes a mix of long prompts *and* long answers after
    every swing. On the line, the window's prompt length gives both.
    """

    tau_s: float
    _sums: tuple[float, ...] = (0.0,) * 6  # weight, Σx, Σy, Σx², Σxy, Σy²
    _time_s: float | None = None
    _prompts: deque[tuple[float, float]] = field(default_factory=deque)  # (time, prompt length) over tau_s
    _last: tuple[float, float] | None = None  # the window before's lengths

    def update(self, time_s: float, isl: float, osl: float) -> None:
        """Add a window, if it is steady (`STEADY_SHARE`): in a swing only the ends are on the line."""
        last, self._last = self._last, (isl, osl)
        if (
            last is None
            or abs(isl - last[0]) > STEADY_SHARE * last[0]
            or abs(osl - last[1]) > STEADY_SHARE * last[1]
        ):
            return
        keep = 1.0 if self._time_s is None else math.exp(-max(time_s - self._time_s, 0.0) / self.tau_s)
        sample = (1.0, isl, osl, isl * isl, isl * osl, osl * osl)
        self._sums = tuple(keep * old + new for old, new in zip(self._sums, sample, strict=True))
        self._time_s = time_s
        self._prompts.append((time_s, isl))
        while self._prompts[0][0] < time_s - self.tau_s:
            self._prompts.popleft()

    def ends(self, line: _Line) -> tuple[tuple[float, float], ...]:
        """(prompt, answer) lengths on the line at the shortest and the longest window prompt length
        of the last `tau_s`: the two ends the mix has swung between."""
        prompts = [isl for _, isl in self._prompts] or [line.mean_isl]
        return tuple((isl, line.osl_at(isl)) for isl in (min(prompts), max(prompts)))

    def line(self) -> _Line | None:
        """The fitted line; None before MIN_COUPLING_WINDOWS windows' weight or while either length
        has moved by less than MOVED_SHARE of its mean."""
        weight, sx, sy, sxx, sxy, syy = self._sums
        if weight < MIN_COUPLING_WINDOWS:
            return None
        mx, my = sx / weight, sy / weight
        vx, vy, cxy = sxx / weight - mx * mx, syy / weight - my * my, sxy / weight - mx * my
        if vx <= (MOVED_SHARE * mx) ** 2 or vy <= (MOVED_SHARE * my) ** 2:
            return None
        return _Line(cxy * cxy / (vx * vy), cxy / vx, mx, my, math.sqrt(vx))


@dataclass
class _Converted:
    taker: int  # the pool that grew
    settled_s: float | None = None  # the first decision after it with neither pool in flight


class XpydPolicy(LayeredPolicy):
    name = "xpyd"

    def __init__(self, context: PolicyContext, config: XpydConfig) -> None:
        self.context = context
        self.config = config
        self._slo = Slo(
            ttft=context.ttft_slo_s,
            tpot=context.tpot_slo_s,
            transfer_budget=config.transfer_budget_s or None,
            ttft_quantile=config.ttft_quantile or None,
            context_quantile=config.context_quantile or None,
        )
        self._pools = PoolConfig(
            prefill_gpus=context.prefill_gpus_per_instance,
            decode_gpus=context.decode_gpus_per_instance,
            step_overhead=context.step_overhead_s,
            remote_overhead=config.remote_overhead_s,
            request_flow=context.request_flow,
        )
        self._layers = config.layers(context.prefill_gpus_per_instance, context.decode_gpus_per_instance)
        self._guards = (InFlightGuard(config.in_flight_timeout_s), InFlightGuard(config.in_flight_timeout_s))
        self._lengths = _Smoothed(config.length_smoothing_s)
        coupled = config.length_coupling_r2 > 0 and config.length_smoothing_s > 0
        self._coupling = _LengthCoupling(config.length_smoothing_s) if coupled else None
        self._converted: _Converted | None = None  # the last conversion this policy asked for
        self._decided = (context.initial_prefill, context.initial_decode)  # the last counts asked for
        self._forecast = RateForecast(config.forecast_horizon_s) if config.forecast_horizon_s else None
        self._lead_times = LeadTimes(config.in_flight_timeout_s)
        self._last_prompts: tuple[float, float] | None = None  # (time, the window's mean prompt length)
        self._decode_ttft_blamed_s: float | None = None  # when a TTFT miss was last decode's
        self._end_floors_of: tuple[_Demand, tuple[int, int]] | None = None  # this decision's `_end_floors`
        self._kv_batch: tuple[float, float] | None = None  # (time, batch) decode's full KV last measured
        self._spread = SpreadCalibration(config.spread_floor, config.spread_calibration_s)
        self._prefill_ready_since: tuple[int, float] | None = None  # (ready prefill, since when)

    def use_gpu(self, gpu: GpuSpec) -> None:
        """Size with these efficiencies from the next decision on; every window and guard is kept."""
        self.context = dataclasses.replace(self.context, gpu=gpu)

    def _demand(self, observation: Observation) -> _Demand | str:
        """What to size for, or the CamelCase reason why there is nothing trustworthy to size for.

        The rate is the window's own (so a step is seen at once); lengths and the hit rate drift slowly
        and are noisy in a short window, so they are smoothed over `length_smoothing_s` — unless the
        answer length has followed the prompt length closely (r² ≥ `length_coupling_r2`): then the
        window's prompt length and spread are used, with the answer length on the fitted line
        (`_LengthCoupling`: a mixture of request classes is sized for the window's mix).
        """
        rate, time_s = observation.arrival_rate, observation.time_s
        if rate is None or not math.isfinite(rate) or rate < 0:
            return "MissingArrivalRate"
        isl, osl = observation.mean_input_tokens, observation.mean_output_tokens
        partial = False
        window_prompts: tuple[float, float | None] | None = None  # this window's prompt mean and sd
        newest: float | None = None  # the newest arrivals' prompt length, when longer (_newest_prompts)
        if _usable(isl) and _usable(osl):
            isl_std = osl_std = 0.0
            if _usable(observation.p90_input_tokens):
                isl_std = std_from_quantile(isl, observation.p90_input_tokens, LENGTH_QUANTILE)
            if _usable(observation.p90_output_tokens):
                osl_std = std_from_quantile(osl, observation.p90_output_tokens, LENGTH_QUANTILE)
            hit = observation.prefix_hit_rate
            hit_rate = min(max(hit, 0.0), 0.99) if hit is not None and math.isfinite(hit) else 0.0
            self._lengths.update(observation.time_s, (isl, osl, isl_std, osl_std, hit_rate))
            window_prompts = (isl, isl_std if _usable(observation.p90_input_tokens) else None)
            newest = self._newest_prompts(observation, isl)
            line = None
            if self._coupling is not None:  # the line of the windows before: one odd window draws none
                line = self._coupling.line()
                self._coupling.update(time_s, isl, osl)
            if line is not None and line.r2 >= self.config.length_coupling_r2 and line.reaches(isl):
                assert self._lengths.value is not None and self._coupling is not None, "updated above"
                _, _, smoothed_isl_std, osl_std, hit_rate = self._lengths.value
                spread = isl_std if window_prompts[1] is not None else smoothed_isl_std
                ahead, falling = self._ahead(time_s, rate)
                ends = self._coupling.ends(line)
                osl_now = line.osl_at(isl)
                newer = (newest, spread) if newest is not None else None
                return _Demand(
                    ahead,
                    rate,
                    isl,
                    osl_now,
                    spread,
                    osl_std,
                    hit_rate,
                    False,
                    line.r2,
                    ends,
                    falling=falling,
                    prefill_isl=newer,
                    newest=newer is not None,
                )
        elif rate > 0:
            if self._lengths.value is None:
                return "MissingRequestLengths"
            partial = True
        if self._lengths.value is None:  # zero traffic before any request was ever seen
            return _Demand(0.0, 0.0, 1.0, 1.0, 0.0, 0.0, hit_rate=0.0, partial=False)
        isl, osl, isl_std, osl_std, hit_rate = self._lengths.value
        prefill_isl = None
        if window_prompts is not None and self.config.prefill_window_lengths:
            window_isl, window_std = window_prompts
            window_isl = window_isl if newest is None else newest
            if abs(window_isl - isl) > self.config.tolerance * isl:  # beyond the band: the mix moved
                prefill_isl = (window_isl, isl_std if window_std is None else window_std)
        ahead, falling = self._ahead(time_s, rate)
        on_newest = prefill_isl is not None and newest is not None
        return _Demand(
            ahead,
            rate,
            isl,
            osl,
            isl_std,
            osl_std,
            hit_rate,
            partial,
            prefill_isl=prefill_isl,
            falling=falling,
            newest=on_newest,
        )

    def _newest_prompts(self, observation: Observation, isl: float) -> float | None:
        """The mean prompt length of the requests that arrived since the last window, when longer than
        the window's by more than `tolerance` (else None).

        The window's mean is a sliding mean over `window_s`: when the mix swings to longer prompts it
        shows a quarter of the swing one interval in (20 s window, 5 s interval) while the prefill
        queue already grows with the whole. The difference between two windows is the slice that
        entered less the slice that left; taking the slice that left at the earlier window's mean, the
        newest slice's mean is the earlier mean plus the difference × window / interval. Only once
        the window itself is above the `tolerance` band around the averaged prompt length (the
        difference of two windows is noisy: a fourfold of each slice's noise), and only longer
        prompts count (the work prefill must meet now; a swing to shorter prompts is met by the
        window as before, on the way down): reason `PrefillOnNewestPrompts`, the length in details
        `prefill_input_tokens`.
        """
        last, self._last_prompts = self._last_prompts, (observation.time_s, isl)
        averaged = self._lengths.value[0] if self._lengths.value is not None else isl
        if last is None or not self.config.prefill_window_lengths:
            return None
        if isl <= averaged * (1 + self.config.tolerance):  # the window itself has not left the band
            return None
        since = observation.time_s - last[0]
        if not 0 < since < observation.window_s:
            return None
        newest = last[1] + (isl - last[1]) * observation.window_s / since
        return newest if newest > isl * (1 + self.config.tolerance) else None

    def _ahead(self, time_s: float, rate: float) -> tuple[float, _Falling | None]:
        """The rate to size for, and whether the load is falling.

        The rate is the window's plus the forecast's rise over `forecast_horizon_s` (a rising load is
        met when the instances added now are up) when that rise is beyond the tolerance band (a flat,
        noisy rate forecasts small rises and falls by turns); never below the window's rate, so the
        forecast never scales down, and never at zero traffic. The load is falling when the forecast's
        fall over the horizon exceeds `falling_load_scatter` times the rate's scatter around the
        forecast (on the simulator's flat loads the damped trend's fall stays below 0.3 of it in 99 % of
        the decisions; on the compressed drift day's afternoon it exceeds 0.5 in about 80 %).
        """
        if self._forecast is None:
            return rate, None
        self._forecast.add(time_s, rate)
        rise, scatter = self._forecast.rise(), self._forecast.scatter()
        if rise is None or rate == 0:
            return rate, None
        threshold = self.config.falling_load_scatter
        falling = None
        if threshold and scatter is not None and -rise > threshold * scatter:
            falling = _Falling(-rise, scatter)
        if rise <= self.config.tolerance * rate:
            return rate, falling
        return rate + rise, falling

    @staticmethod
    def _measured(observation: Observation) -> DecodeMeasurement:
        """The decode pool's measured step time and the requests on it now (running + waiting).

        The model times sessions with whichever is longer, prediction or measurement: the roofline
        leaves out what a live pool adds (slower steps, admission waits when the KV is full, this
        window's output mix where the sizing smooths lengths over minutes).
        """
        step, running = observation.tpot_mean_s, observation.decode_running
        sessions = None
        if running is not None and math.isfinite(running) and running >= 0:
            waiting = observation.decode_waiting
            sessions = running + (
                waiting if waiting is not None and math.isfinite(waiting) and waiting > 0 else 0.0
            )
        return DecodeMeasurement(step_seconds=step if _usable(step) else None, sessions=sessions)

    def _plan(self, demand: _Demand, measured: DecodeMeasurement) -> tuple[Plan, int]:
        """Plans for demand and for demand plus the scale-in margin (× `tolerance`; on a falling load
        at most two scatters of the rate), in one call, and where prefill's two entries start: 0, or
        2 when `demand.prefill_isl` sizes prefill (two more entries at it). Prompt spreads carry the
        learned factor (`_calibrate_spread`): prefill's TTFT sizing reads them, and decode only with
        `context_quantile`."""
        margin = self.config.tolerance * demand.rate
        if demand.falling is not None:
            margin = min(margin, FALLING_MARGIN_SCATTERS * demand.falling.scatter)
        rates = [demand.rate, demand.rate + margin]
        factor = self._spread.factor
        isl, isl_std = [demand.isl] * 2, [demand.isl_std * factor] * 2
        if demand.prefill_isl is not None:
            rates += rates
            isl += [demand.prefill_isl[0]] * 2
            isl_std += [demand.prefill_isl[1] * factor] * 2
        workload = Workload(
            rate=np.array(rates),
            isl=np.array(isl),
            osl=demand.osl,
            hit_rate=demand.hit_rate,
            isl_std=np.array(isl_std),
            osl_std=demand.osl_std,
        )
        ctx = self.context
        plan = size_pools(
            ctx.model, ctx.gpu, ctx.link, workload, self._slo, pools=self._pools, measured=measured
        )
        return plan, 0 if demand.prefill_isl is None else 2

    def _lengths_settle_s(self, observation: Observation) -> float:
        """How long a new policy keeps the sizes it found. Lengths are measured on completed requests,
        and right after a fleet starts serving only its short requests have completed: the lengths read
        short (censored) until it has served about two p90 decode sessions (p90 output tokens × the
        measured time per output token). At most one down window, which is also the answer when
        either reading is missing."""
        p90_output, tpot = observation.p90_output_tokens, observation.tpot_mean_s
        if p90_output is None or tpot is None:
            return self.config.down_window_s
        return min(self.config.down_window_s, 2 * p90_output * tpot)

    def decide(self, observation: Observation, limits: Limits) -> Decision:
        validate_limits(limits, self.context.prefill_gpus_per_instance, self.context.decode_gpus_per_instance)
        time_s = observation.time_s
        self._lead_times.observe(time_s, (observation.prefill.ready, observation.decode.ready))
        supply, held, reasons = [], [], []
        for role, guard, pool in (
            ("Prefill", self._guards[0], observation.prefill),
            ("Decode", self._guards[1], observation.decode),
        ):
            count, hold, why = guard.supply(time_s, pool)
            supply.append(count)
            held.append(hold)
            reasons.append(why and role + why)
        demand = self._demand(observation)
        if isinstance(demand, str):
            return Decision(None, None, binding="missing_data", reasons=(demand, *filter(None, reasons)))
        details: dict[str, float] = {
            "arrival_rate": demand.measured_rate,
            "sized_arrival_rate": demand.rate,
            "mean_input_tokens": demand.isl,
            "mean_output_tokens": demand.osl,
            "prefix_hit_rate": demand.hit_rate,
            "prefill_supply": float(supply[0]),
            "decode_supply": float(supply[1]),
        }
        if demand.rate > demand.measured_rate:
            reasons.append("SizedForForecastLoad")
        if demand.falling is not None:
            reasons.append("LoadFalling")
            details["forecast_fall"], details["rate_scatter"] = demand.falling.fall, demand.falling.scatter
        if demand.newest:
            reasons.append("PrefillOnNewestPrompts")
        if demand.coupling_r2 is not None:
            reasons.append("LengthsFromWindowMix")
            details["length_coupling_r2"] = demand.coupling_r2
        measured = self._measured(observation)
        for key, value in (
            ("measured_tpot_seconds", measured.step_seconds),
            ("measured_decode_sessions", measured.sessions),
        ):
            if value is not None:
                details[key] = value
        self._calibrate_spread(observation, demand, measured, details, reasons)
        floors, down_targets, bindings = self._targets(demand, measured, details, reasons)
        floors = self._decode_within_ends(demand, floors, details, reasons)
        floors, down_targets = self._decode_on_measured_kv(
            observation, floors, down_targets, details, reasons
        )
        if limits.gpu_budget is not None:
            floors, down_targets = self._decode_on_held_sessions(
                demand,
                measured=measured,
                floors=floors,
                down_targets=down_targets,
                details=details,
                reasons=reasons,
            )
        self._grow_while_in_flight(floors, supply, held, reasons)
        prefill_busy = details.get("prefill_load", 0.0) / max(supply[0], 1)
        missed = self._blame_latency_misses(
            observation, decode_short=supply[1] < floors[1], prefill_busy=prefill_busy, reasons=reasons
        )
        recommended = []
        for index, role in enumerate(("Prefill", "Decode")):
            if supply[index] < floors[index]:
                recommended.append(floors[index])
                reasons.append(f"{role}BelowModelFloor")
            elif supply[index] > down_targets[index] and not demand.partial:
                recommended.append(down_targets[index])
                reasons.append(f"{role}AboveNeed")
            else:
                recommended.append(supply[index])
                reasons.append(
                    f"{role}PartialDataNoScaleDown" if demand.partial else f"{role}WithinTolerance"
                )
            if index in missed and supply[index] >= floors[index] and not held[index]:
                recommended[index] = supply[index] + 1
                reasons.append(missed[index])
        if not demand.partial:
            self._swing_headroom(
                demand,
                recommended=recommended,
                supply=supply,
                limits=limits,
                details=details,
                reasons=reasons,
            )
        details["inputs_settle_seconds"] = self._lengths_settle_s(observation)
        layered = self._layers.apply(
            time_s,
            (supply[0], supply[1]),
            (recommended[0], recommended[1]),
            limits,
            (held[0], held[1]),
            falling=demand.falling is not None and not demand.partial,
            settle_s=details["inputs_settle_seconds"],
        )
        decided = [layered.prefill, layered.decode]
        if self.context.prefill_gpus_per_instance == self.context.decode_gpus_per_instance:
            # A pool that is not asking to grow may give away anything above its model floor.
            keep = [
                want if demand.partial or want > have else floor
                for want, have, floor in zip(recommended, supply, floors, strict=True)
            ]
            # Under a GPU budget a pool can grow only by what the other gives up: growth the budget
            # trimmed still asks for a conversion (the total stays what the budget allowed).
            maxima = (limits.prefill_max, limits.decode_max)
            denied = [
                max(0, min(want, high) - got) if layered.bound == "gpu_budget" and not hold else 0
                for want, high, got, hold in zip(recommended, maxima, decided, held, strict=True)
            ]
            lead = self._lead_times.seconds
            for kind, key in (
                (COLD_START, "measured_cold_start_seconds"),
                (CONVERSION, "measured_conversion_seconds"),
            ):
                if kind in lead:
                    details[key] = lead[kind]
            cold = bool(self.config.measured_growth) and self._lead_times.cold_start_faster()
            released = _release_for_conversion(
                supply, keep, decided, held, limits, denied=denied, cold_start_faster=cold
            )
            hold_s = max(self.config.down_window_s, observation.window_s)
            kept = self._hold_converted(
                time_s, hold_s=hold_s, held=held, supply=supply, floors=floors, decided=decided, limits=limits
            )
            reasons.append(kept or released)
        self._decided = (decided[0], decided[1])
        self._lead_times.asked(time_s, (supply[0], supply[1]), self._decided)
        return Decision(
            prefill=decided[0],
            decode=decided[1],
            binding=layered.bound or f"prefill_{bindings[0]}+decode_{bindings[1]}",
            reasons=tuple(r for r in (*reasons, *layered.reasons) if r),
            details=details,
        )

    def _decode_on_measured_kv(
        self,
        observation: Observation,
        floors: tuple[int, int],
        down_targets: tuple[int, int],
        details: dict[str, float],
        reasons: list[str],
    ) -> tuple[tuple[int, int], tuple[int, int]]:
        """Decode's floor at the batch its KV measures to hold, when that is below the model's cap.

        The model's batch cap divides an instance's KV by a session's mean resident context, from the
        answer lengths measured. Answers are counted when they finish, so while decode fills (the first
        minute of traffic, or a swing to longer answers) the answers measured are the short ones, and the
        requests decode holds are the long ones: they hold more KV each than the model assumes, and the
        pool is full at fewer requests than its cap (in `make demo`, 27-30 per instance at 94-100 % KV
        against a cap of 32, with requests waiting: decode stayed at 2 while its floor read 1.9).
        Once the serving instances' KV usage reaches `decode_measured_kv`, the requests running per
        full instance's worth of KV is the batch an instance holds; when it is below the model's cap,
        the floor is the model's concurrency (which counts the requests on decode now) at that batch
        (reason `DecodeSizedOnMeasuredKv`, details `decode_measured_batch`, `decode_kv_floor`). Only
        ever raises decode's floor, and only while its KV is that full; the scale-down target keeps
        the measured batch a while after (`_down_on_measured_kv`).
        """
        threshold, pool = self.config.decode_measured_kv, observation.decode
        usage, running = observation.decode_kv_usage, observation.decode_running
        cap, concurrency = details.get("decode_batch_cap", 0.0), details.get("concurrency", 0.0)
        if (
            threshold == 0
            or pool.ready == 0
            or usage is None
            or running is None
            or not (math.isfinite(usage) and math.isfinite(running))
            or not (cap > 0 and concurrency > 0)
        ):
            return floors, down_targets
        # the average counts a starting instance as empty (as `_decode_kv_at` does)
        instances = pool.ready + pool.starting
        batch = running / (usage * instances) if usage > 0 else cap
        if not self._decode_kv_at(observation, threshold) or not 0 < batch < cap:
            return floors, self._down_on_measured_kv(observation, down_targets, details, reasons)
        self._kv_batch = (observation.time_s, batch)
        need = math.ceil(concurrency / batch)
        if need <= floors[1]:
            return floors, down_targets
        details["decode_measured_batch"] = batch
        details["decode_kv_floor"] = details["decode_floor"] = float(need)
        reasons.append("DecodeSizedOnMeasuredKv")
        return (floors[0], need), (down_targets[0], max(down_targets[1], need))

    def _down_on_measured_kv(
        self,
        observation: Observation,
        down_targets: tuple[int, int],
        details: dict[str, float],
        reasons: list[str],
    ) -> tuple[int, int]:
        """Decode's scale-down target at the batch its KV last measured to hold while full, for the
        down window (or the rate window, if longer) after: the instances the measured batch asked for
        lower the usage below the threshold, and the model's cap would then take them back at once
        (`make demo`: decode 2 → 4 at 25-30 s, back to 3 at 45 s, up to 5 again at 70-75 s, all in
        the first phase). Reason `DecodeHeldOnMeasuredKv`."""
        remembered, concurrency = self._kv_batch, details.get("concurrency", 0.0)
        hold_s = max(self.config.down_window_s, observation.window_s)
        if remembered is None or observation.time_s - remembered[0] >= hold_s or not concurrency > 0:
            return down_targets
        keep = math.ceil(concurrency * (1 + self.config.tolerance) / remembered[1])
        if keep <= down_targets[1]:
            return down_targets
        details["decode_measured_batch"] = remembered[1]
        reasons.append("DecodeHeldOnMeasuredKv")
        return down_targets[0], keep

    def _calibrate_spread(
        self,
        observation: Observation,
        demand: _Demand,
        measured: DecodeMeasurement,
        details: dict[str, float],
        reasons: list[str],
    ) -> None:
        """Learn the factor on the prompt spread from the measured TTFT p90 (`SpreadCalibration`).

        A window teaches only when its TTFT is prefill's to explain: the prefill pool has served it
        unchanged for the whole window (no instance starting or draining), it has traffic, lengths
        and a TTFT p90, and decode holds nothing back (no requests waiting on decode, KV below
        `decode_kv_full`). The model is then evaluated on that pool at the window's own prompt mean
        and p90 spread and the measured rate. A TTFT p90 above `latency_feedback` × SLO puts the
        full spread back at once (reason `PromptSpreadReset`); otherwise the factor moves towards
        the one that explains the measurement. While the factor is below 1 the sizing uses it (reason
        `PromptSpreadFromMeasuredTtft`, details `prompt_spread_factor` and, for a window that taught,
        `prompt_spread_target` and `ttft_p90_model_seconds`, the model's p90 at the full spread).
        """
        spread, time_s, pool = self._spread, observation.time_s, observation.prefill
        if not spread.active:
            return
        ready_since = self._prefill_ready_since
        if ready_since is None or ready_since[0] != pool.ready or pool.starting or pool.draining:
            ready_since = self._prefill_ready_since = (pool.ready, time_s)
        ttft, isl, p90 = observation.ttft_p90_s, observation.mean_input_tokens, observation.p90_input_tokens
        rate = demand.measured_rate
        waiting = observation.decode_waiting
        target = None
        if (
            _usable(ttft)
            and _usable(isl)
            and _usable(p90)
            and rate > 0
            and not demand.partial
            and not (pool.starting or pool.draining)
            and time_s - ready_since[1] >= observation.window_s
            and pool.ready > 0
            and not (waiting is not None and math.isfinite(waiting) and waiting >= 1)
            and not self._decode_kv_full(observation)
        ):
            if self._missed(ttft, self.context.ttft_slo_s):
                spread.reset(time_s)
                reasons.append("PromptSpreadReset")
            else:
                sd = std_from_quantile(isl, p90, LENGTH_QUANTILE)
                workload = Workload(
                    rate=rate,
                    isl=isl,
                    osl=demand.osl,
                    hit_rate=demand.hit_rate,
                    isl_std=sd * spread.grid(),
                    osl_std=demand.osl_std,
                )
                ctx = self.context
                predicted = prefill_ttft_quantile(
                    ctx.model,
                    ctx.gpu,
                    ctx.link,
                    workload,
                    self._slo,
                    instances=pool.ready,
                    quantile=CALIBRATION_QUANTILE,
                    pools=self._pools,
                    measured=measured,
                )
                target = spread.target(ttft, predicted)
                details["prompt_spread_target"] = target
                details["ttft_p90_model_seconds"] = float(predicted[-1])
        spread.update(time_s, target)
        if spread.factor < 1:
            details["prompt_spread_factor"] = spread.factor
            reasons.append("PromptSpreadFromMeasuredTtft")

    def _decode_on_held_sessions(
        self,
        demand: _Demand,
        *,
        measured: DecodeMeasurement,
        floors: tuple[int, int],
        down_targets: tuple[int, int],
        details: dict[str, float],
        reasons: list[str],
    ) -> tuple[tuple[int, int], tuple[int, int]]:
        """After a swing to longer prompts, decode's floor from the requests it holds, if fewer.

        Prefill then sizes on the window's prompt length (beyond the tolerance band above the averaged
        one), but the averaged answer length still describes the mix before: answers are counted at
        completion, and the long ones finish for minutes. Sized on it, decode keeps (or grows to) the
        instances the old mix needed, and under a GPU budget takes them from prefill, which needs them
        now. What decode must hold is what it holds: its running and waiting requests at the batch
        cap the model gives (reason `DecodeSizedOnHeldRequests`, details `decode_held_floor`). Only
        ever lowers decode's floor, and only while prompts are longer than the averaged mix.
        """
        prefill_isl, sessions = demand.prefill_isl, measured.sessions
        cap = details.get("decode_batch_cap", 0.0)
        if (
            not self.config.prefill_window_lengths
            or prefill_isl is None
            or prefill_isl[0] <= demand.isl
            or sessions is None
            or not cap > 0
        ):
            return floors, down_targets
        held = max(1, math.ceil(sessions / cap))
        if held >= floors[1]:
            return floors, down_targets
        details["decode_held_floor"] = float(held)
        details["decode_floor"] = float(held)
        reasons.append("DecodeSizedOnHeldRequests")
        return (floors[0], held), (down_targets[0], min(down_targets[1], held))

    def _grow_while_in_flight(
        self, floors: tuple[int, int], supply: list[int], held: list[bool], reasons: list[str]
    ) -> None:
        """Let a held pool grow when even what is on its way leaves it below its model floor.

        The in-flight guard holds a pool while instances start or drain, so latency feedback and the
        tolerance band do not act twice on metrics that have not seen those instances yet. Growth to the
        model floor is different: the floor comes from the window's arrival rate and lengths, which the
        instances on their way do not change, and they are counted (starting, and converting into the
        pool, count as supply; so does the count last asked for, which the driver may not show yet). At
        a swing the pool short of capacity would otherwise wait out a whole conversion drain (a decode
        instance finishing long answers: tens of seconds) before it may ask for more (reason
        `<Role>GrowsWhileInFlight`).
        """
        for index, role in enumerate(("Prefill", "Decode")):
            on_the_way = max(supply[index], self._decided[index])
            if held[index] and floors[index] > on_the_way:
                supply[index], held[index] = on_the_way, False
                reasons.append(f"{role}GrowsWhileInFlight")

    def _end_floors(self, demand: _Demand) -> tuple[int, int]:
        """Each pool's model floor at the more demanding of the mix's two ends, at today's rate: the
        far end's prompt spread scaled with its length, the model's decode prediction (this window's
        decode measurement describes this mix, not that one). Sized once per decision: the decode
        floor within the ends and the swing headroom both ask for it."""
        if self._end_floors_of is not None and self._end_floors_of[0] is demand:
            return self._end_floors_of[1]
        far = [0, 0]
        for isl, osl in demand.ends:
            spread = demand.isl_std * isl / demand.isl
            end = dataclasses.replace(demand, isl=isl, osl=osl, isl_std=spread, prefill_isl=None)
            plan, _ = self._plan(end, DecodeMeasurement())
            if plan.decode_feasible[0]:
                far = [
                    max(far[0], int(plan.prefill_instances[0])),
                    max(far[1], int(plan.decode_instances[0])),
                ]
        self._end_floors_of = (demand, (far[0], far[1]))
        return far[0], far[1]

    def _decode_within_ends(
        self, demand: _Demand, floors: tuple[int, int], details: dict[str, float], reasons: list[str]
    ) -> tuple[int, int]:
        """In a window between the mix's two ends, decode's floor at most the more demanding end's.

        A window in a swing holds both request classes; sized as one class of its mean lengths it pairs
        long prompts with long answers (a session of mean prompt and mean answer length holds more KV
        than the classes' sessions do on average: the long answers belong to the short prompts), and
        asked for more decode than either end needs. What a mix of two classes needs is linear in the
        mix, so never more than the more demanding end (reason `DecodeFloorWithinMixEnds`, details
        `decode_ends_floor`). Windows at an end keep their own floor (and their decode measurement).
        """
        if not demand.ends or demand.coupling_r2 is None or demand.rate == 0:
            return floors
        (low, _), (high, _) = demand.ends
        band = self.config.tolerance
        if not low * (1 + band) < demand.isl < high * (1 - band):
            return floors
        far = self._end_floors(demand)
        if not 0 < far[1] < floors[1]:
            return floors
        details["decode_ends_floor"] = details["decode_floor"] = float(far[1])
        reasons.append("DecodeFloorWithinMixEnds")
        return floors[0], far[1]

    def _swing_headroom(
        self,
        demand: _Demand,
        *,
        recommended: list[int],
        supply: list[int],
        limits: Limits,
        details: dict[str, float],
        reasons: list[str],
    ) -> None:
        """Raise a pool towards what the other end of the mix would need, with GPUs the budget leaves.

        The windows' lengths lie on a line between two request classes (`_LengthCoupling`); the mix has
        swung between its two ends (`_Demand.ends`) over `length_smoothing_s`. When it swings back, the
        pool that end needs must grow faster than conversion (a drain of long answers) or a cold start
        can deliver. Under a GPU budget the GPUs the current mix leaves unused cost the deployment
        nothing it has not reserved, so they wait in that pool (reason `<Role>HeadroomForMixSwing`,
        details `<role>_swing_floor`): the pool that needs more now is sized first, the headroom only
        fills what the budget leaves, and it is the first thing released for conversion when the mix
        swings. The far end is sized at today's rate, its prompt spread scaled with its length, and the
        model's decode prediction (this window's decode measurement describes this mix, not that one).

        Before the mix has shown two ends (a fresh or restarted policy, a mix that has not moved over
        `length_smoothing_s`) the other end is unknown, and the spare GPUs wait in prefill up to its
        maximum, then in decode (reason `<Role>HeadroomForUnseenMix`): a prefill instance is the
        fastest to hand over (its requests finish within a prefill, where a decode instance first
        finishes its longest answer), so decode growth takes it by conversion in seconds, and prefill
        is the pool a swing to longer prompts loads at once (its backlog stays on the instances it was
        dispatched to). Spread evenly over both pools instead, decode's share could not move at the
        demo's first swing (docs/BENCHMARKS.md). The other pool counts at most at its maximum: a
        floor above it is not GPUs it will hold.
        """
        budget = limits.gpu_budget
        if not self.config.swing_headroom or budget is None or demand.rate == 0:
            return
        maxima = (limits.prefill_max, limits.decode_max)
        if demand.ends:
            far, why = self._end_floors(demand), "HeadroomForMixSwing"
            order = sorted((0, 1), key=lambda i: recommended[i] - far[i])
        else:  # prefill first, up to its maximum; what is left then waits in decode
            far, why, order = maxima, "HeadroomForUnseenMix", [0, 1]
        details["prefill_swing_floor"], details["decode_swing_floor"] = float(far[0]), float(far[1])
        gpus = (self.context.prefill_gpus_per_instance, self.context.decode_gpus_per_instance)
        for pool in order:
            other = 1 - pool  # the headroom never makes the other pool shrink: it only takes free GPUs
            holds = max(min(recommended[other], maxima[other]), supply[other])
            room = (budget - holds * gpus[other]) // gpus[pool]
            target = min(far[pool], room, maxima[pool])
            if target > recommended[pool]:
                recommended[pool] = target
                reasons.append(f"{('Prefill', 'Decode')[pool]}{why}")

    def _hold_converted(
        self,
        time_s: float,
        *,
        hold_s: float,
        held: list[bool],
        supply: list[int],
        floors: tuple[int, int],
        decided: list[int],
        limits: Limits,
    ) -> str:
        """Undo a conversion back soon after the last one, unless the mix really reversed.

        A conversion is one pool shrinking while the other grows (the driver converts then), whether the
        release paired them or the GPU budget took one pool's growth out of the other. Both skip the down
        window, so right after a conversion a latency blip could send the instance straight back (P→D,
        then D→P 20 s later). So a pool that took instances keeps them until `hold_s` (the down window,
        or the rate window if longer: the metrics must have seen the converted instance serve) after the
        conversion settled (neither pool in flight), unless the pool they came from is below its model
        floor; the other pool's growth is then trimmed to the budget (a cold start instead, if there is
        room).
        """
        last = self._converted
        if last is not None and last.settled_s is None and not any(held):
            last.settled_s = time_s
        grows = [want > have for want, have in zip(decided, supply, strict=True)]
        shrinks = [want < have for want, have in zip(decided, supply, strict=True)]
        if not (grows[0] and shrinks[1]) and not (grows[1] and shrinks[0]):
            return ""
        taker = 0 if grows[0] else 1
        if (
            last is not None
            and last.taker == 1 - taker
            and (last.settled_s is None or time_s - last.settled_s < hold_s)
            and supply[taker] >= floors[taker]
        ):
            keeper = 1 - taker
            decided[keeper] = supply[keeper]
            gpus = (self.context.prefill_gpus_per_instance, self.context.decode_gpus_per_instance)
            trimmed = enforce_limits((supply[0], supply[1]), (decided[0], decided[1]), limits, *gpus)
            decided[0], decided[1] = trimmed.prefill, trimmed.decode
            return f"{('Prefill', 'Decode')[keeper]}KeepsConvertedInstances"
        self._converted = _Converted(taker)
        return ""

    def _blame_latency_misses(
        self, observation: Observation, *, decode_short: bool, prefill_busy: float, reasons: list[str]
    ) -> dict[int, str]:
        """Pool index → reason, for each measured p90 above `latency_feedback` × SLO (model too optimistic).

        A TPOT miss is decode's. A TTFT miss is prefill's unless the decode pool's KV cache is full
        (`decode_kv_full`), decode is below its model floor (`decode_short`), or requests wait on
        decode while prefill has no queue to speak of (`_decode_admission_waits`: a paged KV cache
        admits new requests before its usage reaches `decode_kv_full`, then preempts): then requests
        wait for decode admission after their prefill, and another prefill instance would only deliver
        them to the same busy decode pool faster. Within one rate window after a TTFT miss was decode's,
        a TTFT miss that none of these explains any more is nobody's: the window's p90 still holds the
        first tokens that waited on decode (reason `TtftMissesOfDecodeInWindow`); in `make demo` prefill
        grew for them once decode had caught up, and shrank back in the same phase.
        """
        if self.config.latency_feedback == 0:
            return {}
        blamed = {}
        if self._missed(observation.tpot_p90_s, self.context.tpot_slo_s):
            blamed[1] = "DecodeSloMissedAboveFloor"
        if self._missed(observation.ttft_p90_s, self.context.ttft_slo_s):
            if self._decode_kv_full(observation):
                blamed.setdefault(1, "DecodeKvFullTtftMissed")
            elif decode_short:
                blamed.setdefault(1, "DecodeShortTtftMissed")
            elif self._decode_admission_waits(observation, prefill_busy):
                blamed.setdefault(1, "DecodeWaitingTtftMissed")
            elif (
                self._decode_ttft_blamed_s is not None
                and observation.time_s - self._decode_ttft_blamed_s < observation.window_s
            ):
                reasons.append("TtftMissesOfDecodeInWindow")  # the window still holds decode's misses
                return blamed
            else:
                blamed[0] = "PrefillSloMissedAboveFloor"
            if 1 in blamed and blamed[1] != "DecodeSloMissedAboveFloor":
                self._decode_ttft_blamed_s = observation.time_s
        return blamed

    @staticmethod
    def _decode_admission_waits(observation: Observation, prefill_busy: float) -> bool:
        """Requests wait on decode (for KV room or their KV pull) while prefill has less than one
        request waiting per ready instance, or while the model has prefill less than half busy
        (`prefill_busy`: its load over its supply) and its queue is then decode's back-pressure (a
        prefill instance holds each finished prompt's KV until decode pulls it): TTFT is then spent
        waiting for decode, not for prefill."""
        waiting, queue = observation.decode_waiting, observation.prefill_queue
        if waiting is None or queue is None or not (math.isfinite(waiting) and math.isfinite(queue)):
            return False
        return waiting >= 1 and (queue < max(observation.prefill.ready, 1) or prefill_busy < BUSY_SHARE)

    def _decode_kv_full(self, observation: Observation) -> bool:
        """Decode KV usage at `decode_kv_full` or above (`_decode_kv_at`)."""
        return self._decode_kv_at(observation, self.config.decode_kv_full)

    @staticmethod
    def _decode_kv_at(observation: Observation, share: float) -> bool:
        """Decode KV usage at `share` or above (0: never), over the instances that can hold KV.

        A starting instance holds none yet: where the average counts it as empty, the threshold is
        scaled by the ready share, so one new instance does not hide that the serving ones are full.
        """
        usage, pool = observation.decode_kv_usage, observation.decode
        if share == 0 or usage is None or not math.isfinite(usage) or pool.ready == 0:
            return False
        return usage >= share * pool.ready / (pool.ready + pool.starting)

    def _missed(self, measured: float | None, slo: float) -> bool:
        return (
            measured is not None and math.isfinite(measured) and measured > self.config.latency_feedback * slo
        )

    def _targets(
        self, demand: _Demand, measured: DecodeMeasurement, details: dict[str, float], reasons: list[str]
    ) -> tuple[tuple[int, int], tuple[int, int], tuple[str, str]]:
        """(floor, scale-down target, binding) per pool, filling `details` with the model's predictions.

        One decode plan, at the TPOT SLO: the model caps batches at the SLO and times sessions at the
        step of that batch, t_step(B_cap). (Trying 39 tighter step budgets per decision picked a cheaper
        plan in about 1 % of decisions and moved no benchmark result outside its confidence interval:
        docs/BENCHMARKS.md, policy variants.)
        """
        if demand.rate == 0:
            reasons.append("ZeroTraffic")
            return (0, 0), (0, 0), ("zero_traffic", "zero_traffic")
        plan, first = self._plan(demand, measured)
        floors = (int(plan.prefill_instances[first]), int(plan.decode_instances[0]))
        down = (int(plan.prefill_instances[first + 1]), int(plan.decode_instances[1]))
        for keys, at in ((PREFILL_PREDICTIONS, first), (DECODE_PREDICTIONS, 0)):
            for key in keys:
                details[key] = float(getattr(plan, key)[at])
        details["predicted_tpot_seconds"] = details.pop("decode_step_seconds")
        if demand.prefill_isl is not None:
            details["prefill_input_tokens"] = demand.prefill_isl[0]
        details["prefill_floor"], details["decode_floor"] = float(floors[0]), float(floors[1])
        details["prefill_down_target"], details["decode_down_target"] = float(down[0]), float(down[1])
        session_reason = SESSION_REASONS.get(str(plan.decode_session_source[0]))
        if session_reason:
            reasons.append(session_reason)
        if not plan.ttft_feasible[first]:
            reasons.append("TtftSloBelowModelFloor")
        if not plan.decode_feasible[0]:
            # The decode side cannot be built (weights do not fit): never size it to 0 because of that.
            reasons.append("DecodeInfeasible")
            floors, down = (floors[0], 0), (down[0], 1 << 30)
        return floors, down, (str(plan.prefill_binding[first]), str(plan.decode_batch_bound[0]))


def _release_for_conversion(
    supply: list[int],
    keep: list[int],
    decided: list[int],
    held: list[bool],
    limits: Limits,
    *,
    denied: list[int],
    cold_start_faster: bool = False,
) -> str:
    """Let a pool with a surplus give instances to a pool that grows now, instead of after its window.

    The surplus is supply above `keep`: the model floor (the size that meets current demand) for a
    pool not asking to grow. That is below the tolerance band's scale-down target on purpose: the band
    guards a pool against flapping through cold starts, but here the instance is not deleted, it
    converts in place (seconds) where the other pool would otherwise cold-start one (minutes). When
    the mix drifts, the pool losing demand sits inside its band while the other crosses its floor, so
    releasing only what the band calls unneeded would almost never pair. Only between pools of equal
    GPU width, where conversion is possible at all.

    `denied` is growth per pool that the GPU budget trimmed away: with the budget spent, the growing
    pool gets exactly what the other releases (so the total never exceeds what the budget allowed).
    With `cold_start_faster` (cold starts measured to serve sooner than conversions) only that
    budget-trimmed growth pairs: growth the budget has room for cold-starts (reason
    `<Role>GrowsByColdStart`, the growing pool), and the surplus goes on its own down window.
    """
    minimums = (limits.prefill_min, limits.decode_min)
    for grow, shrink, role in ((0, 1, "Decode"), (1, 0, "Prefill")):
        growth = max(0, decided[grow] - supply[grow]) + denied[grow]
        surplus = min(decided[shrink], supply[shrink]) - max(keep[shrink], minimums[shrink])
        if cold_start_faster and growth > denied[grow] and surplus > 0 and not held[shrink]:
            if denied[grow] == 0:
                return f"{('Prefill', 'Decode')[grow]}GrowsByColdStart"
            growth = denied[grow]
        if growth > 0 and surplus > 0 and not held[shrink]:
            moves = min(growth, surplus)
            decided[shrink] = min(decided[shrink], supply[shrink]) - moves
            decided[grow] += min(moves, denied[grow])
            return f"{role}ReleasedForConversion"
    return ""


def make_xpyd(context: PolicyContext) -> XpydPolicy:
    return XpydPolicy(context, configure("xpyd", XpydConfig(), context.knobs))
