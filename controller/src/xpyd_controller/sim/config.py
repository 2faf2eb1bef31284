"""What the fleet simulator simulates: hardware, fleet shape, realism switches, SLOs and traffic.

Everything is a frozen dataclass validated at construction, so the event loop never re-checks input.
Defaults reproduce the seed article's idealised fleet; each realism switch is off until set.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from xpyd_api.errors import InputError
from xpyd_controller.model.specs import GpuSpec, LinkSpec, ModelSpec

Mode = Literal["colocated", "disagg"]


class SimConfigError(InputError):
    """A rejected simulator input, naming the field, the value and the rule it broke."""


def _require(condition: bool, field_name: str, value: object, rule: str) -> None:
    if not condition:
        raise SimConfigError(field_name, value, rule)


def _finite_at_least(field_name: str, value: float, low: float) -> None:
    ok = isinstance(value, int | float) and math.isfinite(value) and value >= low
    _require(ok, field_name, value, f"must be a finite number >= {low:g}")


@dataclass(frozen=True)
class Hardware:
    """Model, GPU and link the capacity model's roofline times; `prefill_chunks` splits co-located prefill."""

    model: ModelSpec
    gpu: GpuSpec
    link: LinkSpec
    step_overhead_s: float = 0.0
    prefill_chunks: int = 4
    gpus_per_instance: int = 1

    def __post_init__(self) -> None:
        _finite_at_least("step_overhead_s", self.step_overhead_s, 0.0)
        _require(
            isinstance(self.prefill_chunks, int) and self.prefill_chunks >= 1,
            "prefill_chunks",
            self.prefill_chunks,
            "must be an integer >= 1",
        )
        _require(
            isinstance(self.gpus_per_instance, int) and self.gpus_per_instance >= 1,
            "gpus_per_instance",
            self.gpus_per_instance,
            "must be an integer >= 1",
        )


@dataclass(frozen=True)
class Realism:
    """Switches beyond the seed's idealised fleet; the defaults turn every one of them off.

    - `kv_capacity`: decode (and co-located) instances admit a request only if its prompt+output KV
      fits in `kv_memory_fraction` of the HBM left after the weights; others wait (backpressure).
    - `shared_link_bandwidth`: all concurrent KV transfers share this many bytes/s (processor
      sharing), each also capped by the per-request link bandwidth. None = no contention.
    - `layerwise_transfer`: the transfer streams while the prefill computes; only the last layer's
      share (or whatever the link could not keep up with) is exposed after the prefill ends.
    - `prefix_cache`: a request's `prefix_hit_tokens` (from its trace) need no prefill compute.
    - `local_prefill_threshold`: prompts whose uncached part is shorter are prefilled on the decode
      instance itself (conditional disaggregation). None = always remote.
    - `decode_kv_reads`: decode steps also read every member's resident KV (the model's memory term).
    - `cold_start_s`, `conversion_s`: delay before a new instance, or a drained instance switching
      roles, serves. Scale-in and conversion always drain first (until nothing is in flight), then
      wait `drain_s` more (deregistration, grace period), still paid for.
    """

    kv_capacity: bool = False
    kv_memory_fraction: float = 0.9
    shared_link_bandwidth: float | None = None
    layerwise_transfer: bool = False
    prefix_cache: bool = True
    local_prefill_threshold: int | None = None
    decode_kv_reads: bool = False
    cold_start_s: float = 0.0
    conversion_s: float = 0.0
    drain_s: float = 0.0

    def __post_init__(self) -> None:
        _require(
            0 < self.kv_memory_fraction <= 1,
            "kv_memory_fraction",
            self.kv_memory_fraction,
            "must be in (0, 1]",
        )
        if self.shared_link_bandwidth is not None:
            _finite_at_least("shared_link_bandwidth", self.shared_link_bandwidth, 1.0)
        if self.local_prefill_threshold is not None:
            _require(
                isinstance(self.local_prefill_threshold, int) and self.local_prefill_threshold >= 0,
                "local_prefill_threshold",
                self.local_prefill_threshold,
                "must be an integer >= 0 (tokens) or null",
            )
        _finite_at_least("cold_start_s", self.cold_start_s, 0.0)
        _finite_at_least("conversion_s", self.conversion_s, 0.0)
        _finite_at_least("drain_s", self.drain_s, 0.0)


@dataclass(frozen=True)
class GoodputSlo:
    """A request is good when its TTFT and every set per-token bound hold.

    The seed counts a request good on TTFT and its *largest* gap between tokens (`max_token_gap_s`);
    serving SLOs usually bound the mean time per output token (`tpot_s`). Set either or both.
    """

    ttft_s: float = 0.6
    tpot_s: float | None = None
    max_token_gap_s: float | None = 0.1

    def __post_init__(self) -> None:
        _finite_at_least("ttft_s", self.ttft_s, 1e-9)
        if self.tpot_s is not None:
            _finite_at_least("tpot_s", self.tpot_s, 1e-9)
        if self.max_token_gap_s is not None:
            _finite_at_least("max_token_gap_s", self.max_token_gap_s, 1e-9)


@dataclass(frozen=True)
class Fleet:
    """The fleet at t=0: co-located GPUs (`decode` counts them) or `prefill` + `decode` instances."""

    mode: Mode
    prefill: int
    decode: int

    def __post_init__(self) -> None:
        _require(self.mode in ("colocated", "disagg"), "mode", self.mode, "must be colocated or disagg")
        if self.mode == "colocated":
            _require(self.prefill == 0, "prefill", self.prefill, "must be 0 in colocated mode")
            _require(self.decode >= 1, "fleet", (self.prefill, self.decode), "needs >= 1 GPU")
        else:
            _require(
                self.prefill >= 1 and self.decode >= 1,
                "fleet",
                (self.prefill, self.decode),
                "a disaggregated fleet needs >= 1 prefill and >= 1 decode instance",
            )


@dataclass(frozen=True)
class Control:
    """How the policy in the loop sees the fleet: scrape cadence, averaging window, metrics lag."""

    scrape_interval_s: float = 15.0
    window_s: float = 60.0
    lag_s: float = 15.0
    # The deployment can convert in place (compatible role templates); each Decision says if it may.
    role_conversion: bool = False

    def __post_init__(self) -> None:
        _finite_at_least("scrape_interval_s", self.scrape_interval_s, 1e-3)
        _finite_at_least("window_s", self.window_s, 1e-3)
        _finite_at_least("lag_s", self.lag_s, 0.0)


@dataclass(frozen=True)
class SimConfig:
    """One simulation: hardware, initial fleet, realism, SLOs and the control loop's view."""

    hardware: Hardware
    fleet: Fleet
    realism: Realism = field(default_factory=Realism)
    slo: GoodputSlo = field(default_factory=GoodputSlo)
    control: Control = field(default_factory=Control)
