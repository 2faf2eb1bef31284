"""Table tests for the pure reconcile plan: counts, victims, drains, conversions and rolling updates."""

from __future__ import annotations

from dataclasses import replace

import pytest
from tests.unit.operator_builders import HASHES, NOW, D, P, convert, make_instance, make_spec

from xpyd_api.instances import Instance, Step, Transition, TransitionKind
from xpyd_api.models import PDDeploymentSpec
from xpyd_api.names import Role
from xpyd_operator.core.actions import (
    Action,
    AdvanceTransition,
    BeginTransition,
    CancelTransition,
    CreateInstance,
    DeleteInstance,
    SwitchEngine,
    VerifyEngine,
)
from xpyd_operator.core.scaling import PlanInput, plan, roles_needing_load


def removal(source: Role, since: float = NOW - 10) -> Transition:
    return Transition(TransitionKind.REMOVE, source, None, Step.DRAINING, since, since)


def removal_done(source: Role) -> Transition:
    """A decode removal whose prefill backlog was recorded empty (nothing queued for it at prefill)."""
    return replace(removal(source), prefill_backlog=())


def summarize(actions: list[Action]) -> list[tuple[str, ...]]:
    out: list[tuple[str, ...]] = []
    for action in actions:
        match action:
            case CreateInstance(role=role, name=name):
                out.append(("create", str(role), name))
            case DeleteInstance(instance=instance):
                out.append(("delete", instance.name))
            case BeginTransition(instance=instance, transition=t):
                out.append(("begin", instance.name, str(t.kind), str(t.target)))
            case AdvanceTransition(instance=instance, transition=t):
                out.append(("advance", instance.name, str(t.step), str(t.drain_result)))
            case CancelTransition(instance=instance):
                out.append(("cancel", instance.name))
            case SwitchEngine(instance=instance, target=target):
                out.append(("switch", instance.name, str(target)))
            case VerifyEngine(instance=instance, target=target):
                out.append(("verify", instance.name, str(target)))
    return sorted(out)


def run(
    spec: PDDeploymentSpec, instances: list[Instance], loads: dict[str, int | None] | None = None
) -> list[tuple[str, ...]]:
    return summarize(plan(PlanInput("x", spec, instances, HASHES, loads or {}, NOW)))


