"""Instance pods → PoolState per role, counted the way the simulator counts its instances."""

from __future__ import annotations

from typing import Any

import pytest

from xpyd_api.instances import Step, Transition, TransitionKind
from xpyd_api.names import ANNOTATION_TRANSITION, LABEL_ROLE, LABEL_SERVING, Role
from xpyd_controller.control.pools import pool_states
from xpyd_controller.policy.types import PoolState

P, D = Role.PREFILL, Role.DECODE


def pod(
    role: str,
    *,
    ready: bool = True,
    serving: bool = True,
    phase: str = "Running",
    transition: Transition | None = None,
    deleting: bool = False,
) -> dict[str, Any]:
    metadata: dict[str, Any] = {
        "name": f"x-{role}",
        "labels": {LABEL_ROLE: role, LABEL_SERVING: "true" if serving else "false"},
        "annotations": {ANNOTATION_TRANSITION: transition.to_json()} if transition else {},
    }
    if deleting:
        metadata["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    conditions = [{"type": "Ready", "status": "True" if ready else "False"}]
    return {"metadata": metadata, "status": {"phase": phase, "conditions": conditions}}


def move(kind: TransitionKind, source: Role) -> Transition:
    target = source.other if kind is TransitionKind.CONVERT else None
    return Transition(kind, source, target, Step.DRAINING, 1.0, 1.0)


def counts(pods: list[dict[str, Any]]) -> dict[Role, tuple[int, int, int]]:
    states = pool_states(pods, {P: 1, D: 1})
    return {role: (s.ready, s.starting, s.draining) for role, s in states.items()}


@pytest.mark.parametrize(
    ("pods", "expected"),
    [
        ([], {P: (0, 0, 0), D: (0, 0, 0)}),
        ([pod("prefill"), pod("decode"), pod("decode")], {P: (1, 0, 0), D: (2, 0, 0)}),
        ([pod("decode", ready=False, phase="Pending")], {P: (0, 0, 0), D: (0, 1, 0)}),  # pending = supply
        ([pod("decode", serving=False)], {P: (0, 0, 0), D: (0, 1, 0)}),
        ([pod("prefill", phase="Failed")], {P: (0, 0, 0), D: (0, 0, 0)}),
        ([pod("prefill", deleting=True)], {P: (0, 0, 1), D: (0, 0, 0)}),
        (
            [pod("prefill", serving=False, transition=move(TransitionKind.REMOVE, P))],
            {P: (0, 0, 1), D: (0, 0, 0)},
        ),
        (  # a conversion drains its source and is expected supply of its target
            [pod("decode", serving=False, transition=move(TransitionKind.CONVERT, D))],
            {P: (0, 1, 0), D: (0, 0, 1)},
        ),
        ([pod("router")], {P: (0, 0, 0), D: (0, 0, 0)}),  # not an instance of a role
    ],
)
def test_counts(pods: list[dict[str, Any]], expected: dict[Role, tuple[int, int, int]]) -> None:
    assert counts(pods) == expected


def test_unreadable_record_counts_as_leaving() -> None:
    broken = pod("decode")
    broken["metadata"]["annotations"][ANNOTATION_TRANSITION] = "{not json"
    assert counts([broken]) == {P: (0, 0, 0), D: (0, 0, 1)}


def test_gpus_per_instance_are_carried() -> None:
    states = pool_states([pod("prefill")], {P: 2, D: 4})
    assert states[P] == PoolState(1, 0, 0, 2) and states[D].gpus_per_instance == 4
