"""Clamping desired pool sizes to the deployment's bounds: per-role min/max, then the GPU budget."""

from __future__ import annotations

from dataclasses import dataclass

from xpyd_api.errors import InputError
from xpyd_controller.policy.types import Limits


class LimitsError(InputError):
    """Limits that no allocation can satisfy; names the field, value and rule."""

    def __init__(self, field: str, value: object, rule: str) -> None:
        super().__init__(field, value, rule, message=f"limits.{field} = {value!r}: {rule}")


def validate_limits(limits: Limits, prefill_gpus: int, decode_gpus: int) -> None:
    """Reject bounds that contradict each other, so clamping always has an answer."""
    for role in ("prefill", "decode"):
        low, high = getattr(limits, f"{role}_min"), getattr(limits, f"{role}_max")
        if low < 0:
            raise LimitsError(f"{role}_min", low, "must be >= 0")
        if high < low:
            raise LimitsError(f"{role}_max", high, f"must be >= {role}_min = {low}")
    if limits.gpu_budget is not None:
        floor = limits.prefill_min * prefill_gpus + limits.decode_min * decode_gpus
        if limits.gpu_budget < floor:
            raise LimitsError("gpu_budget", limits.gpu_budget, f"must cover the minimum pools ({floor} GPUs)")


@dataclass(frozen=True)
class Clamped:
    """Counts after clamping, and CamelCase reasons for every bound that moved them."""

    prefill: int
    decode: int
    reasons: tuple[str, ...]

    @property
    def binding(self) -> str:
        """The bound that changed the answer ("" if none did)."""
        if "LimitedByGpuBudget" in self.reasons:
            return "gpu_budget"
        if self.reasons:
            return "min_max"
        return ""


def clamp(prefill: int, decode: int, limits: Limits, prefill_gpus: int, decode_gpus: int) -> Clamped:
    """Apply min/max per role, then shrink to the GPU budget keeping the two pools' proportions.

    Over budget, the pool with the larger share of its own request gives up one instance at a time,
    so both end as close to their desired size, relatively, as the budget allows.
    """
    validate_limits(limits, prefill_gpus, decode_gpus)
    reasons: list[str] = []
    want_prefill = min(max(prefill, limits.prefill_min), limits.prefill_max)
    want_decode = min(max(decode, limits.decode_min), limits.decode_max)
    for role, asked, got, low in (
        ("Prefill", prefill, want_prefill, limits.prefill_min),
        ("Decode", decode, want_decode, limits.decode_min),
    ):
        if got != asked:
            reasons.append(f"{role}{'RaisedToMin' if got == low and asked < low else 'LimitedByMax'}")
    budget = limits.gpu_budget
    x, y = want_prefill, want_decode
    if budget is not None and x * prefill_gpus + y * decode_gpus > budget:
        reasons.append("LimitedByGpuBudget")
        while x * prefill_gpus + y * decode_gpus > budget:
            shrink_prefill = x > limits.prefill_min and (
                y <= limits.decode_min or (x - 1) / want_prefill >= (y - 1) / want_decode
            )
            if shrink_prefill:
                x -= 1
            else:
                y -= 1
    return Clamped(x, y, tuple(reasons))
