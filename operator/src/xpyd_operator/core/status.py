"""Pure status: pool counts, conversions in progress and conditions, from the observed instances.

Conditions keep their lastTransitionTime while their status does not change, so `kubectl describe`
shows when something actually happened rather than when the operator last looked.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from xpyd_api.engines import FLAG_PURPOSES
from xpyd_api.instances import Instance, TransitionKind
from xpyd_api.models import AutoscalingMode, PDDeploymentSpec, RouterType
from xpyd_api.names import BINDING_INVALID_SETUP, ConditionType, Reason, Role


def unsupported_flags_message(image: str, instances: Sequence[Instance]) -> str | None:
    """Names each flag the engine image rejected, the instance and why xpyd passes it; None if none."""
    parts = []
    for instance in instances:
        for flag in instance.rejected_flags:
            purpose = FLAG_PURPOSES.get(flag, "from spec.engine.args or a pool's args")
            parts.append(f"{flag} ({purpose}; instance {instance.name})")
    if not parts:
        return None
    return (
        f"engine image {image} does not accept "
        + ", ".join(parts)
        + ": use an image that knows the flag, or change the setting that renders it"
    )


@dataclass(frozen=True)
class StatusInput:
    generation: int
    spec: PDDeploymentSpec
    instances: Sequence[Instance]
    template_hashes: Mapping[Role, str]
    router_ready_replicas: int
    previous_conditions: Sequence[Mapping[str, Any]]
    now: float
    rejected: Sequence[str] = ()  # objects the API server refused this pass, each with its message
    autoscaling_problem: str | None = None  # why the controller cannot autoscale this generation


def autoscaling_problem(spec: PDDeploymentSpec, status: Mapping[str, Any], generation: int) -> str | None:
    """Why the controller cannot autoscale this spec, from its `status.autoscaler` (binding
    invalid_setup, written for this generation), or None. The controller writes no conditions; the
    operator, their one writer, says it in Degraded."""
    autoscaler = status.get("autoscaler")
    if spec.autoscaling.mode is AutoscalingMode.OFF or not isinstance(autoscaler, Mapping):
        return None
    if (
        autoscaler.get("binding") != BINDING_INVALID_SETUP
        or autoscaler.get("observedGeneration") != generation
    ):
        return None
    return str(autoscaler.get("message") or "the controller cannot configure autoscaling for this spec")


# Routers measured not to act on relabels (tests/integration/test_router_events.py, docs/operator.md):
# an instance relabelled serving=false keeps getting requests, so a drain cannot finish and a role switch
# leaves the instance in its old pool.
ROUTERS_IGNORING_LABELS = {RouterType.SGLANG_ROUTER: "sglang-router 0.3.2"}


def router_label_problem(spec: PDDeploymentSpec) -> str | None:
    """Why conversions cannot work with this router configuration, or None."""
    measured = ROUTERS_IGNORING_LABELS.get(spec.router.type)
    if measured is None or not spec.conversion.enabled:
        return None
    return (
        f"spec.router.type={spec.router.type} with spec.conversion.enabled: {measured} (measured) keeps "
        "an instance relabelled xpyd.dev/serving=false or to another role in its old pool, so drains "
        "time out and converted instances get the wrong requests; use vllm-router, or disable conversion"
    )


def _timestamp(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def pool_status(
    spec: PDDeploymentSpec, role: Role, instances: Sequence[Instance], template_hash: str
) -> dict[str, Any]:
    """Counts for one role; ready means Ready, serving and not in a transition."""
    members = [i for i in instances if not i.leaving and i.effective_role == role]
    ready = sum(1 for i in members if i.ready and i.serving and i.transition is None and i.role == role)
    desired = spec.pool(role).replicas
    return {
        "desired": desired,
        "current": len(members),
        "ready": ready,
        "updated": sum(1 for i in members if i.template_hash == template_hash),
        "summary": f"{ready}/{desired}",
    }


@dataclass(frozen=True)
class _ConditionMaker:
    """Builds conditions that keep lastTransitionTime from the previous status when unchanged."""

    previous: Sequence[Mapping[str, Any]]
    generation: int
    now: float

    def __call__(self, kind: ConditionType, ok: bool, reason: str, message: str) -> dict[str, Any]:
        status = "True" if ok else "False"
        since = _timestamp(self.now)
        for old in self.previous:
            if old.get("type") == kind and old.get("status") == status and old.get("lastTransitionTime"):
                since = old["lastTransitionTime"]
        return {
            "type": str(kind),
            "status": status,
            "reason": reason,
            "message": message,
            "observedGeneration": self.generation,
            "lastTransitionTime": since,
        }


def compute_status(inp: StatusInput) -> dict[str, Any]:
    """The operator's part of `.status` (it never touches `.status.autoscaler`)."""
    condition = _ConditionMaker(inp.previous_conditions, inp.generation, inp.now)
    pools = {role: pool_status(inp.spec, role, inp.instances, inp.template_hashes[role]) for role in Role}
    converting = [
        i
        for i in inp.instances
        if i.transition and i.transition.kind is TransitionKind.CONVERT and not i.leaving
    ]
    failed = [i.name for i in inp.instances if i.failed]
    router_wanted = inp.spec.router.type is not RouterType.NONE and inp.spec.router.replicas > 0
    router_ok = not router_wanted or inp.router_ready_replicas >= 1

    short = [f"{role} {p['ready']}/{p['desired']}" for role, p in pools.items() if p["ready"] < p["desired"]]
    rejected = "; ".join(inp.rejected)
    if rejected:  # the spec renders objects the API server refuses: never Ready at this generation
        ready = condition(ConditionType.READY, False, Reason.OBJECT_REJECTED, rejected)
    elif short:
        ready = condition(
            ConditionType.READY, False, Reason.INSTANCES_NOT_READY, "not ready: " + ", ".join(short)
        )
    elif not router_ok:
        ready = condition(ConditionType.READY, False, Reason.ROUTER_NOT_READY, "router has no ready replica")
    else:
        ready = condition(
            ConditionType.READY, True, Reason.ALL_READY, "all instances and the router are ready"
        )

    outdated = any(p["updated"] < p["current"] for p in pools.values())
    off_count = any(p["current"] != p["desired"] for p in pools.values())
    leaving = any(i.leaving for i in inp.instances)
    if converting:
        progressing = condition(
            ConditionType.PROGRESSING,
            True,
            Reason.CONVERTING,
            f"{len(converting)} conversion(s) in progress",
        )
    elif outdated:
        progressing = condition(
            ConditionType.PROGRESSING,
            True,
            Reason.ROLLING_UPDATE,
            "replacing instances with the new template",
        )
    elif off_count or leaving or short:
        progressing = condition(ConditionType.PROGRESSING, True, Reason.SCALING, "moving to desired counts")
    else:
        progressing = condition(
            ConditionType.PROGRESSING, False, Reason.STABLE, "at desired counts and template"
        )

    unsupported = unsupported_flags_message(inp.spec.engine.image, inp.instances)
    if rejected:
        degraded = condition(ConditionType.DEGRADED, True, Reason.OBJECT_REJECTED, rejected)
    elif unsupported:
        degraded = condition(ConditionType.DEGRADED, True, Reason.ENGINE_FLAG_UNSUPPORTED, unsupported)
    elif failed:
        degraded = condition(
            ConditionType.DEGRADED,
            True,
            Reason.PODS_FAILED,
            "failed pods replaced: " + ", ".join(failed),
        )
    elif problem := router_label_problem(inp.spec):
        degraded = condition(ConditionType.DEGRADED, True, Reason.ROUTER_IGNORES_LABELS, problem)
    elif inp.autoscaling_problem:
        degraded = condition(
            ConditionType.DEGRADED, True, Reason.INVALID_AUTOSCALING, inp.autoscaling_problem
        )
    else:
        degraded = condition(ConditionType.DEGRADED, False, Reason.HEALTHY, "no failed instances")

    if converting:
        moves = ", ".join(
            f"{i.name} {i.role}->{i.transition.target} ({i.transition.step})"
            for i in converting
            if i.transition
        )
        converting_condition = condition(ConditionType.CONVERTING, True, Reason.CONVERTING, moves)
    else:
        converting_condition = condition(
            ConditionType.CONVERTING, False, Reason.NO_CONVERSION, "no conversion in progress"
        )

    return {
        "observedGeneration": inp.generation,
        "prefill": pools[Role.PREFILL],
        "decode": pools[Role.DECODE],
        "router": {"readyReplicas": inp.router_ready_replicas},
        "converting": len(converting),
        "conversions": [
            {
                "pod": i.name,
                "from": str(i.transition.source),
                "to": str(i.transition.target),
                "step": str(i.transition.step),
                "since": _timestamp(i.transition.started),
            }
            for i in converting
            if i.transition
        ],
        "conditions": [ready, progressing, degraded, converting_condition],
    }


def blocked_conditions(
    reason: str, message: str, generation: int, now: float, previous: Sequence[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """Conditions when reconciling cannot proceed until a person fixes something (a permanent error):
    a spec the operator cannot use, or a corrupt conversion record on a pod."""
    condition = _ConditionMaker(previous, generation, now)
    return [
        condition(ConditionType.READY, False, reason, message),
        condition(ConditionType.DEGRADED, True, reason, message),
    ]
