"""The HPA-style layers an autoscaler stacks on top of a raw recommendation, one small class each.

Order (as in the Kubernetes HPA): recommendation → stabilisation window → min/max and GPU budget →
rate limit → in-flight guard → hard limits. A pool the GPU budget shrinks to let the other grow is
stabilised too: it gives up instances only once its share has been smaller for a down window. Each layer works on one pool's instance count and
returns the count plus a CamelCase reason when it changed the answer; the policies compose them.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from xpyd_controller.policy.context import PolicyConfigError
from xpyd_controller.policy.limits import Clamped, clamp
from xpyd_controller.policy.state import (
    JsonMap,
    StateError,
    counts,
    envelope,
    flag,
    maybe_number,
    opened,
    rows,
    section,
)
from xpyd_controller.policy.types import Limits, PoolState


@dataclass
class Stabilizer:
    """HPA stabilisation: scale up to the *smallest* recommendation of the last `up_window_s`, down to
    the *largest* of the last `down_window_s`. Short up window = fast up; long down window = slow down.

    The count found at the first call may hold as a recommendation too. A new policy holds it for the
    `settle_s` its caller says its inputs need (the HPA's: a down window, since it records the current
    replicas as its first recommendation; 0: the first recommendation counts at once). A caller may
    say what of a recommendation a scale-in must keep (`kept`, at most the recommendation): growth for
    work that drains once, as a backlog, is then not held for the down window. One restarted
    without its window's recommendations (`forget`) holds it for a full down window, so it never
    scales in before it has watched one; given them back (`restore`, from the PDDeployment's status)
    it simply continues the window. On a `falling` load the down window is
    skipped (the larger recommendations of the window describe a load that has gone and, by the
    forecast, does not come back within it); a held found count still holds. Once its time is up it
    never holds again.
    """

    up_window_s: float
    down_window_s: float
    # Per call: its time, the recommendation, and what of it a scale-in keeps.
    _history: deque[tuple[float, int, int]] = field(default_factory=deque)
    _restarted: bool = False
    _found: tuple[float, int] | None = None
    _settled: bool = False

    def forget(self) -> None:
        """Restarted without the window's recommendations: the next call's found count stands in."""
        self._history.clear()
        self._restarted, self._found, self._settled = True, None, False

    def state(self) -> dict[str, Any]:
        return {
            "history": [[t, n] for t, n, _ in self._history],
            "kept": [[t, k] for t, n, k in self._history if k != n],  # only where it differs
            "restarted": self._restarted,
            "found": [] if self._found is None else [list(self._found)],
            "settled": self._settled,
        }

    def restore(self, data: JsonMap, latest_s: float) -> None:
        history = rows(data, "history", (False, True), latest_s=latest_s)
        kept_rows = rows(data, "kept", (False, True), latest_s=latest_s) if "kept" in data else []
        kept = {t: n for t, n in kept_rows}
        found = rows(data, "found", (False, True), latest_s=latest_s)[:1]
        self._history = deque((t, int(n), int(min(kept.get(t, n), n))) for t, n in history)
        self._restarted, self._settled = flag(data, "restarted"), flag(data, "settled")
        self._found = (found[0][0], int(found[0][1])) if found else None

    def apply(
        self,
        time_s: float,
        current: int,
        recommended: int,
        *,
        falling: bool = False,
        settle_s: float = 0.0,
        kept: int | None = None,
    ) -> tuple[int, str]:
        found = self._found_holding(time_s, current, settle_s)
        self._record(time_s, recommended, recommended if kept is None else min(kept, recommended))
        up = min(count for t, count, _ in self._history if t >= time_s - self.up_window_s)
        down_since = time_s if falling else time_s - self.down_window_s
        down = max(recommended, *(keep for t, _, keep in self._history if t >= down_since))
        result = up if up > current else max(down, found) if max(down, found) < current else current
        if result == recommended:
            return result, ""
        if recommended > current:
            return result, "ScaleUpStabilized"
        if found > down:
            return (
                result,
                "ScaleDownHeldAfterRestart" if self._restarted else "ScaleDownHeldWhileInputsSettle",
            )
        return result, "ScaleDownStabilized"

    def _record(self, time_s: float, recommended: int, kept: int) -> None:
        """Keep this call's recommendation and kept count; drop what has left both windows."""
        self._history.append((time_s, recommended, kept))
        horizon = time_s - max(self.up_window_s, self.down_window_s)
        while self._history and self._history[0][0] < horizon:
            self._history.popleft()

    def largest_since(self, since_s: float) -> int:
        """The largest recommendation recorded at or after `since_s` (0 when none)."""
        return max((count for t, count, _ in self._history if t >= since_s), default=0)

    def _found_holding(self, time_s: float, current: int, settle_s: float) -> int:
        """The found count while it holds, else 0."""
        if self._settled:
            return 0
        if self._found is None:
            self._found = (time_s, current)
        hold_s = self.down_window_s if self._restarted else settle_s
        if time_s - self._found[0] >= hold_s:
            self._settled = True
            return 0
        return self._found[1]


def require_in(
    policy: str, name: str, value: float, low: float, high: float = math.inf, *, open_low: bool = False
) -> None:
    """Reject a knob outside [low, high] (or (low, high] with `open_low`), naming policy, knob and rule."""
    ok = math.isfinite(value) and (value > low if open_low else value >= low) and value <= high
    if not ok:
        bounds = f"{'(' if open_low else '['}{low:g}, {high:g}]" if high != math.inf else None
        rule = (
            f"must be in {bounds}"
            if bounds
            else f"must be a finite number {'>' if open_low else '>='} {low:g}"
        )
        raise PolicyConfigError(policy, name, value, rule)


@dataclass(frozen=True)
class ScalingBehavior:
    """The HPA `behavior` knobs of every policy built on `ScalingLayers` (config classes inherit them)."""

    up_window_s: float = 0.0
    down_window_s: float = 300.0
    up_instances: int = 4
    up_percent: float = 100.0
    down_instances: int = 1
    down_percent: float = 10.0
    up_period_s: float = 60.0  # the period of the scale-up limit
    down_period_s: float = 60.0  # the scale-down limit's (spec.autoscaling.scaleDownPeriodSeconds)

    def check_behavior(self, policy: str) -> None:
        for name in (
            "up_window_s",
            "down_window_s",
            "up_instances",
            "up_percent",
            "down_instances",
            "down_percent",
        ):
            require_in(policy, name, getattr(self, name), 0)
        for name in ("up_period_s", "down_period_s"):
            require_in(policy, name, getattr(self, name), 0, open_low=True)

    def layers(self, prefill_gpus: int, decode_gpus: int) -> ScalingLayers:
        return ScalingLayers(self, prefill_gpus, decode_gpus)


@dataclass
class RateLimiter:
    """Caps movement relative to the pool's size at the start of the period (its extreme over the
    period), so several steps inside one period do not compound. Up and down have their own periods."""

    limit: ScalingBehavior
    _history: deque[tuple[float, int]] = field(default_factory=deque)

    def apply(self, time_s: float, current: int, desired: int) -> tuple[int, str]:
        longest = max(self.limit.up_period_s, self.limit.down_period_s)
        while self._history and self._history[0][0] <= time_s - longest:
            self._history.popleft()
        self._history.append((time_s, current))
        result, reason = desired, ""
        if desired > current:
            base = min(self._within(time_s, self.limit.up_period_s))
            cap = base + max(self.limit.up_instances, math.ceil(base * self.limit.up_percent / 100))
            if desired > cap:
                result, reason = max(cap, current), "ScaleUpRateLimited"
        elif desired < current:
            base = max(self._within(time_s, self.limit.down_period_s))
            cap = base - max(self.limit.down_instances, math.floor(base * self.limit.down_percent / 100))
            if desired < cap:
                result, reason = min(cap, current), "ScaleDownRateLimited"
        return result, reason

    def state(self) -> dict[str, Any]:
        return {"history": [[t, n] for t, n in self._history]}

    def restore(self, data: JsonMap, latest_s: float) -> None:
        self._history = deque((t, int(n)) for t, n in rows(data, "history", (False, True), latest_s=latest_s))

    def _within(self, time_s: float, period_s: float) -> list[int]:
        return [count for t, count in self._history if t > time_s - period_s]


@dataclass
class InFlightGuard:
    """Holds a pool while instances are starting or draining, until it has made no progress for
    `timeout_s`.

    Starting instances count as expected supply while the pool moves: since the last pass an instance
    became ready, or fewer are starting or draining. A pool that has not moved for `timeout_s` is
    presumed stuck (e.g. Pending with no free GPU): its starting instances no longer count, and it may
    move again. Timed from the last move, not from the first start, a pool that grows for longer than
    the timeout, one cold start after another, is never read as stuck.
    """

    timeout_s: float
    _since: float | None = None
    _counts: tuple[int, ...] = (0, 0, 0)  # ready, starting, draining at the last pass

    def state(self) -> dict[str, Any]:
        return {"since": self._since, "counts": list(self._counts)}

    def restore(self, data: JsonMap, latest_s: float) -> None:
        since = maybe_number(data, "since", high=latest_s)
        kept = (0, 0, 0) if data.get("counts") is None else counts(data, "counts", 3)
        self._since, self._counts = since, kept

    def supply(self, time_s: float, pool: PoolState) -> tuple[int, bool, str]:
        """(expected supply, whether the pool is held, reason)."""
        last, self._counts = self._counts, (pool.ready, pool.starting, pool.draining)
        if pool.starting == 0 and pool.draining == 0:
            self._since = None
            return pool.ready, False, ""
        moved = pool.ready > last[0] or pool.starting < last[1] or pool.draining < last[2]
        if self._since is None or moved:
            self._since = time_s
        if time_s - self._since >= self.timeout_s:
            return pool.ready, False, "InFlightTimedOut"
        return pool.ready + pool.starting, True, "InFlight"


@dataclass(frozen=True)
class Bounded:
    prefill: int
    decode: int
    reasons: tuple[str, ...]


def enforce_limits(
    current: tuple[int, int], proposed: tuple[int, int], limits: Limits, prefill_gpus: int, decode_gpus: int
) -> Bounded:
    """The last word: min/max always, and the GPU budget by first trimming growth, then anything.

    Rate limits and holds act per pool, so a pool that grows while the other's shrink is held back
    could overshoot the budget; trimming the larger growth first keeps every decision inside it.
    """
    x = min(max(proposed[0], limits.prefill_min), limits.prefill_max)
    y = min(max(proposed[1], limits.decode_min), limits.decode_max)
    reasons = ["HeldWithinMinMax"] if (x, y) != proposed else []
    budget = limits.gpu_budget
    if budget is None or x * prefill_gpus + y * decode_gpus <= budget:
        return Bounded(x, y, tuple(reasons))
    base_x, base_y = max(current[0], limits.prefill_min), max(current[1], limits.decode_min)
    while x * prefill_gpus + y * decode_gpus > budget and (x > base_x or y > base_y):
        if (x - base_x) * prefill_gpus >= (y - base_y) * decode_gpus and x > base_x:
            x -= 1
        else:
            y -= 1
    reasons.append("GrowthTrimmedToGpuBudget")
    if x * prefill_gpus + y * decode_gpus > budget:
        forced = clamp(x, y, limits, prefill_gpus, decode_gpus)
        x, y = forced.prefill, forced.decode
        reasons.append("ShrunkToGpuBudget")
    return Bounded(x, y, tuple(reasons))


@dataclass(frozen=True)
class Layered:
    """Final counts of both pools, the reasons collected on the way, and the bound that set them."""

    prefill: int
    decode: int
    reasons: tuple[str, ...]
    bound: str  # "gpu_budget", "min_max" or "" when no bound changed the recommendation


class ScalingLayers:
    """Stabilisation → min/max and budget → rate limit → hold → hard limits, for both pools."""

    ROLES = ("Prefill", "Decode")

    def __init__(self, behavior: ScalingBehavior, prefill_gpus: int = 1, decode_gpus: int = 1) -> None:
        self.prefill_gpus = prefill_gpus
        self.decode_gpus = decode_gpus
        self._stabilizers = [Stabilizer(behavior.up_window_s, behavior.down_window_s) for _ in self.ROLES]
        # Each pool's share of a binding budget: a move between the pools is a scale-in of one of them.
        self._shares = [Stabilizer(0.0, behavior.down_window_s) for _ in self.ROLES]
        self._limiters = [RateLimiter(behavior) for _ in self.ROLES]
        self.time_s: float | None = None  # the last `apply`'s

    def state(self) -> dict[str, Any]:
        pools = {
            role.lower(): {"window": stabilizer.state(), "share": share.state(), "rate": limiter.state()}
            for role, stabilizer, share, limiter in zip(
                self.ROLES, self._stabilizers, self._shares, self._limiters, strict=True
            )
        }
        return {"timeS": self.time_s, **pools}

    def restore(self, data: JsonMap, latest_s: float) -> None:
        """Continue from `state()`'s output, nothing in it later than `latest_s` (a `StateError`
        leaves this unchanged)."""
        fresh = [
            (
                Stabilizer(old.up_window_s, old.down_window_s),
                Stabilizer(0.0, old.down_window_s),
                RateLimiter(limiter.limit),
            )
            for old, limiter in zip(self._stabilizers, self._limiters, strict=True)
        ]
        for role, (stabilizer, share, limiter) in zip(self.ROLES, fresh, strict=True):
            part = section(data, role.lower())
            stabilizer.restore(section(part, "window"), latest_s)
            if "share" in part:  # states kept before shares were: none held yet
                share.restore(section(part, "share"), latest_s)
            limiter.restore(section(part, "rate"), latest_s)
        self.time_s = maybe_number(data, "timeS", high=latest_s)
        self._stabilizers = [stabilizer for stabilizer, _, _ in fresh]
        self._shares = [share for _, share, _ in fresh]
        self._limiters = [limiter for _, _, limiter in fresh]

    def largest_since(self, since_s: float) -> tuple[int, int]:
        """Each pool's largest recommendation recorded at or after `since_s`."""
        prefill, decode = (stabilizer.largest_since(since_s) for stabilizer in self._stabilizers)
        return prefill, decode

    def forget(self) -> None:
        """The windows are lost: hold what is found for a down window (`Stabilizer.forget`)."""
        for stabilizer in self._stabilizers:
            stabilizer.forget()
        self._shares = [Stabilizer(0.0, old.down_window_s) for old in self._shares]

    def apply(
        self,
        time_s: float,
        current: tuple[int, int],
        recommended: tuple[int, int],
        limits: Limits,
        held: tuple[bool, bool] = (False, False),
        *,
        falling: bool = False,
        settle_s: float = 0.0,
        kept: tuple[int, int] | None = None,
    ) -> Layered:
        """`current` is each pool's expected supply; a `held` pool keeps it (in-flight guard); on a
        `falling` load scale-ins skip the down window; a new policy holds the sizes it found for the
        `settle_s` its inputs need; a scale-in keeps `kept` of the recommendation (`Stabilizer`)."""
        self.time_s = time_s
        reasons: list[str] = []
        stable = []
        for role, stabilizer, now, asked, keep in zip(
            self.ROLES, self._stabilizers, current, recommended, kept or recommended, strict=True
        ):
            count, why = stabilizer.apply(time_s, now, asked, falling=falling, settle_s=settle_s, kept=keep)
            stable.append(count)
            reasons.append(why and role + why)
        bounded = clamp(stable[0], stable[1], limits, self.prefill_gpus, self.decode_gpus)
        reasons.extend(bounded.reasons)
        shared = self._share(
            time_s, current, stable, kept=kept or recommended, bounded=bounded, reasons=reasons
        )
        moved = []
        for role, limiter, now, desired, hold in zip(
            self.ROLES, self._limiters, current, shared, held, strict=True
        ):
            count, why = limiter.apply(time_s, now, now if hold else desired)
            moved.append(count)
            reasons.append(why and role + why)
            if hold and desired != now:
                reasons.append(f"{role}HeldInFlight")
        last = enforce_limits(current, (moved[0], moved[1]), limits, self.prefill_gpus, self.decode_gpus)
        reasons.extend(last.reasons)
        bound = "gpu_budget" if any("GpuBudget" in r for r in reasons) else bounded.binding
        return Layered(last.prefill, last.decode, tuple(r for r in reasons if r), bound)

    def _share(
        self,
        time_s: float,
        current: tuple[int, int],
        stable: list[int],
        *,
        kept: tuple[int, int],
        bounded: Clamped,
        reasons: list[str],
    ) -> list[int]:
        """Each pool's count after the budget: what the budget takes from a pool so the other can grow
        is a scale-in of it, so it gives up only what it has not been granted (of what it keeps, as
        its own window) over a down window."""
        shared = []
        for role, share, now, want, keep, got in zip(
            self.ROLES, self._shares, current, stable, kept, (bounded.prefill, bounded.decode), strict=True
        ):
            granted, _ = share.apply(time_s, now, got, kept=min(keep, got))
            taken = got < min(want, now)
            if taken and granted > got:
                reasons.append(f"{role}ShareHeldUnderGpuBudget")
            shared.append(min(granted, want, now) if taken else got)
        return shared


class LayeredPolicy:
    """`Resumable` for the policies whose only state is their `ScalingLayers` (as `_layers`)."""

    name: str
    _layers: ScalingLayers

    def state(self) -> dict[str, Any]:
        return envelope(self.name, self._layers.time_s, {"layers": self._layers.state()})

    def resume(self, state: Mapping[str, Any] | None, now_s: float) -> str:
        return resume_parts(self, state, now_s)

    def restore_parts(self, parts: JsonMap, latest_s: float) -> None:
        self._layers.restore(section(parts, "layers"), latest_s)

    def forget(self) -> None:
        self._layers.forget()


class _Parted(Protocol):
    name: str

    def restore_parts(self, parts: JsonMap, latest_s: float) -> None: ...

    def forget(self) -> None: ...


def resume_parts(policy: _Parted, state: Mapping[str, Any] | None, now_s: float) -> str:
    """`Resumable.resume` for a policy that restores its parts all or nothing (a `StateError` before
    any part is replaced) and forgets them when the state is lost."""
    if state is None:
        policy.forget()
        return ""
    try:
        policy.restore_parts(*opened(state, policy.name, now_s))
    except StateError as error:
        policy.forget()
        return str(error)
    return ""
