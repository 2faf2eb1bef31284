"""Typed view of observed instance pods, and the drain/conversion record each pod carries.

Shared: the operator plans from it, the controller counts pools with it (control/pools.py).

The record lives in one annotation and is rewritten at every step (with the pod's resourceVersion as a
precondition), so an operator that restarts reads exactly where each instance was.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from datetime import datetime
from enum import StrEnum
from typing import Any

from xpyd_api.names import (
    ANNOTATION_CONVERSIONS,
    ANNOTATION_ENGINE_URL,
    ANNOTATION_TRANSITION,
    LABEL_ROLE,
    LABEL_SERVING,
    LABEL_TEMPLATE_HASH,
    Role,
)


class TransitionKind(StrEnum):
    CONVERT = "Convert"  # the instance changes role and stays
    REMOVE = "Remove"  # the instance is drained, then deleted (scale-in, rolling update)


class Step(StrEnum):
    DRAINING = "Draining"  # serving=false; waiting for in-flight requests to reach 0 or the timeout
    SWITCHING = "Switching"  # changing the engine's role (routing only, HTTP call, or restart)
    VERIFYING = "Verifying"  # checking the engine took the new role before it takes traffic again


@dataclass(frozen=True)
class Transition:
    """An in-progress drain or conversion of one instance, as recorded on its pod."""

    kind: TransitionKind
    source: Role
    target: Role | None  # None for removals
    step: Step
    started: float  # epoch seconds the transition began
    step_started: float  # epoch seconds the current step began
    drain_result: str | None = None  # "idle" or "timeout", once drained
    # epoch seconds an HTTP switch was about to be sent: written BEFORE the call, so after a crash the
    # engine is asked for its role before the call is ever repeated
    switch_sent: float | None = None
    # epoch seconds the draining instance was first seen with 0 in flight (a vLLM prefill instance then
    # still holds KV for decode to pull: it waits out the lease from here)
    idle_since: float | None = None
    # finished-request count each prefill instance must reach before a draining decode instance is idle:
    # the requests queued at prefill when the router dropped it may still have it as their decode side
    prefill_backlog: tuple[tuple[str, int], ...] | None = None
    # whether a router listed the instance in its pools when the drain began or since (None: unknown).
    # Never listed means the router may still be adding it (vllm-router adds one pod at a time, waiting
    # for its health), so its absence from the pools does not yet mean it was dropped.
    router_listed: bool | None = None
    # the engine container's restart count when an in-place switch relabelled the pod: the switch took
    # effect once the kubelet has restarted the container since (its env then holds the new role)
    restarts_before: int | None = None

    def advance(self, step: Step, now: float, drain_result: str | None = None) -> Transition:
        return replace(self, step=step, step_started=now, drain_result=drain_result or self.drain_result)

    def to_json(self) -> str:
        record: dict[str, Any] = {
            "kind": str(self.kind),
            "from": str(self.source),
            "to": str(self.target) if self.target else None,
            "step": str(self.step),
            "started": self.started,
            "stepStarted": self.step_started,
            "drainResult": self.drain_result,
        }
        if self.switch_sent is not None:
            record["switchSent"] = self.switch_sent
        if self.idle_since is not None:
            record["idleSince"] = self.idle_since
        if self.prefill_backlog is not None:
            record["prefillBacklog"] = dict(self.prefill_backlog)
        if self.router_listed is not None:
            record["routerListed"] = self.router_listed
        if self.restarts_before is not None:
            record["restartsBefore"] = self.restarts_before
        return json.dumps(record, sort_keys=True, separators=(",", ":"))

    @staticmethod
    def from_json(text: str) -> Transition:
        """Parse a record; raise ValueError naming the annotation and the bad field."""
        try:
            record = json.loads(text)
            target = record.get("to")
            backlog = record.get("prefillBacklog")
            return Transition(
                kind=TransitionKind(record["kind"]),
                source=Role(record["from"]),
                target=Role(target) if target else None,
                step=Step(record["step"]),
                started=float(record["started"]),
                step_started=float(record["stepStarted"]),
                drain_result=record.get("drainResult"),
                switch_sent=float(record["switchSent"]) if record.get("switchSent") is not None else None,
                idle_since=float(record["idleSince"]) if record.get("idleSince") is not None else None,
                prefill_backlog=(
                    None
                    if backlog is None
                    else tuple(sorted((str(pod), int(count)) for pod, count in backlog.items()))
                ),
                router_listed=_optional_bool(record.get("routerListed")),
                restarts_before=(
                    int(record["restartsBefore"]) if record.get("restartsBefore") is not None else None
                ),
            )
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            raise ValueError(
                f"annotation {ANNOTATION_TRANSITION}={text!r} is not a valid record: {error}"
            ) from None


def _optional_bool(value: Any) -> bool | None:
    if value is None or isinstance(value, bool):
        return value
    raise ValueError(f"routerListed = {value!r}: must be true, false or absent")


@dataclass(frozen=True)
class Instance:
    """One instance pod, as much as planning needs of it."""

    name: str
    uid: str
    resource_version: str
    role: Role
    serving: bool
    ready: bool
    failed: bool
    deleting: bool
    node: str | None
    pod_ip: str | None
    template_hash: str
    created: float
    transition: Transition | None = None
    conversions: int = 0
    engine_url: str | None = None
    rejected_flags: tuple[str, ...] = ()  # flags its engine exited on as unknown (an image too old)
    restarts: int = 0  # how often the kubelet restarted its containers (restartCount, summed)

    @property
    def effective_role(self) -> Role:
        """The role this instance counts for: a converting instance already counts for its target."""
        if self.transition and self.transition.kind is TransitionKind.CONVERT and self.transition.target:
            return self.transition.target
        return self.role

    @property
    def leaving(self) -> bool:
        """Being removed: no longer counted as a member of any pool."""
        removing = self.transition is not None and self.transition.kind is TransitionKind.REMOVE
        return self.deleting or self.failed or removing


def _epoch(timestamp: str | None) -> float:
    if not timestamp:
        return 0.0
    return datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()


# argparse's exit messages (vLLM and SGLang both parse their flags with it): a flag it does not know,
# and a value a known flag refuses (`argument -tp/--tensor-parallel-size: invalid int value`, or vLLM's
# `argument --kv-transfer-config: 1 validation error for KVTransferConfig`, as a kv_role it no longer
# takes would be refused).
_UNRECOGNIZED = re.compile(r"unrecognized arguments: ([^\n]+)")
_REFUSED_VALUE = re.compile(r"error: argument (-{1,2}[\w.-]+(?:/-{1,2}[\w.-]+)*): ")


def rejected_flags(status: dict[str, Any]) -> tuple[str, ...]:
    """Flags a container exited on, as unrecognized or for a value it refused, from its termination
    message (the pod template asks for the log tail there); empty when none did. Of a flag's aliases
    the last (argparse lists the long form last) names it."""
    flags: list[str] = []
    for container in status.get("containerStatuses") or []:
        for state in (container.get("state") or {}, container.get("lastState") or {}):
            message = (state.get("terminated") or {}).get("message") or ""
            found = [
                w for m in _UNRECOGNIZED.finditer(message) for w in m.group(1).split() if w.startswith("-")
            ]
            found += [m.group(1).split("/")[-1] for m in _REFUSED_VALUE.finditer(message)]
            flags += [flag for flag in dict.fromkeys(found) if flag not in flags]
    return tuple(flags)


def parse_instance(pod: dict[str, Any]) -> Instance | None:
    """Typed view of an instance pod; None when it lacks a valid role label (not ours to manage)."""
    metadata = pod.get("metadata", {})
    labels = metadata.get("labels") or {}
    annotations = metadata.get("annotations") or {}
    try:
        role = Role(labels.get(LABEL_ROLE, ""))
    except ValueError:
        return None
    status = pod.get("status") or {}
    conditions = status.get("conditions") or []
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
    record = annotations.get(ANNOTATION_TRANSITION)
    return Instance(
        name=metadata["name"],
        uid=metadata.get("uid", ""),
        resource_version=metadata.get("resourceVersion", ""),
        role=role,
        serving=labels.get(LABEL_SERVING) == "true",
        ready=ready and status.get("phase") == "Running",
        failed=status.get("phase") in ("Failed", "Succeeded"),
        deleting=metadata.get("deletionTimestamp") is not None,
        node=(pod.get("spec") or {}).get("nodeName"),
        pod_ip=status.get("podIP"),
        template_hash=labels.get(LABEL_TEMPLATE_HASH, ""),
        created=_epoch(metadata.get("creationTimestamp")),
        transition=Transition.from_json(record) if record else None,
        conversions=int(annotations.get(ANNOTATION_CONVERSIONS, "0") or 0),
        engine_url=annotations.get(ANNOTATION_ENGINE_URL),
        rejected_flags=rejected_flags(status),
        restarts=sum(int(c.get("restartCount") or 0) for c in status.get("containerStatuses") or []),
    )
