"""When a draining instance counts as idle: the engine's in-flight, vLLM's KV lease on prefill, and the
decode parts vllm-router has assigned but not yet sent (queued at prefill)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from tests.unit.operator_builders import HASHES, NOW, D, P, convert, make_instance, make_spec

from xpyd_api.instances import Instance, Step, Transition, TransitionKind
from xpyd_api.models import PDDeploymentSpec
from xpyd_operator.adapters.engine_client import parse_load
from xpyd_operator.core.actions import Action, AdvanceTransition, BeginTransition, DeleteInstance
from xpyd_operator.core.scaling import ROUTER_FOLLOW_SECONDS, PlanInput, plan, prefill_backlog_needed

LEASE = 30.0


def drain_actions(
    spec: PDDeploymentSpec,
    instances: list[Instance],
    in_flight: dict[str, int | None],
    finished: dict[str, int | None] | None = None,
    now: float = NOW,
) -> list[Action]:
    """The plan's actions on draining instances only (creations for the shrunken pool are not asked)."""
    actions = plan(PlanInput("x", spec, instances, HASHES, in_flight, now, finished=finished or {}))
    return [a for a in actions if isinstance(a, AdvanceTransition | DeleteInstance)]


def decode_removal(since: float, backlog: tuple[tuple[str, int], ...] | None = None) -> Transition:
    return Transition(TransitionKind.REMOVE, D, None, Step.DRAINING, since, since, prefill_backlog=backlog)


def fleet(transition: Transition) -> list[Instance]:
    """Two prefill instances, a serving decode and the draining decode x-3."""
    return [
        make_instance("x-0", P),
        make_instance("x-1", P),
        make_instance("x-2", D),
        make_instance("x-3", D, transition=transition),
    ]


SPEC = make_spec(prefill=2, decode=1)


def test_decode_waits_for_the_router_to_follow_before_reading_the_prefill_backlog() -> None:
    just_now = decode_removal(since=NOW - ROUTER_FOLLOW_SECONDS / 2)
    assert drain_actions(SPEC, fleet(just_now), {"x-3": 0, "x-0": 0, "x-1": 0}, {"x-0": 5, "x-1": 7}) == []


def test_decode_records_what_each_busy_prefill_instance_must_finish() -> None:
    transition = decode_removal(since=NOW - ROUTER_FOLLOW_SECONDS)
    actions = drain_actions(SPEC, fleet(transition), {"x-3": 0, "x-0": 4, "x-1": 0}, {"x-0": 10, "x-1": 7})
    assert len(actions) == 1 and isinstance(actions[0], AdvanceTransition)
    recorded = actions[0].transition
    assert recorded.step is Step.DRAINING and recorded.prefill_backlog == (("x-0", 14),)


def test_decode_backlog_is_not_recorded_while_a_prefill_reading_is_missing() -> None:
    transition = decode_removal(since=NOW - ROUTER_FOLLOW_SECONDS)
    assert drain_actions(SPEC, fleet(transition), {"x-3": 0, "x-0": 4, "x-1": 0}, {"x-0": 10}) == []


@pytest.mark.parametrize(
    ("title", "in_flight", "finished", "drained"),
    [
        ("prefill still has the queued requests", {"x-3": 0, "x-0": 2}, {"x-0": 13}, False),
        ("prefill finished as many as it had", {"x-3": 0, "x-0": 9}, {"x-0": 14}, True),
        ("prefill idle", {"x-3": 0, "x-0": 0}, {"x-0": 11}, True),
        ("prefill unreadable", {"x-3": 0}, {}, False),
        ("decode itself busy", {"x-3": 1, "x-0": 0}, {"x-0": 14}, False),
    ],
)
def test_decode_is_idle_only_when_no_queued_prefill_can_still_target_it(
    title: str, in_flight: dict[str, int | None], finished: dict[str, int | None], drained: bool
) -> None:
    transition = decode_removal(since=NOW - 5, backlog=(("x-0", 14),))
    actions = drain_actions(SPEC, fleet(transition), in_flight, finished)
    assert actions == ([DeleteInstance(fleet(transition)[3], "drained (idle)")] if drained else [])


def test_a_prefill_instance_gone_since_the_record_holds_nothing_back() -> None:
    transition = decode_removal(since=NOW - 5, backlog=(("x-9", 14),))
    actions = drain_actions(SPEC, fleet(transition), {"x-3": 0})
    assert [type(a) for a in actions] == [DeleteInstance]


def test_the_drain_timeout_bounds_the_backlog_wait() -> None:
    transition = decode_removal(since=NOW - 30, backlog=(("x-0", 14),))
    actions = drain_actions(SPEC, fleet(transition), {"x-3": 0, "x-0": 3}, {"x-0": 1})
    assert actions == [DeleteInstance(fleet(transition)[3], "drained (timeout)")]


