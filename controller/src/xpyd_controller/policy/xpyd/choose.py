"""Combining the proposals for one decision: the model's band, the measured misses, the conversions.

Pure functions over counts. `recommend` turns supply and need into each pool's recommendation before
the HPA rails, and `hold_for_return` raises it to what a load that may return needs;
`release_for_conversion` runs after the rails and lets a pool with a surplus hand instances to a pool
that grows now (the driver converts them in place) instead of after its down window.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from xpyd_controller.policy.types import Limits, Observation
from xpyd_controller.policy.xpyd.need import Need

ROLES = ("Prefill", "Decode")


@dataclass(frozen=True)
class Pools:
    """Each pool's expected supply (ready + starting) and whether it is in flight (may grow, not shrink)."""

    supply: tuple[int, int]
    in_flight: tuple[bool, bool]


def missed_slos(observation: Observation, tpot_slo_s: float) -> dict[int, str]:
    """Pool index → reason, for a measured TPOT p90 over its SLO: the TPOT roofline that caps decode's
    batch is the one prediction no correction learns (TTFT's errors reach the sizes through the
    prefill and KV corrections and the backlog)."""
    measured = observation.tpot_p90_s
    if measured is not None and math.isfinite(measured) and measured > tpot_slo_s:
        return {1: "DecodeTpotMissed"}
    return {}


def recommend(
    pools: Pools, need: Need, *, partial: bool, missed: dict[int, str]
) -> tuple[list[int], list[str]]:
    """Per pool: up to the floor when below it; down to `keep` when above it (not on partial data, not
    while in flight); else hold. A measured miss (`missed_slos`) at or above the floor asks for one more
    instance (the model was optimistic), unless the pool is already growing."""
    counts, reasons = [], []
    for index, role in enumerate(ROLES):
        have, floor, keep = pools.supply[index], need.floor[index], need.keep[index]
        if have < floor:
            count, why = floor, "BelowModelFloor"
        elif have > keep and not partial and not pools.in_flight[index]:
            count, why = keep, "AboveNeed"
        elif have > keep:
            count, why = have, "PartialDataNoScaleDown" if partial else "HeldInFlight"
        else:
            count, why = have, "WithinTolerance"
        if index in missed and have >= floor and not pools.in_flight[index]:
            count, why = have + 1, missed[index]
        counts.append(count)
        reasons.append(role + why if not why.startswith(role) else why)
    return counts, reasons


def hold_for_return(counts: list[int], kept: list[int], reasons: list[str], held: tuple[int, int]) -> None:
    """Raise each pool's recommendation, and what its down window keeps, to the size held for a load
    that may return (`returning.py`; mutates the lists)."""
    for index, role in enumerate(ROLES):
        if held[index] > counts[index]:
            counts[index] = held[index]
            reasons[index] = f"{role}HeldForReturningLoad"
        kept[index] = max(kept[index], held[index])


def release_for_conversion(
    pools: Pools,
    need: Need,
    decided: list[int],
    *,
    limits: Limits,
    denied: tuple[int, int],
    cold_start_faster: bool,
    recent: tuple[int, int] = (0, 0),
) -> str:
    """Let a pool above its floor give instances to a pool that grows now (mutates `decided`).

    The surplus is supply above the floor (what meets the demand now), below the band's `keep` on
    purpose: the band guards a pool against flapping through cold starts, but a released instance is
    converted in place (seconds) where the other pool would cold-start one (minutes). `denied` is growth
    the GPU budget trimmed: with the budget spent, the growing pool gets exactly what the other releases.
    When cold starts were measured to serve sooner than conversions, only budget-trimmed growth pairs.
    `recent` is each pool's largest recommendation over the last conversion's lead time: a surplus
    gives only what the pool was not asked to hold over that time, since a conversion takes an
    instance out of service for that long and a mix that swings back sooner would need it again.
    """
    minimums = (limits.prefill_min, limits.decode_min)
    for grow, give in ((0, 1), (1, 0)):
        growth = max(0, decided[grow] - pools.supply[grow]) + denied[grow]
        if cold_start_faster:
            growth = denied[grow]
        held = max(need.keep[give], minimums[give], recent[give])
        surplus = min(decided[give], pools.supply[give]) - held
        if growth > 0 and surplus > 0 and not pools.in_flight[give]:
            moves = min(growth, surplus)
            decided[give] = min(decided[give], pools.supply[give]) - moves
            decided[grow] += min(moves, denied[grow])
            return f"{ROLES[give]}ReleasedForConversion"
    return ""