CASES: list[tuple[str, PDDeploymentSpec, list[Instance], dict[str, int | None], list[tuple[str, ...]]]] = [
    (
        "empty creates both roles",
        make_spec(),
        [],
        {},
        [("create", "decode", "x-1"), ("create", "prefill", "x-0")],
    ),
    ("at desired does nothing", make_spec(), [make_instance("x-0", P), make_instance("x-1", D)], {}, []),
    (
        "failed pod is deleted and replaced",
        make_spec(),
        [make_instance("x-0", P, failed=True), make_instance("x-1", D)],
        {},
        [("create", "prefill", "x-2"), ("delete", "x-0")],
    ),
    (
        "scale up fills the lowest free names",
        make_spec(prefill=3),
        [make_instance("x-1", P), make_instance("x-2", D)],
        {},
        [("create", "prefill", "x-0"), ("create", "prefill", "x-3")],
    ),
    (
        "scale in: unready deleted at once, then least loaded drained",
        make_spec(decode=1, conversion={"enabled": False}),
        [
            make_instance("x-0", P),
            make_instance("x-1", D, ready=False),
            make_instance("x-2", D),
            make_instance("x-3", D),
            make_instance("x-4", D),
        ],
        {"x-2": 7, "x-3": 1, "x-4": None},
        [("begin", "x-2", "Remove", "None"), ("begin", "x-3", "Remove", "None"), ("delete", "x-1")],
    ),
    (
        "unknown load is given up last",
        make_spec(decode=1, conversion={"enabled": False}),
        [make_instance("x-0", P), make_instance("x-1", D), make_instance("x-2", D)],
        {"x-1": None, "x-2": 50},
        [("begin", "x-2", "Remove", "None")],
    ),
    (
        "equal load: the newest goes first",
        make_spec(decode=1),
        [make_instance("x-0", P), make_instance("x-1", D, created=1), make_instance("x-2", D, created=2)],
        {"x-1": 0, "x-2": 0},
        [("begin", "x-2", "Remove", "None")],
    ),
    (
        "drained removal (idle, no prefill backlog) is deleted",
        make_spec(),
        [
            make_instance("x-0", P),
            make_instance("x-1", D),
            make_instance("x-2", D, transition=removal_done(D)),
        ],
        {"x-2": 0},
        [("delete", "x-2")],
    ),
    (
        "removal still busy waits",
        make_spec(),
        [make_instance("x-0", P), make_instance("x-1", D), make_instance("x-2", D, transition=removal(D))],
        {"x-2": 3},
        [],
    ),
    (
        "removal past the drain timeout is deleted",
        make_spec(),
        [
            make_instance("x-0", P),
            make_instance("x-1", D),
            make_instance("x-2", D, transition=removal(D, NOW - 31)),
        ],
        {"x-2": 3},
        [("delete", "x-2")],
    ),
    (
        "removal with no data waits for the timeout, never assumes idle",
        make_spec(),
        [make_instance("x-0", P), make_instance("x-1", D), make_instance("x-2", D, transition=removal(D))],
        {"x-2": None},
        [],
    ),
    (
        "pool needs a draining instance again: cancelled, nothing created",
        make_spec(decode=2),
        [make_instance("x-0", P), make_instance("x-1", D), make_instance("x-2", D, transition=removal(D))],
        {"x-2": 3},
        [("cancel", "x-2")],
    ),
    (
        "one role shrinks while the other grows: convert the least loaded",
        make_spec(prefill=2, decode=1),
        [make_instance("x-0", P), make_instance("x-1", D), make_instance("x-2", D)],
        {"x-1": 4, "x-2": 1},
        [("begin", "x-2", "Convert", "prefill")],
    ),
    (
        "conversion disabled: delete and create instead",
        make_spec(prefill=2, decode=1, conversion={"enabled": False}),
        [make_instance("x-0", P), make_instance("x-1", D), make_instance("x-2", D)],
        {"x-1": 4, "x-2": 1},
        [("begin", "x-2", "Remove", "None"), ("create", "prefill", "x-3")],
    ),
    (
        "a converting instance counts for its target role",
        make_spec(prefill=2, decode=1),
        [make_instance("x-0", P), make_instance("x-1", D), make_instance("x-2", D, transition=convert(D))],
        {"x-2": 2},
        [],
    ),
    (
        "conversion drained (idle, no prefill backlog) moves to Switching",
        make_spec(prefill=2, decode=1),
        [
            make_instance("x-0", P),
            make_instance("x-1", D),
            make_instance("x-2", D, transition=replace(convert(D), prefill_backlog=())),
        ],
        {"x-2": 0},
        [("advance", "x-2", "Switching", "idle")],
    ),
    (
        "conversion past the drain timeout moves to Switching",
        make_spec(prefill=2, decode=1),
        [
            make_instance("x-0", P),
            make_instance("x-1", D),
            make_instance("x-2", D, transition=convert(D, since=NOW - 30)),
        ],
        {"x-2": 9},
        [("advance", "x-2", "Switching", "timeout")],
    ),
    (
        "switching asks for the switch",
        make_spec(prefill=2, decode=1),
        [
            make_instance("x-0", P),
            make_instance("x-1", D),
            make_instance("x-2", D, transition=convert(D, Step.SWITCHING)),
        ],
        {},
        [("switch", "x-2", "prefill")],
    ),
    (
        "verifying asks for verification",
        make_spec(prefill=2, decode=1),
        [
            make_instance("x-0", P),
            make_instance("x-1", D),
            make_instance("x-2", D, transition=convert(D, Step.VERIFYING)),
        ],
        {},
        [("verify", "x-2", "prefill")],
    ),
    (
        "rolling update surges one new instance first",
        make_spec(prefill=2),
        [
            make_instance("x-0", P, template="old"),
            make_instance("x-1", P, template="old"),
            make_instance("x-2", D),
        ],
        {},
        [("create", "prefill", "x-3")],
    ),
    (
        "rolling update: surge not ready yet, nothing removed",
        make_spec(prefill=2),
        [
            make_instance("x-0", P, template="old"),
            make_instance("x-1", P, template="old"),
            make_instance("x-2", D),
            make_instance("x-3", P, ready=False),
        ],
        {},
        [],
    ),
    (
        "rolling update: surge ready, one old drained",
        make_spec(prefill=2),
        [
            make_instance("x-0", P, template="old"),
            make_instance("x-1", P, template="old"),
            make_instance("x-2", D),
            make_instance("x-3", P),
        ],
        {"x-0": 5, "x-1": 2},
        [("begin", "x-1", "Remove", "None")],
    ),
    (
        "rolling update with maxUnavailable=1, maxSurge=0 drains first",
        make_spec(prefill=2, rollout={"maxSurge": 0, "maxUnavailable": 1}),
        [
            make_instance("x-0", P, template="old"),
            make_instance("x-1", P, template="old"),
            make_instance("x-2", D),
        ],
        {"x-0": 0, "x-1": 4},
        [("begin", "x-0", "Remove", "None")],
    ),
    (
        "rolling update: unready old instances go at once",
        make_spec(prefill=1),
        [make_instance("x-0", P, template="old", ready=False), make_instance("x-1", D)],
        {},
        [("create", "prefill", "x-2"), ("delete", "x-0")],
    ),
]


