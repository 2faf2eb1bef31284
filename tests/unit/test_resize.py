"""The one resize rule (xpyd_api.resize) and its conformance table: every case runs through the rule
itself, the operator's plan and the simulator's `_apply`, which must all make the same moves.

The table pins the rule's choices where a planner could reasonably differ:
- neither converts nor removes a pool's last ready instance while its desired size is above zero
  (not even beside instances converting into the pool);
- only ready instances convert (a starting pod is not converted);
- victims: unready first, then least loaded (unknown last), then newest among equals;
- a pool that is short takes back instances it is draining for removal before any conversion into
  it;
- a pool still short takes over the other pool's drains for removal when conversions are allowed (a
  policy that shrinks one pool in one pass and grows the other in the next, while that drain is on,
  still converts rather than deleting one instance and cold-starting another);
- a conversion replaces a cold start that would end later only where the caller knows both times:
  the simulator does, the operator never cancels a start (last tests).
"""

from __future__ import annotations

import dataclasses
from collections import deque
from dataclasses import dataclass, field

import numpy as np
import pytest
from operator_builders import HASHES, NOW, convert, make_instance, make_spec

from xpyd_api.instances import Step, Transition, TransitionKind
from xpyd_api.names import Role
from xpyd_api.resize import Member, Moves, resize
from xpyd_controller.policy.types import Decision, Limits
from xpyd_controller.sim import engine
from xpyd_controller.sim.config import Control, Fleet, Realism, SimConfig
from xpyd_controller.sim.engine_instance import (
    CONVERTING,
    DECODE,
    DRAINING,
    PREFILL,
    READY,
    STARTING,
    Instance,
)
from xpyd_controller.sim.seed import SEED_HARDWARE, SEED_SLO
from xpyd_controller.sim.traces import Trace
from xpyd_operator.core.actions import BeginTransition, CancelTransition, CreateInstance, DeleteInstance
from xpyd_operator.core.scaling import PlanInput, plan

P, D = Role.PREFILL, Role.DECODE


@dataclass(frozen=True)
class Pod:
    """One instance of a case: state is ready | starting | draining (for removal) | converting (into role)."""

    name: str
    role: Role
    state: str = "ready"
    load: int = 0
    created: float = 0.0


@dataclass(frozen=True)
class Case:
    title: str
    desired: tuple[int, int]
    pods: tuple[Pod, ...]
    moves: frozenset[tuple[str, str]]  # (name, "convert" | "remove" | "take back" | "redirect")
    creates: dict[Role, int] = field(default_factory=dict)
    conversion: bool = True


def case(
    title: str, desired: tuple[int, int], pods: list[Pod], moves: dict[str, str], **extra: object
) -> Case:
    return Case(title, desired, tuple(pods), frozenset(moves.items()), **extra)  # type: ignore[arg-type]


CASES = [
    case("at size: nothing", (1, 1), [Pod("p0", P), Pod("d0", D)], {}),
    case("short: starts", (3, 1), [Pod("p0", P), Pod("d0", D)], {}, creates={P: 2}),
    case(
        "over: the least loaded goes, then among equals the newest",
        (1, 1),
        [
            Pod("p0", P),
            Pod("d0", D, load=1),
            Pod("d1", D, load=5, created=1),
            Pod("d2", D, load=1, created=2),
        ],
        {"d0": "remove", "d2": "remove"},
    ),
    case(
        "over: a starting instance goes before any ready one",
        (1, 2),
        [Pod("p0", P), Pod("d0", D, load=9), Pod("d1", D, load=9), Pod("d2", D, state="starting")],
        {"d2": "remove"},
    ),
    case(
        "surplus and deficit: the least loaded ready instance converts",
        (2, 1),
        [Pod("p0", P), Pod("d0", D, load=3), Pod("d1", D, load=1)],
        {"d1": "convert"},
    ),
    case(
        "settled: a starting instance never converts, it is removed and the other pool starts one",
        (2, 1),
        [Pod("p0", P), Pod("d0", D), Pod("d1", D, state="starting")],
        {"d1": "remove"},
        creates={P: 1},
    ),
    case(
        "settled: never the last ready instance of a pool (conversion)",
        (2, 1),
        [Pod("p0", P), Pod("d0", D), Pod("d1", D, state="converting")],
        {},
        creates={P: 1},
    ),
    case(
        "settled: never the last ready instance of a pool (removal beside conversions into it)",
        (2, 1),
        [Pod("p0", P), Pod("p1", P, state="converting"), Pod("d0", D), Pod("d1", D, state="converting")],
        {},
    ),
    case(
        "settled: a short pool takes back its draining instance instead of converting one",
        (2, 1),
        [Pod("p0", P), Pod("p1", P, state="draining"), Pod("d0", D), Pod("d1", D, created=1)],
        {"p1": "take back", "d1": "remove"},
    ),
    case(
        "a short pool takes over the other pool's drain for removal: it switches once drained",
        (1, 2),
        [Pod("p0", P), Pod("p1", P, state="draining"), Pod("d0", D)],
        {"p1": "redirect"},
    ),
    case(
        "a drain taken over before a ready instance converts or a cold start",
        (1, 3),
        [Pod("p0", P), Pod("p1", P, state="draining"), Pod("p2", P, created=1), Pod("d0", D)],
        {"p1": "redirect", "p2": "convert"},
    ),
    case(
        "the draining pool takes back its own first; nothing left to take over",
        (2, 2),
        [Pod("p0", P), Pod("p1", P, state="draining"), Pod("d0", D)],
        {"p1": "take back"},
        creates={D: 1},
    ),
    case(
        "conversion off: the drain goes on, the short pool starts one",
        (1, 2),
        [Pod("p0", P), Pod("p1", P, state="draining"), Pod("d0", D)],
        {},
        creates={D: 1},
        conversion=False,
    ),
    case(
        "conversion off: remove here, start there",
        (2, 1),
        [Pod("p0", P), Pod("d0", D), Pod("d1", D, load=2)],
        {"d0": "remove"},
        creates={P: 1},
        conversion=False,
    ),
    case(
        "an instance converting in counts: nothing more to do",
        (2, 1),
        [Pod("p0", P), Pod("p1", P, state="converting"), Pod("d0", D)],
        {},
    ),
]


