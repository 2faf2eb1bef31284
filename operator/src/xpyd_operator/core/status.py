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


# A condition's status, reason and message; _ConditionMaker adds its type and times.
_Verdict = tuple[bool, str, str]


def _converting(instances: Sequence[Instance]) -> list[Instance]:
    """Instances in a role conversion that stay: a leaving one is going away, not converting."""
    return [
        i for i in instances if i.transition and i.transition.kind is TransitionKind.CONVERT and not i.leaving
    ]


def _short_pools(pools: Mapping[Role, Mapping[str, Any]]) -> list[str]:
    """Each pool with fewer ready instances than desired, as "role ready/desired", for the messages."""
    return [f"{role} {p['ready']}/{p['desired']}" for role, p in pools.items() if p["ready"] < p["desired"]]


def _router_ok(inp: StatusInput) -> bool:
    """A router is only required when the spec asks for one with replicas; then one must be ready."""
    router_wanted = inp.spec.router.type is not RouterType.NONE and inp.spec.router.replicas > 0
    return not router_wanted or inp.router_ready_replicas >= 1


def _ready(inp: StatusInput, rejected: str, short: Sequence[str]) -> _Verdict:
    """Ready, with the first reason it is not: refused objects never become ready at this generation,
    so they come before missing instances, which come before the router."""
    if rejected:
        return False, Reason.OBJECT_REJECTED, rejected
    if short:
        return False, Reason.INSTANCES_NOT_READY, "not ready: " + ", ".join(short)
    if not _router_ok(inp):
        return False, Reason.ROUTER_NOT_READY, "router has no ready replica"
    return True, Reason.ALL_READY, "all instances and the router are ready"


def _progressing(
    inp: StatusInput,
    pools: Mapping[Role, Mapping[str, Any]],
    converting: Sequence[Instance],
    short: Sequence[str],
) -> _Verdict:
    """Progressing, naming the most specific change under way: a conversion, then a rollout of a new
    template, then any move towards the desired counts."""
    if converting:
        return True, Reason.CONVERTING, f"{len(converting)} conversion(s) in progress"
    if any(p["updated"] < p["current"] for p in pools.values()):
        return True, Reason.ROLLING_UPDATE, "replacing instances with the new template"
    off_count = any(p["current"] != p["desired"] for p in pools.values())
    if off_count or any(i.leaving for i in inp.instances) or short:
        return True, Reason.SCALING, "moving to desired counts"
    return False, Reason.STABLE, "at desired counts and template"


def _degraded(inp: StatusInput, rejected: str) -> _Verdict:
    """Degraded, with the first problem a person must act on, in order: objects the API server refused,
    flags the engine image rejects, failed pods, a router that ignores relabels, autoscaling the
    controller cannot configure."""
    if rejected:
        return True, Reason.OBJECT_REJECTED, rejected
    if unsupported := unsupported_flags_message(inp.spec.engine.image, inp.instances):
        return True, Reason.ENGINE_FLAG_UNSUPPORTED, unsupported
    if failed := [i.name for i in inp.instances if i.failed]:
        return True, Reason.PODS_FAILED, "failed pods replaced: " + ", ".join(failed)
    if problem := router_label_problem(inp.spec):
        return True, Reason.ROUTER_IGNORES_LABELS, problem
    if inp.autoscaling_problem:
        return True, Reason.INVALID_AUTOSCALING, inp.autoscaling_problem
    return False, Reason.HEALTHY, "no failed instances"


def _converting_verdict(converting: Sequence[Instance]) -> _Verdict:
    """Converting, listing each move as "pod from->to (step)" so `kubectl describe` shows where it is."""
    if not converting:
        return False, Reason.NO_CONVERSION, "no conversion in progress"
    moves = ", ".join(
        f"{i.name} {i.role}->{i.transition.target} ({i.transition.step})" for i in converting if i.transition
    )
    return True, Reason.CONVERTING, moves


def _conversions(converting: Sequence[Instance]) -> list[dict[str, Any]]:
    """`.status.conversions`: one entry per converting pod, with when its conversion started."""
    return [
        {
            "pod": i.name,
            "from": str(i.transition.source),
            "to": str(i.transition.target),
            "step": str(i.transition.step),
            "since": _timestamp(i.transition.started),
        }
        for i in converting
        if i.transition
    ]


def compute_status(inp: StatusInput) -> dict[str, Any]:
    """The operator's part of `.status` (it never touches `.status.autoscaler`)."""
    condition = _ConditionMaker(inp.previous_conditions, inp.generation, inp.now)
    pools = {role: pool_status(inp.spec, role, inp.instances, inp.template_hashes[role]) for role in Role}
    converting = _converting(inp.instances)
    short = _short_pools(pools)
    rejected = "; ".join(inp.rejected)
    return {
        "observedGeneration": inp.generation,
        "prefill": pools[Role.PREFILL],
        "decode": pools[Role.DECODE],
        "router": {"readyReplicas": inp.router_ready_replicas},
        "converting": len(converting),
        "conversions": _conversions(converting),
        "conditions": [
            condition(ConditionType.READY, *_ready(inp, rejected, short)),
            condition(ConditionType.PROGRESSING, *_progressing(inp, pools, converting, short)),
            condition(ConditionType.DEGRADED, *_degraded(inp, rejected)),
            condition(ConditionType.CONVERTING, *_converting_verdict(converting)),
        ],
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
