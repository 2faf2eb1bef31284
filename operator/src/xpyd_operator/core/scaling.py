"""The reconcile plan: counts, replacements, scale-in victims, rolling updates and conversions.

Level-based: the plan looks only at what exists now (pods and the records on them), so running it again
after any partial execution, or after an operator restart, asks only for what is still missing. Creations
are paced: a pass asks for at most `max_creates` new instances (the next pass asks for more), so a
huge replica count costs a few actions per pass, never a list of all of them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from xpyd_api.instances import Instance, Step, Transition, TransitionKind
from xpyd_api.models import PDDeploymentSpec, RouterType
from xpyd_api.names import Reason, Role
from xpyd_api.resize import Member, Moves, resize, victim_order
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

DEFAULT_MAX_CREATES_PER_PASS = 8
# Where the routers' pools cannot be read (GET /workers), the seconds after serving=false by which the
# router has dropped the instance: vllm-router 0.1.17 follows a relabel in 0.3-0.9 s when lightly
# loaded (tests/integration/test_router_events.py) and took up to 3.5 s under the e2e demo's load on 2
# busy cores. Until then it may still send the instance new requests, so no drain ends sooner.
ROUTER_FOLLOW_SECONDS = 5.0


@dataclass(frozen=True)
class PlanInput:
    pdd_name: str
    spec: PDDeploymentSpec
    instances: Sequence[Instance]
    template_hashes: Mapping[Role, str]
    in_flight: Mapping[str, int | None] = field(default_factory=dict)  # by pod name; missing = unknown
    now: float = 0.0
    max_creates: int = DEFAULT_MAX_CREATES_PER_PASS  # new instances per pass, both roles together
    # requests each instance has finished since its engine started (read with in_flight where needed)
    finished: Mapping[str, int | None] = field(default_factory=dict)
    # pod IPs any router replica lists in its pools (GET /workers) while an instance drains; None when
    # not read or not every replica answered
    router_listed: frozenset[str] | None = None


def _member(inp: PlanInput, instance: Instance, role: Role) -> Member[str]:
    """The instance as the shared resize rule sees it: it serves when ready and in no transition.

    A ready instance no router lists yet counts as of unknown load (picked last): the router may be
    adding it (vllm-router adds pods one at a time), so its drain would wait for the router to list and
    drop it, up to the drain timeout, while an instance in the router's pools drains in seconds."""
    load = inp.in_flight.get(instance.name)
    unlisted = instance.transition is None and router_lists(inp, instance) is False
    return Member(
        instance.name,
        role,
        ready=instance.ready and instance.transition is None,
        busy=instance.transition is not None,
        load=None if load is None or unlisted else float(load),
        created=instance.created,
    )


def prefill_backlog_needed(spec: PDDeploymentSpec, instances: Sequence[Instance]) -> bool:
    """True when a decode instance drains behind a router that sends decode after prefill: the shell
    then reads every prefill instance's in-flight and finished counts too."""
    return spec.decode_sent_after_prefill and any(
        i.role is Role.DECODE and i.transition is not None and i.transition.step is Step.DRAINING
        for i in instances
    )


def _prefill_backlog(inp: PlanInput) -> tuple[tuple[str, int], ...] | None:
    """What each prefill instance must have finished for its current requests to be done, or None while
    any reading is missing."""
    backlog = []
    for instance in inp.instances:
        if instance.role is not Role.PREFILL or instance.deleting or instance.failed:
            continue
        running, finished = inp.in_flight.get(instance.name), inp.finished.get(instance.name)
        if running is None or finished is None:
            return None
        if running:
            backlog.append((instance.name, finished + running))
    return tuple(sorted(backlog))


def _backlog_done(inp: PlanInput, backlog: tuple[tuple[str, int], ...]) -> bool:
    """Every recorded prefill instance is gone, idle, or has finished as many requests as it had then."""
    present = {i.name for i in inp.instances if not (i.deleting or i.failed)}
    for pod, target in backlog:
        if pod not in present or inp.in_flight.get(pod) == 0:
            continue
        finished = inp.finished.get(pod)
        if finished is None or finished < target:
            return False
    return True


def router_lists(inp: PlanInput, instance: Instance) -> bool | None:
    """Whether any router replica lists the instance in its pools now (None: not known)."""
    if inp.router_listed is None or not instance.pod_ip:
        return None
    return instance.pod_ip in inp.router_listed


