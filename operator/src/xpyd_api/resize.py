"""The one rule from desired pool sizes to moves, shared by the operator's plan and the simulator.

The operator's planner (`scaling.plan` in xpyd_operator) and the simulator (xpyd_controller.sim.engine)
both call `resize`, so the conversions, starts and removals that a benchmark measures are the ones the
operator makes. In order, for each pool:

1. A pool below its desired size takes back instances it is draining for removal (no cold start).
   A pool still short, when conversions are allowed, takes over the other pool's instances draining
   for removal: their drain goes on and ends in a switch instead of a deletion (they are out of
   service already, so this costs no capacity). A policy that shrinks one pool in one pass and grows
   the other in a later one, while the drain is still on, converts that way.
2. Conversions (when allowed): a pool with a surplus converts ready, idle instances to a pool with a
   deficit, in victim order. A starting instance never converts (it is removed instead: a new one of
   the other role is no slower than finishing the cold start, draining and switching).
3. A surplus instance also converts instead of a cold start of the other pool that would end later
   than the conversion (`conversion_seconds`); that start is cancelled. Only a caller that knows both
   times gets this: the simulator does; the operator knows neither, so it never cancels a start.
4. A pool still short starts new instances; a pool still over removes idle members in victim order:
   unready first, then the least loaded (unknown load last), then the newest.

Neither a conversion nor a removal takes a pool's last ready instance while its desired size is above
zero (the pool would stop serving until something else got ready). Members in a transition (converting
in, just taken back) count towards their pool but are never picked.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from xpyd_api.names import Role

Key = TypeVar("Key", bound=Hashable)


@dataclass(frozen=True)
class Member(Generic[Key]):
    """One instance as the rule sees it; `key` is whatever names it for the caller."""

    key: Key
    role: Role  # the pool it counts in: a converting instance counts in its target's
    ready: bool  # serving now
    busy: bool = False  # in a transition: counts in `role` but is never picked
    load: float | None = None  # requests in it; None when unknown
    created: float = 0.0  # seconds (any epoch): newer instances go first among equals
    ready_in: float | None = None  # a starting instance: seconds until it serves, when known


@dataclass(frozen=True)
class Moves(Generic[Key]):
    """What to do, as keys of the members and draining instances given to `resize`."""

    take_back: tuple[Key, ...] = ()  # draining for removal: serve again
    convert: tuple[tuple[Key, Role], ...] = ()  # drain, switch to the role, serve again
    cancel: tuple[Key, ...] = ()  # starting instances a conversion replaces: delete now
    create: Mapping[Role, int] = field(default_factory=dict)  # new instances per pool
    remove: tuple[Key, ...] = ()  # unready: delete now; ready: drain, then delete
    redirect: tuple[tuple[Key, Role], ...] = ()  # draining for removal: switch to the role when drained


def victim_order(member: Member[Key]) -> tuple[bool, float, float]:
    """Sort key of instances to give up: unready first, then least loaded (unknown last), then newest."""
    return (member.ready, math.inf if member.load is None else member.load, -member.created)


def resize(
    desired: Mapping[Role, int | None],
    members: Sequence[Member[Key]],
    draining: Sequence[Member[Key]] = (),
    *,
    conversion: bool = False,
    conversion_seconds: float | None = None,
) -> Moves[Key]:
    """The moves that bring `members` to the `desired` size of each pool (None or missing: keep it).

    `draining` are instances being drained for removal (in the order to take them back or over). The
    order of the module docstring applies; `conversion` allows the take-over of step 1 and steps 2 and 3."""
    pools: dict[Role, list[Member[Key]]] = {role: [m for m in members if m.role is role] for role in Role}
    want = {
        role: len(pools[role]) if desired.get(role) is None else max(0, desired[role] or 0) for role in Role
    }
    take_back = _take_back(pools, want, draining)
    redirect: list[tuple[Key, Role]] = []
    convert: list[tuple[Key, Role]] = []
    cancel: list[Key] = []
    if conversion:
        redirect = _take_over(pools, want, draining, set(take_back))
        for source in Role:
            cancel += _convert(pools, want, source, convert, conversion_seconds)
    create, remove = _start_or_remove(pools, want)
    return Moves(tuple(take_back), tuple(convert), tuple(cancel), create, tuple(remove), tuple(redirect))


def _take_back(
    pools: dict[Role, list[Member[Key]]], want: Mapping[Role, int], draining: Sequence[Member[Key]]
) -> list[Key]:
    """Step 1: a pool below its size serves again with its own instances draining for removal."""
    take_back: list[Key] = []
    for role in Role:
        shortfall = want[role] - len(pools[role])
        for instance in [d for d in draining if d.role is role][: max(0, shortfall)]:
            take_back.append(instance.key)
            pools[role].append(Member(instance.key, role, ready=True, busy=True, created=instance.created))
    return take_back


def _take_over(
    pools: dict[Role, list[Member[Key]]],
    want: Mapping[Role, int],
    draining: Sequence[Member[Key]],
    taken: set[Key],
) -> list[tuple[Key, Role]]:
    """Step 1, with conversion: a pool still short takes over the other pool's draining instances."""
    redirect: list[tuple[Key, Role]] = []
    for role in Role:
        shortfall = want[role] - len(pools[role])
        given_up = [d for d in draining if d.role is role.other and d.key not in taken]
        for instance in given_up[: max(0, shortfall)]:
            redirect.append((instance.key, role))
            pools[role].append(Member(instance.key, role, ready=False, busy=True, created=instance.created))
    return redirect


