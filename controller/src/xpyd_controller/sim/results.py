"""Summaries of a run: goodput, latency percentiles, GPU-hours, scaling activity and a time series.

Plain Python over the per-request lists (numpy only for percentiles of very large samples, see
`seed_percentile`): a seed-table run never loads numpy.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from xpyd_controller.sim.config import GoodputSlo

if TYPE_CHECKING:  # the compiled build runs; the source engine need not even load
    from xpyd_controller.sim.engine import RawRun
from xpyd_controller.sim.stats import seed_percentile, weighted_bin_percentile
from xpyd_controller.sim.traces import Trace


@dataclass(frozen=True)
class SeriesPoint:
    """One interval of the run, for plots: traffic, fleet, and latency of the requests that arrived."""

    start_s: float
    arrival_rate: float
    mean_input_tokens: float
    mean_output_tokens: float
    prefill_ready: int
    decode_ready: int
    instances_paid: int  # ready, starting and draining instances (× GPUs per instance = GPUs paid for)
    ttft_p50_s: float
    ttft_p99_s: float
    tpot_p50_s: float
    tpot_p99_s: float
    goodput: float


@dataclass(frozen=True)
class SimResult:
    """Headline metrics of one run (seconds, fractions) plus its time series."""

    requests: int
    goodput: float  # fraction meeting every SLO bound that is set
    goodput_ttft_tpot: float  # TTFT and mean time per output token (TPOT bound: 100 ms if unset)
    goodput_max_gap: float  # the seed's: TTFT and largest token gap (bound: 100 ms if unset)
    ttft_p50: float
    ttft_p90: float
    ttft_p99: float
    tpot_p50: float
    tpot_p99: float
    tbt_p50: float
    tbt_p99: float
    tokens_per_gpu_second: float
    gpu_hours: float
    good_requests_per_gpu_hour: float
    duration_s: float
    scale_ups: int
    scale_downs: int
    conversions: int
    oscillations: int
    events: int
    series: tuple[SeriesPoint, ...]

    def summary(self) -> dict[str, float | int]:
        """The flat metrics `xpyd simulate --json` prints (everything except the series)."""
        flat = asdict(self)
        del flat["series"]
        return flat


_DEFAULT_PER_TOKEN_BOUND_S = 0.1


def time_to_first_token(requests: Trace, raw: RawRun) -> list[float]:
    return [
        first - arrival for first, arrival in zip(raw.first_token_s, requests.columns.arrival_s, strict=True)
    ]


def time_per_output_token(requests: Trace, raw: RawRun) -> list[float]:
    """Mean gap after the first token; 0 for single-token outputs (they have no gaps)."""
    return [
        (finish - first) / (tokens - 1) if tokens > 1 else 0.0
        for finish, first, tokens in zip(
            raw.finish_s, raw.first_token_s, requests.columns.output_tokens, strict=True
        )
    ]


def _good(ttft: list[float], tpot: list[float], raw: RawRun, slo: GoodputSlo) -> list[bool]:
    """Requests meeting TTFT and every per-token bound the SLO sets."""
    good = [t <= slo.ttft_s for t in ttft]
    if slo.tpot_s is not None:
        good = [g and t <= slo.tpot_s for g, t in zip(good, tpot, strict=True)]
    if slo.max_token_gap_s is not None:
        good = [g and gap <= slo.max_token_gap_s for g, gap in zip(good, raw.max_gap_s, strict=True)]
    return good


def count_oscillations(raw: RawRun) -> int:
    """Direction reversals of a pool's desired size (up then down, or down then up) across decisions."""
    reversals = 0
    for role in ("prefill", "decode"):
        last_value: int | None = None
        last_direction = 0
        for _, decision in raw.decisions:
            value = getattr(decision, role)
            if value is None:
                continue
            if last_value is not None and value != last_value:
                direction = 1 if value > last_value else -1
                if last_direction and direction != last_direction:
                    reversals += 1
                last_direction = direction
            last_value = value
    return reversals