def router_dropped(inp: PlanInput, instance: Instance, transition: Transition) -> bool:
    """The router sends the instance no new request: no router replica lists it (their GET /workers)
    and one did when the drain began or since (else it may still be adding it); where either is not
    known, ROUTER_FOLLOW_SECONDS have passed since serving=false."""
    if inp.spec.router.type is RouterType.NONE:
        return True
    listed = router_lists(inp, instance)
    if listed is None or transition.router_listed is None:
        return inp.now - transition.step_started >= ROUTER_FOLLOW_SECONDS
    return not listed and transition.router_listed


def _drain_step(inp: PlanInput, instance: Instance, transition: Transition) -> Transition | str | None:
    """One look at a draining instance: "idle" or "timeout" when drained, a record to write when the
    drain learnt something (idle since, the prefill backlog), None to wait.

    Idle means: the router has dropped it (router_dropped); no request in the engine;
    for a vLLM prefill instance, the KV lease over since then (a decode instance may still pull); for a
    decode instance behind vllm-router, no request left at a prefill instance that the router had
    already given this decode instance (the prefill backlog, read once the router dropped it).
    """
    spec = inp.spec
    if inp.now - transition.step_started >= spec.conversion.drain_timeout_seconds:
        return "timeout"
    if router_lists(inp, instance) and transition.router_listed is False:
        return replace(transition, router_listed=True)  # the router has added it: its drop will count
    if not router_dropped(inp, instance, transition):
        return None
    return _engine_drain_step(inp, instance, transition)


def _engine_drain_step(inp: PlanInput, instance: Instance, transition: Transition) -> Transition | str | None:
    """`_drain_step` once the router has dropped the instance: what the engines still hold."""
    spec = inp.spec
    decode_after_prefill = instance.role is Role.DECODE and spec.decode_sent_after_prefill
    if decode_after_prefill and transition.prefill_backlog is None:
        recorded = _prefill_backlog(inp)
        return None if recorded is None else replace(transition, prefill_backlog=recorded)
    if inp.in_flight.get(instance.name) != 0:
        return replace(transition, idle_since=None) if transition.idle_since is not None else None
    if instance.role is Role.PREFILL and spec.prefill_holds_kv:
        if transition.idle_since is None:
            return replace(transition, idle_since=inp.now)
        if inp.now - transition.idle_since < spec.conversion.kv_lease_seconds:
            return None
    backlog = transition.prefill_backlog
    if decode_after_prefill and (backlog is None or not _backlog_done(inp, backlog)):
        return None
    return "idle"


def roles_needing_load(spec: PDDeploymentSpec, instances: Sequence[Instance]) -> set[Role]:
    """Roles with more members than desired: the shell reads those instances' load before planning."""
    return {role for role in Role if len(_members(instances, role)) > spec.pool(role).replicas}


def _members(instances: Sequence[Instance], role: Role) -> list[Instance]:
    return [i for i in instances if not i.leaving and i.effective_role == role]


def _transition_actions(inp: PlanInput, instance: Instance) -> list[Action]:
    transition = instance.transition
    if transition is None or instance.deleting or instance.failed:
        return []
    if transition.step is Step.DRAINING:
        result = _drain_step(inp, instance, transition)
        if result is None:
            return []
        if isinstance(result, Transition):
            return [AdvanceTransition(instance, result)]
        if transition.kind is TransitionKind.REMOVE:
            return [DeleteInstance(instance, f"drained ({result})")]
        return [AdvanceTransition(instance, transition.advance(Step.SWITCHING, inp.now, result))]
    assert transition.target is not None, "only conversions get past draining"
    if transition.step is Step.SWITCHING:
        return [SwitchEngine(instance, transition.target, inp.spec.switch_method)]
    return [VerifyEngine(instance, transition.target, inp.spec.switch_method)]


def _begin(
    inp: PlanInput, instance: Instance, kind: TransitionKind, target: Role | None, reason: str
) -> Action:
    transition = Transition(kind, instance.role, target, Step.DRAINING, inp.now, inp.now)
    listed = router_lists(inp, instance) if inp.spec.router.type is not RouterType.NONE else None
    return BeginTransition(instance, replace(transition, router_listed=listed), reason)


class _Namer:
    """Instance names `<pdd>-<n>`, lowest free n first: deterministic, so a retried create is idempotent."""

    def __init__(self, pdd_name: str, instances: Sequence[Instance]) -> None:
        self._prefix = f"{pdd_name}-"
        self._used = {i.name for i in instances}
        self._next = 0

    def take(self) -> str:
        while f"{self._prefix}{self._next}" in self._used:
            self._next += 1
        name = f"{self._prefix}{self._next}"
        self._used.add(name)
        return name