def _convert(
    pools: dict[Role, list[Member[Key]]],
    want: Mapping[Role, int],
    source: Role,
    convert: list[tuple[Key, Role]],
    conversion_seconds: float | None,
) -> list[Key]:
    """Steps 2 and 3 from `source`'s surplus; returns the starting instances a conversion replaces."""
    target = source.other
    moves = min(len(pools[source]) - want[source], want[target] - len(pools[target]))
    for _ in range(max(0, moves)):
        if not _convert_one(pools, want, source, convert):
            break
    cancel: list[Key] = []
    while len(pools[source]) > want[source] and conversion_seconds is not None:
        late = [
            m
            for m in pools[target]
            if not (m.ready or m.busy) and m.ready_in is not None and m.ready_in > conversion_seconds
        ]
        if not late or not _convert_one(pools, want, source, convert):
            break
        latest = max(late, key=lambda m: m.ready_in or 0.0)
        pools[target].remove(latest)
        cancel.append(latest.key)
    return cancel


def _start_or_remove(
    pools: dict[Role, list[Member[Key]]], want: Mapping[Role, int]
) -> tuple[dict[Role, int], list[Key]]:
    """Step 4: start what is still short, remove what is still over (never a pool's last ready one)."""
    create: dict[Role, int] = {}
    remove: list[Key] = []
    for role in Role:
        pool = pools[role]
        if len(pool) < want[role]:
            create[role] = want[role] - len(pool)
            continue
        ready = sum(1 for m in pool if m.ready)
        for victim in sorted((m for m in pool if not m.busy), key=victim_order)[: len(pool) - want[role]]:
            if victim.ready:
                if ready <= 1 and want[role] > 0:
                    break
                ready -= 1
            remove.append(victim.key)
    return create, remove


def _convert_one(
    pools: dict[Role, list[Member[Key]]],
    want: Mapping[Role, int],
    source: Role,
    convert: list[tuple[Key, Role]],
) -> bool:
    """Convert the first ready, idle `source` member in victim order to the other role; False if none may go."""
    pool = pools[source]
    if sum(1 for m in pool if m.ready) <= 1 and want[source] > 0:
        return False
    candidates = sorted((m for m in pool if m.ready and not m.busy), key=victim_order)
    if not candidates:
        return False
    chosen = candidates[0]
    target = source.other
    pool.remove(chosen)
    pools[target].append(Member(chosen.key, target, ready=False, busy=True, created=chosen.created))
    convert.append((chosen.key, target))
    return True