@pytest.mark.parametrize(
    ("title", "spec", "instances", "loads", "expected"), CASES, ids=[c[0] for c in CASES]
)
def test_plan(
    title: str,
    spec: PDDeploymentSpec,
    instances: list[Instance],
    loads: dict[str, int | None],
    expected: list[tuple[str, ...]],
) -> None:
    assert run(spec, instances, loads) == sorted(expected)


def test_incompatible_roles_never_convert() -> None:
    spec = make_spec(prefill=2, decode=1, conversion={"enabled": False}).model_copy(
        update={"prefill": make_spec().prefill.model_copy(update={"replicas": 2, "gpus_per_instance": 2})}
    )
    assert not spec.roles_compatible
    actions = run(
        spec, [make_instance("x-0", P), make_instance("x-1", D), make_instance("x-2", D)], {"x-2": 0}
    )
    assert ("begin", "x-2", "Remove", "None") in actions
    assert not [a for a in actions if a[0] == "begin" and a[2] == "Convert"]


def test_plan_is_idempotent_after_its_own_transitions() -> None:
    """Replaying the plan on the state it produced asks for nothing new (exactly-once conversions)."""
    spec = make_spec(prefill=2, decode=1)
    instances = [make_instance("x-0", P), make_instance("x-1", D), make_instance("x-2", D)]
    first = plan(PlanInput("x", spec, instances, HASHES, {"x-1": 3, "x-2": 3}, NOW))
    begun = [a for a in first if isinstance(a, BeginTransition)]
    assert len(begun) == 1
    after = [
        make_instance(i.name, i.role, transition=begun[0].transition)
        if i.name == begun[0].instance.name
        else i
        for i in instances
    ]
    assert run(spec, after, {"x-1": 3, "x-2": 3}) == []


def test_roles_needing_load_names_crowded_roles_only() -> None:
    spec = make_spec(prefill=1, decode=1)
    instances = [make_instance("x-0", P), make_instance("x-1", D), make_instance("x-2", D)]
    assert roles_needing_load(spec, instances) == {D}


@pytest.mark.parametrize("room", [1, 3, 8])
def test_creations_are_paced_per_pass(room: int) -> None:
    spec = PDDeploymentSpec.model_validate(
        {
            "model": {"name": "m"},
            "engine": {"image": "vllm:0.32.0"},
            "router": {"image": "r:1"},
            "prefill": {"replicas": 512, "maxReplicas": 512},
            "decode": {"replicas": 512, "maxReplicas": 512},
        }
    )
    actions = plan(PlanInput("x", spec, [], HASHES, {}, NOW, max_creates=room))
    assert len(actions) == room and all(isinstance(a, CreateInstance) for a in actions)