def _roll_role(
    inp: PlanInput, role: Role, members: list[Instance], busy: set[str], namer: _Namer, *, room: int
) -> list[Action]:
    """A rolling update of one role (the operator's own: the simulator has no templates): create within
    max_surge, remove outdated instances while the pool stays available, trim to desired + max_surge.

    `busy` names instances that already got an action this round (a conversion just begun): they count
    as members but are not picked again.
    """
    idle = [m for m in members if m.transition is None and m.name not in busy]
    outdated = [m for m in idle if m.template_hash != inp.template_hashes[role]]
    creates = _rolling_creates(inp, role, members, outdated)
    reason = "rolling update" if len(members) >= inp.spec.pool(role).replicas else "scale up or replace"
    actions: list[Action] = [
        CreateInstance(role, namer.take(), reason) for _ in range(max(0, min(creates, room)))
    ]
    victims = _rolling_victims(inp, role, members, idle, outdated)
    return actions + [_give_up(inp, victim, why) for victim, why in victims]


def _rolling_creates(inp: PlanInput, role: Role, members: list[Instance], outdated: list[Instance]) -> int:
    """New instances a rolling update starts: what the pool lacks, else one per outdated instance within
    max_surge (instances still leaving count against it)."""
    desired = inp.spec.pool(role).replicas
    leaving = sum(1 for i in inp.instances if i.leaving and not i.failed and i.role == role)
    surge_room = desired + inp.spec.rollout.max_surge - (len(members) + leaving)
    return max(desired - len(members), min(surge_room, len(outdated)))


def _rolling_victims(
    inp: PlanInput, role: Role, members: list[Instance], idle: list[Instance], outdated: list[Instance]
) -> list[tuple[Instance, str]]:
    """Instances a rolling update removes, and why: outdated ones while the pool stays available without
    them (unready ones at once), then the least useful idle ones beyond desired + max_surge."""
    rollout = inp.spec.rollout
    desired = inp.spec.pool(role).replicas

    def order(instance: Instance) -> tuple[bool, float, float]:
        return victim_order(_member(inp, instance, role))

    victims: list[tuple[Instance, str]] = []
    budget = sum(1 for m in idle if m.ready) - (desired - rollout.max_unavailable)
    for old in sorted(outdated, key=order):
        if not old.ready:
            victims.append((old, "rolling update (not ready)"))
        elif budget > 0:
            victims.append((old, "rolling update"))
            budget -= 1
    excess = len(members) - len(victims) - (desired + rollout.max_surge)
    chosen = {v.name for v, _ in victims}
    remaining = sorted((m for m in idle if m.name not in chosen), key=order)
    return victims + [(m, "scale down") for m in remaining[: max(0, excess)]]


def _give_up(inp: PlanInput, victim: Instance, why: str) -> Action:
    """A ready instance drains before it goes; an unready one is deleted at once."""
    if victim.ready:
        return _begin(inp, victim, TransitionKind.REMOVE, None, why)
    return DeleteInstance(victim, why)


def plan(inp: PlanInput) -> list[Action]:
    """Every action needed now to move the observed instances towards the spec, in four steps:

    1. each instance's own business: a failed pod is deleted, a transition in progress takes its next
       step (`_instance_actions`);
    2. the pool sizes by the resize rule the simulator shares (xpyd_api.resize), over the pools'
       members and the instances draining for removal (`_resize`);
    3. the moves between pools: drains for removal taken back or redirected into a switch, conversions
       begun (`_moves_between_pools`), each instance then counted in the pool it will serve;
    4. per role, the creates and removals the rule asks for, or a rolling update where the role's
       template changed (`_pool_actions`), at most `max_creates` creates in all.
    """
    actions = _instance_actions(inp)
    members = {role: _members(inp.instances, role) for role in Role}
    moves = _resize(inp, members)
    actions = _moves_between_pools(inp, moves, actions, members)
    busy = {name for name, _ in (*moves.convert, *moves.redirect)}
    return actions + _pool_actions(inp, moves, members, busy)


def _instance_actions(inp: PlanInput) -> list[Action]:
    """Step 1: failed pods go; every transition in progress takes its next step."""
    actions: list[Action] = []
    for instance in inp.instances:
        if instance.failed and not instance.deleting:
            actions.append(DeleteInstance(instance, Reason.PODS_FAILED))
        else:
            actions += _transition_actions(inp, instance)
    return actions


