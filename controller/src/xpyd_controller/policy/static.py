"""`static`: a fixed prefill:decode split, the baseline every autoscaler must beat."""

from __future__ import annotations

from xpyd_controller.policy.context import PolicyContext
from xpyd_controller.policy.limits import clamp
from xpyd_controller.policy.types import Decision, Limits, Observation


class StaticPolicy:
    """Always asks for the split it was built with (clamped to the limits); ignores traffic."""

    name = "static"

    def __init__(self, prefill: int, decode: int, prefill_gpus: int = 1, decode_gpus: int = 1) -> None:
        self.prefill = prefill
        self.decode = decode
        self.prefill_gpus = prefill_gpus
        self.decode_gpus = decode_gpus

    def decide(self, observation: Observation, limits: Limits) -> Decision:
        bounded = clamp(self.prefill, self.decode, limits, self.prefill_gpus, self.decode_gpus)
        return Decision(
            prefill=bounded.prefill,
            decode=bounded.decode,
            binding=bounded.binding or "static_split",
            reasons=("StaticSplit", *bounded.reasons),
            details={"configured_prefill": float(self.prefill), "configured_decode": float(self.decode)},
        )


def make_static(context: PolicyContext) -> StaticPolicy:
    """The split is the context's initial one (the CLI's `--split X:Y`)."""
    return StaticPolicy(
        context.initial_prefill,
        context.initial_decode,
        context.prefill_gpus_per_instance,
        context.decode_gpus_per_instance,
    )
