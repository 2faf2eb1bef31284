"""Instance pods → each role's `PoolState`, counted as the simulator counts its instances (pure).

The operator's labels and transition record say where each instance is: Ready, serving and not in a
transition is ready; alive but not yet ready (scheduling, warming) is starting, so pending pods count as
expected supply; a scale-in drain or a deleting pod is draining; a conversion is draining for its source
role and starting for its target, as in the simulator. Failed pods count for nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from xpyd_api.instances import Instance, TransitionKind, parse_instance
from xpyd_api.names import LABEL_ROLE, Role
from xpyd_controller.policy.types import PoolState


def _place(instance: Instance) -> list[tuple[Role, str]]:
    """(role, state) counts this instance contributes."""
    if instance.failed:
        return []
    transition = instance.transition
    if transition is not None and transition.kind is TransitionKind.CONVERT and transition.target:
        return [(transition.source, "draining"), (transition.target, "starting")]
    if instance.leaving:
        return [(instance.role, "draining")]
    if instance.ready and instance.serving:
        return [(instance.role, "ready")]
    return [(instance.role, "starting")]


def pool_states(
    pods: Iterable[Mapping[str, Any]], gpus_per_instance: Mapping[Role, int]
) -> dict[Role, PoolState]:
    """Counts per role; a pod whose transition record cannot be read counts as draining (leaving)."""
    counts = {(role, state): 0 for role in Role for state in ("ready", "starting", "draining")}
    for pod in pods:
        try:
            instance = parse_instance(dict(pod))
        except ValueError:
            role = (pod.get("metadata", {}).get("labels") or {}).get(LABEL_ROLE, "")
            if role in tuple(Role):
                counts[(Role(role), "draining")] += 1
            continue
        if instance is None:
            continue
        for key in _place(instance):
            counts[key] += 1
    return {
        role: PoolState(
            ready=counts[(role, "ready")],
            starting=counts[(role, "starting")],
            draining=counts[(role, "draining")],
            gpus_per_instance=gpus_per_instance[role],
        )
        for role in Role
    }
