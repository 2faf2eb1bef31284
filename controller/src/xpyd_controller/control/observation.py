"""Query answers + pool states → the policy's `Observation`, filled as the simulator fills it (pure).

`None` is "no data" and stays `None`: a failed query never becomes 0. A rate of 0 is real (no traffic);
a mean over no requests is unknown (None), as in the simulator's `_observe`. A value outside what any
fleet can physically produce (1e308 requests/s, a KV usage of 40, a negative queue) is no data too: one
corrupt series must never size a pool (see `implausible_signals`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from xpyd_controller.control.promql import POLICY_SIGNALS, Signal
from xpyd_controller.model.calibration import LiveWindow
from xpyd_controller.policy.types import Observation, PoolState

Answers = Mapping[Signal, float | None]

_RATE = 1e7  # requests (or tokens, below) per second: far above any one deployment
_TOKENS_RATE = 1e10
_TOKENS = 1e8  # tokens in one request
_REQUESTS = 1e8  # requests queued or running
_SECONDS = 1e5  # a latency percentile

# The physical range of each signal: a value outside it is corrupt, not load.
PLAUSIBLE: Mapping[Signal, tuple[float, float]] = {
    Signal.ARRIVAL_RATE: (0.0, _RATE),
    Signal.PREFILL_FINISHED_RATE: (0.0, _RATE),
    Signal.INPUT_TOKENS_RATE: (0.0, _TOKENS_RATE),
    Signal.INPUT_TOKENS_P90: (0.0, _TOKENS),
    Signal.OUTPUT_REQUESTS_RATE: (0.0, _RATE),
    Signal.OUTPUT_TOKENS_RATE: (0.0, _TOKENS_RATE),
    Signal.OUTPUT_TOKENS_P90: (0.0, _TOKENS),
    Signal.PREFIX_QUERIES_RATE: (0.0, _TOKENS_RATE),
    Signal.PREFIX_HITS_RATE: (0.0, _TOKENS_RATE),
    Signal.PREFILL_QUEUE: (0.0, _REQUESTS),
    Signal.DECODE_RUNNING: (0.0, _REQUESTS),
    Signal.DECODE_WAITING: (0.0, _REQUESTS),
    Signal.DECODE_KV_USAGE: (0.0, 1.5),  # a fraction; engines briefly report a little above 1
    Signal.TTFT_P90: (0.0, _SECONDS),
    Signal.TPOT_P90: (0.0, _SECONDS),
    Signal.PREFILL_TTFT_MEAN: (0.0, _SECONDS),
    Signal.TPOT_MEAN: (0.0, _SECONDS),
}


def plausible(signal: Signal, value: float) -> bool:
    low, high = PLAUSIBLE[signal]
    return math.isfinite(value) and low <= value <= high


def implausible_signals(answers: Answers) -> list[Signal]:
    """Policy signals that answered with a value no fleet produces (they are treated as missing)."""
    return [s for s in POLICY_SIGNALS if (v := answers.get(s)) is not None and not plausible(s, v)]


def sanitized(answers: Answers) -> dict[Signal, float | None]:
    """The answers with every implausible value replaced by None (no data)."""
    return {s: (v if v is not None and plausible(s, v) else None) for s, v in answers.items()}


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    """numerator/denominator, or None when either is unknown or nothing was counted."""
    if numerator is None or denominator is None or denominator <= 0:
        return None
    return numerator / denominator


def missing_signals(answers: Answers) -> list[Signal]:
    """Policy signals without data, in a stable order (for status and the missing-data counter)."""
    return [signal for signal in POLICY_SIGNALS if answers.get(signal) is None]


def build_observation(
    answers: Answers, prefill: PoolState, decode: PoolState, time_s: float, window_s: float
) -> Observation:
    """The Observation for one decision; lengths and hit rate are ratios of windowed rates."""
    value = answers.get
    arrivals = value(Signal.ARRIVAL_RATE)
    return Observation(
        time_s=time_s,
        window_s=window_s,
        prefill=prefill,
        decode=decode,
        arrival_rate=arrivals,
        mean_input_tokens=_ratio(value(Signal.INPUT_TOKENS_RATE), value(Signal.PREFILL_FINISHED_RATE)),
        mean_output_tokens=_ratio(value(Signal.OUTPUT_TOKENS_RATE), value(Signal.OUTPUT_REQUESTS_RATE)),
        prefix_hit_rate=_ratio(value(Signal.PREFIX_HITS_RATE), value(Signal.PREFIX_QUERIES_RATE)),
        p90_input_tokens=value(Signal.INPUT_TOKENS_P90),
        p90_output_tokens=value(Signal.OUTPUT_TOKENS_P90),
        prefill_queue=value(Signal.PREFILL_QUEUE),
        decode_running=value(Signal.DECODE_RUNNING),
        decode_kv_usage=value(Signal.DECODE_KV_USAGE),
        ttft_p90_s=value(Signal.TTFT_P90),
        tpot_p90_s=value(Signal.TPOT_P90),
        tpot_mean_s=value(Signal.TPOT_MEAN),
        decode_waiting=value(Signal.DECODE_WAITING),
    )


def live_window(answers: Answers, observation: Observation) -> LiveWindow:
    """The online calibration's numbers for one window, per instance (None where unmeasured).

    Prefill: the prefill pool's mean TTFT is its compute time only while no request waits (then the
    tokens computed are the mean prompt less its prefix-cache hits). Decode: the mean time between
    tokens is one step of a batch of the running requests per ready instance, each holding about its
    prompt and half its output in KV.
    """
    idle = observation.prefill_queue is not None and observation.prefill_queue < 0.5
    isl, osl = observation.mean_input_tokens, observation.mean_output_tokens
    hit = observation.prefix_hit_rate or 0.0
    ready = observation.decode.ready
    running = observation.decode_running
    return LiveWindow(
        prefill_tokens=None if isl is None else isl * (1.0 - hit),
        prefill_seconds=answers.get(Signal.PREFILL_TTFT_MEAN) if idle else None,
        decode_batch=None if running is None or ready < 1 else running / ready,
        decode_context=None if isl is None or osl is None else isl + osl / 2.0,
        decode_step_seconds=answers.get(Signal.TPOT_MEAN),
    )