def rule_moves(c: Case) -> tuple[frozenset[tuple[str, str]], dict[Role, int]]:
    members = [
        Member(
            pod.name,
            pod.role,
            ready=pod.state == "ready",
            busy=pod.state == "converting",
            load=float(pod.load),
            created=pod.created,
        )
        for pod in c.pods
        if pod.state != "draining"
    ]
    draining = [Member(pod.name, pod.role, ready=True) for pod in c.pods if pod.state == "draining"]
    moves = resize({P: c.desired[0], D: c.desired[1]}, members, draining, conversion=c.conversion)
    return _summary(moves), {r: n for r, n in moves.create.items() if n}


def _summary(moves: Moves[str]) -> frozenset[tuple[str, str]]:
    return frozenset(
        [(k, "take back") for k in moves.take_back]
        + [(k, "convert") for k, _ in moves.convert]
        + [(k, "remove") for k in moves.remove]
        + [(k, "redirect") for k, _ in moves.redirect]
    )


def operator_moves(c: Case) -> tuple[frozenset[tuple[str, str]], dict[Role, int]]:
    instances = []
    for pod in c.pods:
        transition: Transition | None = None
        if pod.state == "converting":
            transition = convert(pod.role.other)
        elif pod.state == "draining":
            transition = Transition(TransitionKind.REMOVE, pod.role, None, Step.DRAINING, NOW - 1, NOW - 1)
        role = pod.role.other if pod.state == "converting" else pod.role
        instances.append(
            make_instance(
                pod.name, role, ready=pod.state != "starting", transition=transition, created=pod.created
            )
        )
    spec = make_spec(
        prefill=c.desired[0],
        decode=c.desired[1],
        conversion={"enabled": c.conversion, "drainTimeoutSeconds": 30},
    )
    loads: dict[str, int | None] = {pod.name: pod.load for pod in c.pods}
    moves: set[tuple[str, str]] = set()
    creates: dict[Role, int] = {}
    for action in plan(PlanInput("x", spec, instances, HASHES, loads, NOW)):
        match action:
            case CreateInstance(role=role):
                creates[role] = creates.get(role, 0) + 1
            case DeleteInstance(instance=instance):
                moves.add((instance.name, "remove"))
            case CancelTransition(instance=instance):
                moves.add((instance.name, "take back"))
            case BeginTransition(instance=instance, transition=t) if instance.transition is not None:
                assert t.kind is TransitionKind.CONVERT and t.started == instance.transition.started
                moves.add((instance.name, "redirect"))  # the same drain, ending in a switch
            case BeginTransition(instance=instance, transition=t):
                moves.add((instance.name, "convert" if t.kind is TransitionKind.CONVERT else "remove"))
    return frozenset(moves), creates