def _drains_for_removal(instance: Instance) -> bool:
    transition = instance.transition
    return (
        transition is not None
        and transition.kind is TransitionKind.REMOVE
        and transition.step is Step.DRAINING
        and not (instance.deleting or instance.failed)
    )


def _resize(inp: PlanInput, members: Mapping[Role, list[Instance]]) -> Moves[str]:
    """Step 2: what the shared resize rule asks of the two pools."""
    return resize(
        {role: inp.spec.pool(role).replicas for role in Role},
        [_member(inp, i, role) for role in Role for i in members[role]],
        [_member(inp, i, i.role) for i in inp.instances if _drains_for_removal(i)],
        conversion=inp.spec.conversion.enabled and inp.spec.roles_compatible,
    )


def _without(actions: list[Action], instance: Instance) -> list[Action]:
    """The actions, less any for `instance` (a move between pools replaces them)."""
    return [a for a in actions if getattr(a, "instance", None) != instance]


def _moves_between_pools(
    inp: PlanInput, moves: Moves[str], actions: list[Action], members: dict[Role, list[Instance]]
) -> list[Action]:
    """Step 3: `actions` with the moves between pools carried out; `members` then counts each moved
    instance in the pool it will serve."""
    by_name = {i.name: i for i in inp.instances}
    # A pool that needs instances again takes back the ones it is still draining for removal.
    for name in moves.take_back:
        instance = by_name[name]
        actions = [*_without(actions, instance), CancelTransition(instance)]
        members[instance.role].append(instance)
    # A pool that needs instances takes over the other pool's drains for removal: they end in a switch.
    for name, target in moves.redirect:
        instance = by_name[name]
        actions = _redirect(actions, instance, target)
        members[target].append(instance)
    for name, target in moves.convert:
        instance = by_name[name]
        actions.append(_begin(inp, instance, TransitionKind.CONVERT, target, f"convert to {target}"))
        members[instance.role].remove(instance)
        members[target].append(instance)
    return actions


def _redirect(actions: list[Action], instance: Instance, target: Role) -> list[Action]:
    """A drain for removal turned into a conversion to `target`: the drain goes on (as this pass
    advances it, if it does) and ends in a switch instead of a deletion."""
    drain = next(
        (a.transition for a in actions if isinstance(a, AdvanceTransition) and a.instance == instance),
        instance.transition,
    )
    assert drain is not None, "only instances draining for removal are redirected"
    converting = replace(drain, kind=TransitionKind.CONVERT, target=target)
    return [
        *_without(actions, instance),
        BeginTransition(instance, converting, f"convert to {target} instead of removal"),
    ]


def _pool_actions(
    inp: PlanInput, moves: Moves[str], members: Mapping[Role, list[Instance]], busy: set[str]
) -> list[Action]:
    """Step 4: per role, a rolling update where an idle member runs an outdated template, else the
    rule's creates and removals; creates share the pass's `max_creates`."""
    namer = _Namer(inp.pdd_name, inp.instances)
    room = inp.max_creates
    actions: list[Action] = []
    for role in Role:
        if _template_changed(inp, role, members[role], busy):
            role_actions = _roll_role(inp, role, members[role], busy, namer, room=room)
        else:
            role_actions = _scale_role(inp, role, moves, members[role], namer, room=room)
        room -= sum(1 for a in role_actions if isinstance(a, CreateInstance))
        actions += role_actions
    return actions


def _template_changed(inp: PlanInput, role: Role, members: list[Instance], busy: set[str]) -> bool:
    """An idle member of the role (in no transition, given no move this pass) runs an older template."""
    now = inp.template_hashes[role]
    return any(m.template_hash != now and m.transition is None and m.name not in busy for m in members)


def _scale_role(
    inp: PlanInput, role: Role, moves: Moves[str], members: list[Instance], namer: _Namer, *, room: int
) -> list[Action]:
    """The rule's creates for the role (within `room`) and its removals among the role's members."""
    creates = max(0, min(moves.create.get(role, 0), room))
    actions: list[Action] = [
        CreateInstance(role, namer.take(), "scale up or replace") for _ in range(creates)
    ]
    by_name = {m.name: m for m in members}
    return actions + [_give_up(inp, by_name[name], "scale down") for name in moves.remove if name in by_name]