@pytest.mark.parametrize(
    "spec",
    [
        make_spec(prefill=2, decode=1, router={"type": "sglang-router"}),
        make_spec(prefill=2, decode=1, engine={"type": "sglang"}, conversion={"switchMethod": "HTTP"}),
    ],
    ids=["sglang-router", "sglang engine"],
)
def test_routers_that_send_decode_with_prefill_need_no_backlog(spec: PDDeploymentSpec) -> None:
    transition = decode_removal(since=NOW - ROUTER_FOLLOW_SECONDS)
    assert not prefill_backlog_needed(spec, fleet(transition))
    assert [type(a) for a in drain_actions(spec, fleet(transition), {"x-3": 0})] == [DeleteInstance]


def test_no_drain_ends_before_the_router_can_have_dropped_the_instance() -> None:
    """Measured: under load vllm-router took up to 3.5 s to drop a pod relabelled serving=false."""
    idle = {"x-0": 0, "x-1": 0, "x-3": 0}
    finished = {"x-0": 1, "x-1": 1}
    early = decode_removal(since=NOW - ROUTER_FOLLOW_SECONDS + 0.5)
    assert drain_actions(SPEC, fleet(early), idle, finished) == []
    no_router = make_spec(prefill=2, decode=1, router={"type": "none"})
    assert [type(a) for a in drain_actions(no_router, fleet(early), idle, finished)] == [DeleteInstance]


def listed_fleet(transition: Transition) -> list[Instance]:
    """fleet() with pod IPs: x-<i> on 10.0.0.<i>."""
    return [replace(i, pod_ip=f"10.0.0.{i.name[-1]}") for i in fleet(transition)]


def router_actions(transition: Transition, listed: frozenset[str]) -> list[Action]:
    idle = {"x-0": 0, "x-1": 0, "x-3": 0}
    inp = PlanInput("x", SPEC, listed_fleet(transition), HASHES, idle, NOW, finished={"x-0": 1, "x-1": 1})
    inp = replace(inp, router_listed=listed)
    return [a for a in plan(inp) if isinstance(a, AdvanceTransition | DeleteInstance)]


def test_the_drain_waits_while_a_router_still_lists_the_instance() -> None:
    """Read from the routers' GET /workers: listed means it may still get new requests, however long ago
    it was relabelled."""
    long_ago = replace(decode_removal(since=NOW - 2 * ROUTER_FOLLOW_SECONDS), router_listed=True)
    assert router_actions(long_ago, frozenset({"10.0.0.0", "10.0.0.3"})) == []


def test_a_router_confirmed_drop_ends_the_follow_wait_at_once() -> None:
    """No router lists it any more (one did when the drain began): the backlog is recorded in the same
    pass, and with nothing queued at prefill the next pass deletes it."""
    just_now = replace(decode_removal(since=NOW), router_listed=True)
    (recorded,) = router_actions(just_now, frozenset({"10.0.0.0", "10.0.0.1", "10.0.0.2"}))
    assert isinstance(recorded, AdvanceTransition) and recorded.transition.prefill_backlog == ()
    after = router_actions(recorded.transition, frozenset({"10.0.0.0", "10.0.0.1", "10.0.0.2"}))
    assert [type(a) for a in after] == [DeleteInstance]


def test_prefill_backlog_is_read_only_while_a_decode_instance_drains() -> None:
    assert prefill_backlog_needed(SPEC, fleet(decode_removal(since=NOW)))
    converting_prefill = [make_instance("x-0", P, transition=convert(P)), make_instance("x-1", D)]
    assert not prefill_backlog_needed(SPEC, converting_prefill)


def prefill_fleet(transition: Transition) -> list[Instance]:
    return [make_instance("x-0", P, transition=transition), make_instance("x-1", D)]


PREFILL_SPEC = make_spec(
    prefill=0, decode=2, conversion={"kvLeaseSeconds": LEASE, "drainTimeoutSeconds": 120}
)


def test_prefill_first_seen_idle_starts_the_kv_lease_wait() -> None:
    transition = convert(P, since=NOW - 5)
    actions = drain_actions(PREFILL_SPEC, prefill_fleet(transition), {"x-0": 0})
    assert len(actions) == 1 and isinstance(actions[0], AdvanceTransition)
    assert actions[0].transition.idle_since == NOW and actions[0].transition.step is Step.DRAINING


