"""Operator settings, read once from the environment at startup (the chart sets them)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class OperatorConfig:
    # Read engine /metrics at http://<podIP>:<port> when a pod has no URL annotation. Off on clusters
    # whose pod IPs are not reachable from the operator (kwok's fake pods): such pods report "no data".
    probe_pod_ip: bool = True
    # Seconds between reconciles of a settled PDDeployment (events wake it earlier).
    resync_seconds: float = 30.0
    # Seconds between reconciles while something is in progress (drains, conversions, rollouts).
    active_poll_seconds: float = 0.5
    # Timeout of one HTTP call to an engine.
    engine_timeout_seconds: float = 2.0
    # Longest wait for a pod being recreated by a Restart switch to disappear.
    restart_wait_seconds: float = 60.0

    @staticmethod
    def from_env(env: Mapping[str, str] = os.environ) -> OperatorConfig:
        """Parse XPYD_* variables; a bad value raises ValueError naming the variable and the value."""

        def number(key: str, default: float) -> float:
            raw = env.get(key)
            if raw is None:
                return default
            try:
                value = float(raw)
            except ValueError:
                raise ValueError(f"{key}={raw!r} must be a number of seconds") from None
            if value <= 0:
                raise ValueError(f"{key}={raw!r} must be greater than 0")
            return value

        probe = env.get("XPYD_PROBE_POD_IP", "true").lower()
        if probe not in ("true", "false"):
            raise ValueError(f"XPYD_PROBE_POD_IP={probe!r} must be true or false")
        return OperatorConfig(
            probe_pod_ip=probe == "true",
            resync_seconds=number("XPYD_RESYNC_SECONDS", OperatorConfig.resync_seconds),
            active_poll_seconds=number("XPYD_ACTIVE_POLL_SECONDS", OperatorConfig.active_poll_seconds),
            engine_timeout_seconds=number(
                "XPYD_ENGINE_TIMEOUT_SECONDS", OperatorConfig.engine_timeout_seconds
            ),
            restart_wait_seconds=number("XPYD_RESTART_WAIT_SECONDS", OperatorConfig.restart_wait_seconds),
        )
