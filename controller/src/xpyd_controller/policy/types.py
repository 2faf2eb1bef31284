"""The contract between a policy and whatever drives it (live controller or fleet simulator).

Both drivers build the same `Observation` at a scrape cadence and apply the same `Decision`, so a policy
benchmarked in the simulator is the policy that ships. `None` always means "no data" (a failed or empty
query); zero traffic is reported as 0.0, never as None.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True)
class PoolState:
    """Instances of one role as the driver sees them at observation time."""

    ready: int
    starting: int = 0  # scheduled or warming: expected supply, not yet serving
    draining: int = 0  # leaving (scale-in or conversion source)
    gpus_per_instance: int = 1


@dataclass(frozen=True)
class Observation:
    """What the driver measured over the last window (rates per second, lengths in tokens)."""

    time_s: float
    window_s: float
    prefill: PoolState
    decode: PoolState
    arrival_rate: float | None  # requests/s arriving (admitted or received), not completions
    mean_input_tokens: float | None
    mean_output_tokens: float | None
    prefix_hit_rate: float | None = None  # fraction of prompt tokens served from cache
    p90_input_tokens: float | None = None
    p90_output_tokens: float | None = None
    prefill_queue: float | None = None  # requests waiting for prefill
    decode_running: float | None = None  # requests in decode batches
    decode_kv_usage: float | None = None  # 0..1 of KV capacity in use, averaged over decode instances
    ttft_p90_s: float | None = None
    tpot_p90_s: float | None = None
    tpot_mean_s: float | None = None  # mean time per output token on decode (its step time)
    decode_waiting: float | None = None  # requests queued on decode instances (for KV room or the pull)


@dataclass(frozen=True)
class Limits:
    """Bounds every policy must respect (from the PDDeployment spec)."""

    prefill_min: int = 1
    prefill_max: int = 64
    decode_min: int = 1
    decode_max: int = 64
    gpu_budget: int | None = None


@dataclass(frozen=True)
class Decision:
    """Desired instance counts and why. `None` for a role means "no opinion: keep what you have"."""

    prefill: int | None
    decode: int | None
    binding: str = ""  # the constraint that set the size, e.g. "prefill_ttft_p90", "decode_kv_capacity"
    reasons: tuple[str, ...] = ()
    details: dict[str, float] = field(default_factory=dict)  # model inputs and predictions, for status
    # May the driver meet "one pool shrinks while the other grows" by converting instances in place?
    # False for baselines that model systems without conversion: they drain, delete and cold-start.
    allow_conversion: bool = True


class Policy(Protocol):
    """An autoscaling policy. Stateful policies keep their windows internally; `decide` has no I/O."""

    name: str

    def decide(self, observation: Observation, limits: Limits) -> Decision: ...


@runtime_checkable
class Resumable(Protocol):
    """A policy whose state can be kept outside it (the PDDeployment's status) and handed to a new
    instance, which then decides exactly as the old one would have (`policy.state` reads it back)."""

    def state(self) -> dict[str, Any]:
        """Everything the next decision depends on, as JSON (objects, lists, numbers, booleans, null)."""
        ...

    def resume(self, state: Mapping[str, Any] | None, now_s: float) -> str:
        """Continue from a kept `state` at `now_s`; None when it is lost (a restart, or a policy rebuilt
        for a new spec: hold what is found for a window). Returns "" when resumed, else why the state
        was ignored (a `StateError`'s text; the policy then acts as if it were lost)."""
        ...
