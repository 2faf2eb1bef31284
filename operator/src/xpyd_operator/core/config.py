"""Operator settings, read once from the environment at startup (the chart sets them)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from xpyd_operator.core.scaling import DEFAULT_MAX_CREATES_PER_PASS


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
    # Most instance pods one reconcile pass creates (both roles); the next pass creates more.
    max_creates_per_pass: int = DEFAULT_MAX_CREATES_PER_PASS
    # Service accounts a PDDeployment may give its router (spec.router.serviceAccountName); the chart
    # sets the one it creates. Any other name is refused: a tenant must not borrow another account.
    router_service_accounts: tuple[str, ...] = ()
    # Namespaces whose PDDeployments are refused (an all-namespaces operator never creates pods there).
    excluded_namespaces: tuple[str, ...] = ("kube-system",)

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

        def count(key: str, default: int) -> int:
            raw = env.get(key)
            if raw is None:
                return default
            if not raw.isdigit() or int(raw) < 1:
                raise ValueError(f"{key}={raw!r} must be a whole number of at least 1")
            return int(raw)

        def names(key: str, default: tuple[str, ...]) -> tuple[str, ...]:
            raw = env.get(key)
            if raw is None:
                return default
            return tuple(name.strip() for name in raw.split(",") if name.strip())

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
            max_creates_per_pass=count("XPYD_MAX_CREATES_PER_PASS", OperatorConfig.max_creates_per_pass),
            router_service_accounts=names("XPYD_ROUTER_SERVICE_ACCOUNTS", ()),
            excluded_namespaces=names("XPYD_EXCLUDED_NAMESPACES", OperatorConfig.excluded_namespaces),
        )