def _simulation(c: Case, realism: Realism) -> tuple[engine._Simulation, dict[str, Instance]]:
    cfg = dataclasses.replace(
        SimConfig(SEED_HARDWARE, Fleet("disagg", 1, 1), realism, SEED_SLO),
        control=Control(role_conversion=c.conversion),
    )
    one = np.ones(1)
    requests = Trace(
        one * 1e6, one.astype(np.int64) * 100, one.astype(np.int64) * 10, one.astype(np.int64) * 0
    )
    sim = engine._Simulation(cfg, requests, None, Limits(prefill_min=0, decode_min=0), None)
    sim.instances.clear()
    sim.ready = {PREFILL: [], DECODE: []}
    by_name = {}
    for pod in c.pods:
        state = {
            "ready": READY,
            "starting": STARTING,
            "draining": DRAINING,
            "converting": CONVERTING,
        }[pod.state]
        role = str(pod.role.other if pod.state == "converting" else pod.role)
        inst = sim._new_instance(role, state, pod.created)
        inst.target_role = str(pod.role)
        if state == READY:
            sim._add_ready(inst)
        if role == DECODE:
            inst.size = pod.load  # requests in its batch: what the simulator's load counts
        elif pod.load:
            inst.done_times = deque(
                [NOW + 1.0] * (pod.load - 1)
            )  # prefill load: queued jobs + the running one
        by_name[pod.name] = inst
    return sim, by_name


def simulator_moves(c: Case) -> tuple[frozenset[tuple[str, str]], dict[Role, int]]:
    sim, by_name = _simulation(c, Realism(drain_s=1.0, cold_start_s=60.0, conversion_s=60.0))
    before = {name: inst.state for name, inst in by_name.items()}
    sim._apply(Decision(c.desired[0], c.desired[1], binding="table"), NOW)
    moves = set()
    for name, inst in by_name.items():
        was, now = before[name], inst.state
        gone = inst not in sim.instances
        if was == DRAINING and now == READY:
            moves.add((name, "take back"))
        elif was == DRAINING and now == CONVERTING:
            moves.add((name, "redirect"))
        elif was == READY and now == CONVERTING:
            moves.add((name, "convert"))
        elif (was == READY and now == DRAINING) or (was == STARTING and gone):
            moves.add((name, "remove"))
    known = set(by_name.values())
    creates: dict[Role, int] = {}
    for inst in sim.instances:
        if inst not in known:
            creates[Role(inst.role)] = creates.get(Role(inst.role), 0) + 1
    return frozenset(moves), creates


@pytest.mark.parametrize("through", [rule_moves, operator_moves, simulator_moves], ids=lambda f: f.__name__)
@pytest.mark.parametrize("c", CASES, ids=[c.title for c in CASES])
def test_the_operator_and_the_simulator_resize_alike(c: Case, through: object) -> None:
    assert through(c) == (c.moves, c.creates)  # type: ignore[operator]


def test_a_desired_size_of_zero_lets_the_last_ready_instance_go() -> None:
    moves = resize({P: 0, D: 1}, [Member("p0", P, ready=True), Member("d0", D, ready=True)])
    assert moves.remove == ("p0",)


def test_none_keeps_a_pool_as_it_is() -> None:
    members = [Member("p0", P, ready=True), Member("p1", P, ready=True), Member("d0", D, ready=True)]
    assert resize({P: None, D: 2}, members, conversion=True) == Moves(create={D: 1})


def test_the_simulator_converts_instead_of_a_cold_start_that_ends_later() -> None:
    c = case(
        "late start", (2, 1), [Pod("p0", P), Pod("p1", P, state="starting"), Pod("d0", D), Pod("d1", D)], {}
    )
    sim, by_name = _simulation(c, Realism(drain_s=1.0, cold_start_s=300.0, conversion_s=5.0))
    by_name["p1"].ready_at = NOW + 300.0  # its cold start ends in 300 s, a conversion takes 5 s
    sim._apply(Decision(2, 1, binding="table"), NOW)
    assert by_name["p1"] not in sim.instances  # cancelled...
    assert by_name["d0"].state == CONVERTING  # ...for a conversion of the newest idle decode
    assert sim.scale_downs == 0  # a replaced start is no scale-down


def test_the_operator_never_cancels_a_start_it_cannot_time() -> None:
    instances = [
        make_instance("x-0", P),
        make_instance("x-1", P, ready=False),
        make_instance("x-2", D),
        make_instance("x-3", D, created=1),
    ]
    actions = plan(PlanInput("x", make_spec(prefill=2, decode=1), instances, HASHES, {}, NOW))
    assert [(type(a).__name__, a.instance.name) for a in actions] == [("BeginTransition", "x-3")]
    assert all(
        not isinstance(a, BeginTransition) or a.transition.kind is TransitionKind.REMOVE for a in actions
    )
