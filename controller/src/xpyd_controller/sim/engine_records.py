"""What the event loop hands back: per-request records, fleet samples and the policy's decisions.

The summary (results.py) turns a RawRun into percentiles, goodput and time series.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from xpyd_controller.policy.types import Decision

# Called at each scrape with (simulated time, requests finished, requests in all).
ProgressFn = Callable[[float, int, int], None]


@dataclass(frozen=True)
class PoolSample:
    """Fleet composition and load at one scrape (what the time series and the policy see)."""

    time_s: float
    prefill_ready: int
    prefill_starting: int
    prefill_draining: int
    decode_ready: int
    decode_starting: int
    decode_draining: int
    prefill_queue: float
    decode_running: float
    decode_kv_usage: float
    decode_waiting: float  # requests waiting for KV room on decode


@dataclass(frozen=True)
class RawRun:
    """Everything one run produced, before summarising: per-request records and fleet samples."""

    first_token_s: list[float]
    finish_s: list[float]
    max_gap_s: list[float]
    gap_histogram: dict[int, int]
    end_s: float
    gpu_seconds: float
    samples: tuple[PoolSample, ...]
    decisions: tuple[tuple[float, Decision], ...]
    scale_ups: int
    scale_downs: int
    conversions: int
    events: int