def summarise(requests: Trace, raw: RawRun, slo: GoodputSlo, series_interval_s: float = 60.0) -> SimResult:
    ttft = time_to_first_token(requests, raw)
    tpot = time_per_output_token(requests, raw)
    good = _good(ttft, tpot, raw, slo)
    bound = slo.tpot_s or _DEFAULT_PER_TOKEN_BOUND_S
    good_tpot = sum([t <= slo.ttft_s and p <= bound for t, p in zip(ttft, tpot, strict=True)])
    gap_bound = slo.max_token_gap_s or _DEFAULT_PER_TOKEN_BOUND_S
    good_gap = sum([t <= slo.ttft_s and g <= gap_bound for t, g in zip(ttft, raw.max_gap_s, strict=True)])
    n = len(requests)
    gpu_hours = raw.gpu_seconds / 3600.0
    outputs = requests.columns.output_tokens
    multi = [p for p, tokens in zip(tpot, outputs, strict=True) if tokens > 1]
    good_count = sum(good)
    return SimResult(
        requests=n,
        goodput=good_count / n,
        goodput_ttft_tpot=good_tpot / n,
        goodput_max_gap=good_gap / n,
        ttft_p50=seed_percentile(ttft, 0.5),
        ttft_p90=seed_percentile(ttft, 0.9),
        ttft_p99=seed_percentile(ttft, 0.99),
        tpot_p50=seed_percentile(multi, 0.5),
        tpot_p99=seed_percentile(multi, 0.99),
        tbt_p50=weighted_bin_percentile(raw.gap_histogram, 0.5),
        tbt_p99=weighted_bin_percentile(raw.gap_histogram, 0.99),
        tokens_per_gpu_second=sum(outputs) / raw.gpu_seconds,
        gpu_hours=gpu_hours,
        good_requests_per_gpu_hour=good_count / gpu_hours,
        duration_s=raw.end_s,
        scale_ups=raw.scale_ups,
        scale_downs=raw.scale_downs,
        conversions=raw.conversions,
        oscillations=count_oscillations(raw),
        events=raw.events,
        series=_series(requests, raw=raw, ttft=ttft, tpot=tpot, good=good, interval_s=series_interval_s),
    )


def _series(
    requests: Trace,
    *,
    raw: RawRun,
    ttft: list[float],
    tpot: list[float],
    good: list[bool],
    interval_s: float,
) -> tuple[SeriesPoint, ...]:
    arrival, prompts, outputs = (
        requests.columns.arrival_s,
        requests.columns.prompt_tokens,
        requests.columns.output_tokens,
    )
    horizon = arrival[-1]
    sample_times = [s.time_s for s in raw.samples]
    points = []
    for index in range(int(horizon // interval_s) + 1):
        start = index * interval_s
        lo, hi = bisect_left(arrival, start), bisect_left(arrival, start + interval_s)
        at = bisect_right(sample_times, start + interval_s) - 1
        sample = raw.samples[max(0, at)] if raw.samples else None
        count = hi - lo
        prefill = sample.prefill_ready if sample else 0
        decode = sample.decode_ready if sample else 0
        busy = (
            prefill
            + decode
            + sample.prefill_starting
            + sample.decode_starting
            + sample.prefill_draining
            + sample.decode_draining
            if sample
            else 0
        )
        points.append(
            SeriesPoint(
                start_s=start,
                arrival_rate=count / interval_s,
                mean_input_tokens=sum(prompts[lo:hi]) / count if count else math.nan,
                mean_output_tokens=sum(outputs[lo:hi]) / count if count else math.nan,
                prefill_ready=prefill,
                decode_ready=decode,
                instances_paid=busy,
                ttft_p50_s=seed_percentile(ttft[lo:hi], 0.5),
                ttft_p99_s=seed_percentile(ttft[lo:hi], 0.99),
                tpot_p50_s=seed_percentile(tpot[lo:hi], 0.5),
                tpot_p99_s=seed_percentile(tpot[lo:hi], 0.99),
                goodput=sum(good[lo:hi]) / count if count else math.nan,
            )
        )
    return tuple(points)


def recovery_time_s(result: SimResult, after_s: float, goodput_target: float = 0.99) -> float:
    """Seconds from `after_s` (e.g. a load step) until every later interval meets the goodput target.

    Intervals without arrivals count as met; `inf` if the run never recovers.
    """
    later = [p for p in result.series if p.start_s >= after_s]
    recovered_at = math.inf
    for point in reversed(later):
        if not math.isnan(point.goodput) and point.goodput < goodput_target:
            break
        recovered_at = point.start_s
    return max(0.0, recovered_at - after_s) if later else math.inf
