"""Policies by name, for the simulator, the CLI and the controller: `make_policy("xpyd", context)`."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from xpyd_controller.policy.context import PolicyConfigError, PolicyContext
from xpyd_controller.policy.static import make_static
from xpyd_controller.policy.threshold import make_threshold
from xpyd_controller.policy.throughput_planner import make_throughput_planner
from xpyd_controller.policy.types import Policy
from xpyd_controller.policy.xpyd import make_xpyd

PolicyFactory = Callable[[PolicyContext], Policy]

POLICIES: Mapping[str, PolicyFactory] = {
    "static": make_static,
    "threshold": make_threshold,
    "throughput-planner": make_throughput_planner,
    "xpyd": make_xpyd,
}


def make_policy(name: str, context: PolicyContext) -> Policy:
    """A fresh policy instance (policies keep window state, so never share one between runs)."""
    factory = POLICIES.get(name)
    if factory is None:
        raise PolicyConfigError(name, "policy", name, f"unknown policy; known: {', '.join(sorted(POLICIES))}")
    return factory(context)
