"""Builders of specs, instances and transitions shared by the operator's pure-module tests."""

from __future__ import annotations

from typing import Any

from xpyd_api.instances import Instance, Step, Transition, TransitionKind
from xpyd_api.models import PDDeploymentSpec
from xpyd_api.names import Role

P, D = Role.PREFILL, Role.DECODE
HASHES = {P: "hp", D: "hd"}
NOW = 1000.0


def make_spec(prefill: int = 1, decode: int = 1, **extra: Any) -> PDDeploymentSpec:
    raw: dict[str, Any] = {
        "model": {"name": "m"},
        "engine": {"image": "vllm:0.32.0"},
        "router": {"image": "r:1"},
        "prefill": {"replicas": prefill},
        "decode": {"replicas": decode},
        "conversion": {"drainTimeoutSeconds": 30},
    }
    for key, value in extra.items():
        raw[key] = {**raw.get(key, {}), **value}
    return PDDeploymentSpec.model_validate(raw)


def make_instance(
    name: str,
    role: Role,
    *,
    ready: bool = True,
    template: str | None = None,
    transition: Transition | None = None,
    created: float = 0.0,
    failed: bool = False,
    deleting: bool = False,
) -> Instance:
    return Instance(
        name=name,
        uid=f"uid-{name}",
        resource_version="1",
        role=role,
        serving=transition is None,
        ready=ready,
        failed=failed,
        deleting=deleting,
        node="node-0",
        pod_ip=None,
        template_hash=template or HASHES[role],
        created=created,
        transition=transition,
    )


def convert(source: Role, step: Step = Step.DRAINING, since: float = NOW - 10) -> Transition:
    return Transition(TransitionKind.CONVERT, source, source.other, step, since, since)
