"""`threshold`: one HPA/KEDA/AIBrix-style autoscaler per pool, each blind to the other.

Prefill scales on waiting requests per instance (a KEDA queue scaler), decode on KV-cache usage (an
AIBrix-style utilisation target) or, when `decode_running_target` is set, on running requests per
instance. desired = ceil(ready × metric/target), skipped inside the ±tolerance band, then the usual
stabilisation windows, min/max and rate limits. Its weakness is the point of the baseline: the pools
never coordinate, react only after queues or KV have built up, and never convert roles.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from xpyd_controller.policy.context import PolicyContext, configure
from xpyd_controller.policy.layers import LayeredPolicy, ScalingBehavior, require_in
from xpyd_controller.policy.limits import validate_limits
from xpyd_controller.policy.types import Decision, Limits, Observation, PoolState


@dataclass(frozen=True)
class ThresholdConfig(ScalingBehavior):
    """Targets and HPA behaviour; defaults follow the Kubernetes HPA where it has one."""

    prefill_queue_target: float = 2.0  # waiting requests per ready prefill instance
    decode_kv_target: float = 0.7  # fraction of KV cache in use per decode instance
    decode_running_target: float = 0.0  # running requests per decode instance; > 0 replaces the KV target
    tolerance: float = 0.1
    down_percent: float = 100.0  # the HPA's default scale-down policy: 100 % per 15 s
    up_period_s: float = 15.0
    down_period_s: float = 15.0

    def __post_init__(self) -> None:
        self.check_behavior("threshold")
        require_in("threshold", "prefill_queue_target", self.prefill_queue_target, 0, open_low=True)
        require_in("threshold", "decode_kv_target", self.decode_kv_target, 0, 1, open_low=True)
        require_in("threshold", "decode_running_target", self.decode_running_target, 0)
        require_in("threshold", "tolerance", self.tolerance, 0, 0.99)


def _recommend(role: str, pool: PoolState, usage_ratio: float | None, tolerance: float) -> tuple[int, str]:
    """HPA's rule: ceil(ready × usage/target) outside the tolerance band; hold without data."""
    current = pool.ready + pool.starting
    if usage_ratio is None:
        return current, f"{role}MetricMissing"  # missing data never scales (down or up)
    if abs(usage_ratio - 1.0) <= tolerance:
        return current, f"{role}WithinTolerance"
    if pool.ready == 0:
        # Nothing ready to measure: any demand means one more instance, none means keep what is coming.
        return (
            (current + 1, f"{role}AboveTarget") if usage_ratio > 0 else (current, f"{role}NoReadyInstances")
        )
    desired = math.ceil(pool.ready * usage_ratio - 1e-9)
    return desired, f"{role}{'AboveTarget' if desired > current else 'BelowTarget'}"


def _zero_if_idle(value: float | None, observation: Observation) -> float | None:
    """No traffic is no demand, not missing data."""
    return 0.0 if value is None and observation.arrival_rate == 0.0 else value


class ThresholdPolicy(LayeredPolicy):
    name = "threshold"

    def __init__(self, config: ThresholdConfig, prefill_gpus: int = 1, decode_gpus: int = 1) -> None:
        self.config = config
        self.prefill_gpus = prefill_gpus
        self.decode_gpus = decode_gpus
        self._layers = config.layers(prefill_gpus, decode_gpus)

    def _prefill_ratio(self, observation: Observation) -> float | None:
        queue = _zero_if_idle(observation.prefill_queue, observation)
        if queue is None:
            return None
        return queue / max(observation.prefill.ready, 1) / self.config.prefill_queue_target

    def _decode_ratio(self, observation: Observation) -> float | None:
        if self.config.decode_running_target > 0:
            running = _zero_if_idle(observation.decode_running, observation)
            if running is None:
                return None
            return running / max(observation.decode.ready, 1) / self.config.decode_running_target
        usage = _zero_if_idle(observation.decode_kv_usage, observation)
        return None if usage is None else usage / self.config.decode_kv_target

    def decide(self, observation: Observation, limits: Limits) -> Decision:
        validate_limits(limits, self.prefill_gpus, self.decode_gpus)
        reasons: list[str] = []
        details: dict[str, float] = {}
        recommended: list[int] = []
        for role, pool, ratio in (
            ("Prefill", observation.prefill, self._prefill_ratio(observation)),
            ("Decode", observation.decode, self._decode_ratio(observation)),
        ):
            count, why = _recommend(role, pool, ratio, self.config.tolerance)
            recommended.append(count)
            reasons.append(why)
            if ratio is not None:
                details[f"{role.lower()}_usage_ratio"] = ratio
            details[f"{role.lower()}_recommended"] = float(count)
        current = (
            observation.prefill.ready + observation.prefill.starting,
            observation.decode.ready + observation.decode.starting,
        )
        # Like the HPA, which records the current replicas as its first recommendation of an object.
        layered = self._layers.apply(
            observation.time_s,
            current,
            (recommended[0], recommended[1]),
            limits,
            settle_s=self.config.down_window_s,
        )
        return Decision(
            prefill=layered.prefill,
            decode=layered.decode,
            binding=layered.bound or "per_pool_targets",
            reasons=(*reasons, *layered.reasons),
            details=details,
            allow_conversion=False,
        )


def make_threshold(context: PolicyContext) -> ThresholdPolicy:
    config = configure("threshold", ThresholdConfig(), context.knobs)
    return ThresholdPolicy(config, context.prefill_gpus_per_instance, context.decode_gpus_per_instance)