@pytest.mark.parametrize(
    ("idle_for", "in_flight", "expected"),
    [
        (LEASE - 1, 0, "wait"),
        (LEASE, 0, "Switching"),
        (LEASE + 5, 2, "reset"),
    ],
)
def test_prefill_switches_only_after_the_kv_lease_since_it_went_idle(
    idle_for: float, in_flight: int, expected: str
) -> None:
    transition = replace(convert(P, since=NOW - LEASE - 10), idle_since=NOW - idle_for)
    actions = drain_actions(PREFILL_SPEC, prefill_fleet(transition), {"x-0": in_flight})
    if expected == "wait":
        assert actions == []
        return
    assert len(actions) == 1 and isinstance(actions[0], AdvanceTransition)
    if expected == "reset":
        assert actions[0].transition.idle_since is None and actions[0].transition.step is Step.DRAINING
    else:
        assert actions[0].transition.step is Step.SWITCHING and actions[0].transition.drain_result == "idle"


def test_sglang_prefill_has_no_lease_to_wait_for() -> None:
    spec = make_spec(prefill=0, decode=2, engine={"type": "sglang"}, conversion={"switchMethod": "HTTP"})
    actions = drain_actions(spec, prefill_fleet(convert(P)), {"x-0": 0})
    assert [a.transition.step for a in actions if isinstance(a, AdvanceTransition)] == [Step.SWITCHING]


def test_drain_facts_survive_the_record_round_trip() -> None:
    record = replace(decode_removal(since=NOW, backlog=(("x-0", 14), ("x-1", 3))), idle_since=NOW + 1)
    assert Transition.from_json(record.to_json()) == record


def test_a_corrupt_backlog_is_named() -> None:
    text = decode_removal(since=NOW).to_json().replace("}", ',"prefillBacklog":[1]}')
    with pytest.raises(ValueError, match=r"xpyd\.dev/transition"):
        Transition.from_json(text)


def test_finished_requests_are_the_prompt_histogram_count() -> None:
    text = "\n".join(
        [
            'vllm:num_requests_running{model_name="m"} 2.0',
            'vllm:num_requests_waiting{model_name="m"} 1.0',
            'vllm:request_prompt_tokens_count{model_name="m"} 41.0',
        ]
    )
    load = parse_load(text, make_spec().engine.type)
    assert (load.in_flight, load.finished) == (3, 41)
    assert parse_load("", make_spec().engine.type).finished is None


def test_an_instance_the_router_never_listed_waits_until_it_was_added_and_dropped() -> None:
    """Measured on kwok: vllm-router adds one pod at a time, waiting up to 30 s for its health; a pod
    drained meanwhile was absent from GET /workers, then added to its old pool (and got a request)
    right before the router saw serving=false."""
    others = frozenset({"10.0.0.0", "10.0.0.1", "10.0.0.2"})
    pending = replace(decode_removal(since=NOW - 2 * ROUTER_FOLLOW_SECONDS), router_listed=False)
    assert router_actions(pending, others) == []
    (seen,) = router_actions(pending, others | {"10.0.0.3"})
    assert isinstance(seen, AdvanceTransition) and seen.transition.router_listed is True
    (recorded,) = router_actions(seen.transition, others)
    assert isinstance(recorded, AdvanceTransition) and recorded.transition.prefill_backlog == ()


def test_a_drain_begins_with_whether_the_router_listed_the_instance() -> None:
    members = [replace(make_instance(f"x-{n}", D), pod_ip=f"10.0.0.{n}") for n in range(2)]
    spec = make_spec(prefill=0, decode=1)
    for listed, expected in ((frozenset({"10.0.0.0", "10.0.0.1"}), True), (frozenset(), False), (None, None)):
        inp = replace(PlanInput("x", spec, members, HASHES, {"x-0": 0, "x-1": 0}, NOW), router_listed=listed)
        (begin,) = [a for a in plan(inp) if isinstance(a, BeginTransition)]
        assert begin.transition.router_listed is expected
        assert Transition.from_json(begin.transition.to_json()) == begin.transition


def test_an_instance_the_router_has_not_listed_yet_is_picked_last() -> None:
    """Its drain would wait for the router to add and drop it (vllm-router adds pods one at a time), up
    to the drain timeout; a listed one drains in seconds."""
    members = [replace(make_instance(f"x-{n}", D, created=n), pod_ip=f"10.0.0.{n}") for n in range(2)]
    for prefill, decode, kind in ((0, 1, TransitionKind.REMOVE), (1, 1, TransitionKind.CONVERT)):
        idle = {"x-0": 0, "x-1": 0}
        inp = PlanInput("x", make_spec(prefill=prefill, decode=decode), members, HASHES, idle, NOW)
        for listed, victim in (
            (frozenset({"10.0.0.0", "10.0.0.1"}), "x-1"),
            (frozenset({"10.0.0.0"}), "x-0"),
        ):
            (begin,) = [a for a in plan(replace(inp, router_listed=listed)) if isinstance(a, BeginTransition)]
            assert (begin.instance.name, begin.transition.kind) == (victim, kind)
