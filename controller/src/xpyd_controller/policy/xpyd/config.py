"""The xpyd policy's knobs: ten numbers with units and bounds, everything else follows from them."""

from __future__ import annotations

from dataclasses import dataclass

from xpyd_controller.policy.context import PolicyConfigError
from xpyd_controller.policy.layers import ScalingBehavior, require_in


@dataclass(frozen=True)
class XpydConfig:
    """Every knob of the xpyd policy; docs/tuning.md says what each does and when to change it."""

    ttft_quantile: float = 0.99  # prefill is sized so this quantile of TTFT, with queueing, meets the SLO
    tolerance: float = 0.1  # a pool shrinks only to the size demand × (1 + tolerance) needs
    up_window_s: float = 0.0  # scale up to the smallest recommendation of this window
    down_window_s: float = 300.0  # scale down to the largest recommendation of this window
    down_period_s: float = 60.0  # the period of the scale-down rate (up to 100 % per period)
    lead_time_s: float = 120.0  # time a pool takes to grow, until measured: the forecast's horizon
    backlog_drain_s: float = 30.0  # requests queued for prefill are sized to drain within this
    calibration_s: float = 300.0  # time constant of the measured-against-predicted TTFT correction
    in_flight_timeout_s: float = 600.0  # a pool in flight that has not moved for this long is stuck
    return_hold_s: float = 900.0  # after a fast fall below the usual load, the fleet is held this long

    def __post_init__(self) -> None:
        if not 0.5 <= self.ttft_quantile < 1:
            raise PolicyConfigError("xpyd", "ttft_quantile", self.ttft_quantile, "must be in [0.5, 1)")
        require_in("xpyd", "tolerance", self.tolerance, 0, 0.99)
        for name in ("up_window_s", "down_window_s", "return_hold_s"):
            require_in("xpyd", name, getattr(self, name), 0, 86400)
        for name in (
            "down_period_s",
            "lead_time_s",
            "backlog_drain_s",
            "calibration_s",
            "in_flight_timeout_s",
        ):
            require_in("xpyd", name, getattr(self, name), 1, 86400)

    def behavior(self) -> ScalingBehavior:
        """The HPA rails with these windows and the HPA's default rates (kube's horizontal.go): up by 4
        instances or 100 % per 15 s, whichever is more; down by up to 100 % per period. The
        stabilisation window, not the rate, keeps scale-ins calm."""
        return ScalingBehavior(
            up_window_s=self.up_window_s,
            down_window_s=self.down_window_s,
            up_instances=4,
            up_percent=100.0,
            up_period_s=15.0,
            down_instances=1,
            down_percent=100.0,
            down_period_s=self.down_period_s,
        )
