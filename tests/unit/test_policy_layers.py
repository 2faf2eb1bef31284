"""Each scaling layer on its own, driven by tables of (time, current, recommendation) steps."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from xpyd_controller.policy.layers import (
    InFlightGuard,
    RateLimiter,
    ScalingBehavior,
    ScalingLayers,
    Stabilizer,
    enforce_limits,
)
from xpyd_controller.policy.state import StateError
from xpyd_controller.policy.types import Limits, PoolState


@pytest.mark.parametrize(
    ("steps", "expected"),
    [
        # fast up: a single high recommendation goes through at once with a zero up window
        ([(0, 4, 8)], [(8, "")]),
        # slow down: the down window remembers the highest recent recommendation
        (
            [(0, 8, 8), (60, 8, 4), (120, 8, 4), (301, 8, 4)],
            [(8, ""), (8, "ScaleDownStabilized"), (8, "ScaleDownStabilized"), (4, "")],
        ),
        # a dip inside the window does not take effect, the next rise is immediate
        ([(0, 6, 6), (30, 6, 3), (60, 6, 9)], [(6, ""), (6, "ScaleDownStabilized"), (9, "")]),
    ],
)
def test_stabilizer_zero_up_window(
    steps: list[tuple[float, int, int]], expected: list[tuple[int, str]]
) -> None:
    stabilizer = Stabilizer(up_window_s=0.0, down_window_s=300.0)
    assert [stabilizer.apply(*step) for step in steps] == expected


@pytest.mark.parametrize(
    ("steps", "expected"),
    [
        # past the first window, a falling load scales in to the recommendation at once
        (
            [(0, 8, 8), (301, 8, 8), (316, 8, 6, True), (331, 6, 7, True)],
            [(8, ""), (8, ""), (6, ""), (7, "")],
        ),
        # the same recommendations without the fall wait out the window
        ([(0, 8, 8), (301, 8, 8), (316, 8, 6, False)], [(8, ""), (8, ""), (8, "ScaleDownStabilized")]),
    ],
)
def test_stabilizer_skips_the_down_window_on_a_falling_load(
    steps: list[tuple[float, int, int] | tuple[float, int, int, bool]], expected: list[tuple[int, str]]
) -> None:
    stabilizer = Stabilizer(up_window_s=0.0, down_window_s=300.0)
    assert [
        stabilizer.apply(*step[:3], falling=len(step) > 3 and bool(step[3])) for step in steps
    ] == expected


def test_a_new_stabilizer_trusts_its_first_recommendation_like_the_hpa() -> None:
    assert Stabilizer(up_window_s=0.0, down_window_s=300.0).apply(0, 8, 4) == (4, "")


def test_a_new_stabilizer_holds_what_it_found_while_the_inputs_settle_and_never_again() -> None:
    stabilizer = Stabilizer(up_window_s=0.0, down_window_s=300.0)
    assert stabilizer.apply(30, 8, 4, settle_s=80) == (8, "ScaleDownHeldWhileInputsSettle")
    assert stabilizer.apply(109, 8, 4, settle_s=80) == (8, "ScaleDownHeldWhileInputsSettle")
    assert stabilizer.apply(110, 8, 4, settle_s=80) == (4, "")  # settled: the window's 4s rule
    assert stabilizer.apply(120, 4, 3, settle_s=200) == (4, "ScaleDownStabilized")  # never the 8 again
    stabilizer = Stabilizer(up_window_s=0.0, down_window_s=60.0)
    assert stabilizer.apply(0, 8, 4, settle_s=10) == (8, "ScaleDownHeldWhileInputsSettle")
    assert stabilizer.apply(15, 8, 4, settle_s=10) == (4, "")  # settled: the found 8 is gone for good


def test_a_stabilizer_reports_the_largest_recommendation_since_a_time() -> None:
    stabilizer = Stabilizer(up_window_s=0.0, down_window_s=300.0)
    for time_s, recommended in ((0, 6), (15, 9), (30, 4), (45, 5)):
        stabilizer.apply(time_s, 6, recommended)
    assert [stabilizer.largest_since(t) for t in (0, 16, 45, 46)] == [9, 5, 5, 0]


def test_a_restarted_stabilizer_holds_the_count_it_finds_for_a_window_falling_or_not() -> None:
    stabilizer = Stabilizer(up_window_s=0.0, down_window_s=300.0)
    stabilizer.apply(0, 2, 2)
    stabilizer.forget()
    assert stabilizer.apply(1000, 8, 4, falling=True) == (8, "ScaleDownHeldAfterRestart")
    assert stabilizer.apply(1299, 8, 4) == (8, "ScaleDownHeldAfterRestart")
    assert stabilizer.apply(1300, 8, 4) == (4, "")


def test_a_restored_stabilizer_continues_the_window_it_is_given() -> None:
    stabilizer = Stabilizer(up_window_s=0.0, down_window_s=300.0)
    stabilizer.restore(
        {"history": [[0, 8], [100, 6]], "restarted": False, "found": [], "settled": True}, 100.0
    )
    assert stabilizer.apply(200, 8, 4) == (8, "ScaleDownStabilized")
    assert stabilizer.apply(301, 8, 4) == (6, "ScaleDownStabilized")  # 0 s has left the window
    assert stabilizer.apply(401, 6, 4) == (4, "")
    assert stabilizer.state() == {
        "history": [[200, 4], [301, 4], [401, 4]],
        "kept": [],
        "restarted": False,
        "found": [],
        "settled": True,
    }


def test_a_scale_in_holds_only_what_is_kept_of_the_recommendations() -> None:
    """Growth a caller does not keep (a backlog's, which drains once) goes as soon as it is no longer
    recommended; what it keeps holds for the down window."""
    stabilizer = Stabilizer(up_window_s=0.0, down_window_s=300.0)
    assert stabilizer.apply(0, 4, 4) == (4, "")
    assert stabilizer.apply(15, 4, 12, kept=6) == (12, "")  # up to the recommendation
    assert stabilizer.apply(30, 12, 12, kept=6) == (12, "")  # never below the recommendation
    assert stabilizer.apply(45, 12, 5, kept=5) == (6, "ScaleDownStabilized")  # the kept 6 holds
    assert stabilizer.largest_since(0) == 12  # what a conversion weighs: the recommendations
    kept_state = stabilizer.state()
    assert kept_state["kept"] == [[15, 6], [30, 6]]  # kept only where it differs from the recommendation
    resumed = Stabilizer(up_window_s=0.0, down_window_s=300.0)
    resumed.restore(_through_json(kept_state), 45.0)
    assert resumed.state() == kept_state
    assert resumed.apply(60, 6, 5, kept=5) == (6, "ScaleDownStabilized")
    assert stabilizer.apply(331, 6, 5, kept=5) == (5, "")  # 30 s has left the window


def _through_json(state: dict[str, Any]) -> Any:
    return json.loads(json.dumps(state, allow_nan=False))


def test_a_stabilizer_holding_what_it_found_hands_the_hold_on() -> None:
    first = Stabilizer(up_window_s=0.0, down_window_s=300.0)
    first.forget()
    assert first.apply(1000, 8, 4) == (8, "ScaleDownHeldAfterRestart")
    second = Stabilizer(up_window_s=0.0, down_window_s=300.0)
    second.restore(_through_json(first.state()), math.inf)
    assert second.state() == first.state()
    assert second.apply(1299, 8, 4) == (8, "ScaleDownHeldAfterRestart")  # the hold ends at 1300, not later
    assert second.apply(1300, 8, 4) == (4, "")


def test_a_rate_limiter_and_an_in_flight_guard_hand_their_periods_on() -> None:
    first = RateLimiter(ScalingBehavior(up_instances=2, up_percent=0, up_period_s=60))
    assert first.apply(0, 4, 100) == (6, "ScaleUpRateLimited")
    second = RateLimiter(first.limit)
    second.restore(_through_json(first.state()), math.inf)
    assert second.apply(30, 6, 100) == (6, "ScaleUpRateLimited")  # still within 0 s's period
    guard = InFlightGuard(timeout_s=300.0)
    guard.supply(10, PoolState(ready=3, starting=2))
    resumed = InFlightGuard(timeout_s=300.0)
    resumed.restore(_through_json(guard.state()), math.inf)
    assert resumed.supply(310, PoolState(ready=3, starting=2)) == (3, False, "InFlightTimedOut")
    resumed.restore({}, math.inf)  # a guard that was not timing anything (null: absent after a merge patch)
    assert resumed.supply(320, PoolState(ready=3, starting=2)) == (5, True, "InFlight")


def test_scaling_layers_hand_their_windows_to_a_new_instance() -> None:
    behavior = ScalingBehavior(down_instances=10, down_percent=100)
    first = ScalingLayers(behavior)
    for time_s, asked in ((0, (6, 5)), (60, (3, 2))):
        first.apply(time_s, (6, 5), asked, Limits())
    second = ScalingLayers(behavior)
    second.restore(_through_json(first.state()), math.inf)
    assert second.state() == first.state() and second.time_s == 60
    kept = second.apply(120, (6, 5), (2, 2), Limits())
    assert (kept.prefill, kept.decode) == (6, 5)  # the window still holds 0 s's 6 + 5
    lost = ScalingLayers(behavior)
    lost.forget()
    held = lost.apply(120, (6, 5), (2, 2), Limits())
    assert (held.prefill, held.decode) == (6, 5)
    fresh = ScalingLayers(behavior).apply(120, (6, 5), (2, 2), Limits())
    assert (fresh.prefill, fresh.decode) == (2, 2)


def test_scaling_layers_restore_all_or_nothing() -> None:
    behavior = ScalingBehavior()
    layers = ScalingLayers(behavior)
    layers.apply(0, (6, 5), (6, 5), Limits())
    before = layers.state()
    broken = _through_json(before)
    broken["prefill"]["window"]["history"] = [[0, 6], [30, 3]]  # a good prefill part is read first
    broken["decode"]["rate"]["history"] = [[0, -5]]
    with pytest.raises(StateError, match=r"^history\[0\] = -5: must be a whole number"):
        layers.restore(broken, math.inf)
    assert layers.state() == before


@pytest.mark.parametrize(
    ("counts", "message"),
    [
        ([3, 2.5, 0], r"^counts\[1\] = 2\.5: must be a whole number"),
        ([3, 2], r"^counts = \[3, 2\]: must be a list of 3 counts"),
        ([3, 0, -1], r"^counts\[2\] = -1: must be a whole number"),
    ],
)
def test_an_in_flight_guard_refuses_corrupt_counts_and_keeps_its_own(
    counts: list[float], message: str
) -> None:
    guard = InFlightGuard(timeout_s=300.0)
    guard.supply(10, PoolState(ready=3, starting=2))
    before = guard.state()
    with pytest.raises(StateError, match=message):
        guard.restore({"since": 10.0, "counts": counts}, math.inf)
    assert guard.state() == before


def test_stabilizer_up_window_needs_a_sustained_rise() -> None:
    stabilizer = Stabilizer(up_window_s=60.0, down_window_s=300.0)
    assert stabilizer.apply(0, 4, 4) == (4, "")
    assert stabilizer.apply(15, 4, 10) == (4, "ScaleUpStabilized")  # min over the last 60 s is 4
    assert stabilizer.apply(30, 4, 8) == (4, "ScaleUpStabilized")
    assert stabilizer.apply(76, 4, 9) == (8, "ScaleUpStabilized")  # the last 60 s hold 8 and 9
    assert stabilizer.apply(91, 8, 9) == (9, "")


@pytest.mark.parametrize(
    ("limit", "steps", "expected"),
    [
        (ScalingBehavior(up_instances=4, up_percent=100), [(0, 2, 20)], [(6, "ScaleUpRateLimited")]),
        (ScalingBehavior(up_instances=4, up_percent=100), [(0, 10, 40)], [(20, "ScaleUpRateLimited")]),
        (ScalingBehavior(down_instances=1, down_percent=10), [(0, 30, 10)], [(27, "ScaleDownRateLimited")]),
        (ScalingBehavior(down_instances=1, down_percent=10), [(0, 5, 1)], [(4, "ScaleDownRateLimited")]),
        # steps inside one period do not compound: the base is the period's extreme
        (
            ScalingBehavior(up_instances=2, up_percent=0, up_period_s=60),
            [(0, 4, 100), (30, 6, 100), (61, 6, 100)],
            [(6, "ScaleUpRateLimited"), (6, "ScaleUpRateLimited"), (8, "ScaleUpRateLimited")],
        ),
        (ScalingBehavior(), [(0, 5, 5), (10, 5, 7)], [(5, ""), (7, "")]),
    ],
)
def test_rate_limiter(
    limit: ScalingBehavior, steps: list[tuple[float, int, int]], expected: list[tuple[int, str]]
) -> None:
    limiter = RateLimiter(limit)
    assert [limiter.apply(*step) for step in steps] == expected


def test_in_flight_guard_counts_pending_as_supply_until_the_timeout() -> None:
    guard = InFlightGuard(timeout_s=300.0)
    assert guard.supply(0, PoolState(ready=3)) == (3, False, "")
    assert guard.supply(10, PoolState(ready=3, starting=2)) == (5, True, "InFlight")
    assert guard.supply(200, PoolState(ready=3, starting=2)) == (5, True, "InFlight")
    assert guard.supply(310, PoolState(ready=3, starting=2)) == (3, False, "InFlightTimedOut")
    assert guard.supply(320, PoolState(ready=5)) == (5, False, "")
    assert guard.supply(330, PoolState(ready=4, draining=1)) == (4, True, "InFlight")


def test_a_pool_growing_one_start_after_another_for_longer_than_the_timeout_is_not_stuck() -> None:
    guard = InFlightGuard(timeout_s=300.0)
    # Every 200 s one instance becomes ready and two more are asked for: always starting, never stuck.
    for step in range(6):
        ready, starting = 3 + step, 2 + step
        assert guard.supply(200.0 * step, PoolState(ready=ready, starting=starting)) == (
            ready + starting,
            True,
            "InFlight",
        )
    # Asking for more is no progress: with nothing ready for 300 s the starting ones are stuck.
    assert guard.supply(1100, PoolState(ready=8, starting=9)) == (17, True, "InFlight")
    assert guard.supply(1300, PoolState(ready=8, starting=9)) == (8, False, "InFlightTimedOut")
    assert guard.supply(1310, PoolState(ready=9, starting=8)) == (17, True, "InFlight")


@pytest.mark.parametrize(
    ("current", "proposed", "limits", "gpus", "expected", "reasons"),
    [
        ((2, 2), (3, 3), Limits(), (1, 1), (3, 3), ()),
        ((2, 2), (0, 99), Limits(), (1, 1), (1, 64), ("HeldWithinMinMax",)),
        # prefill grows fully while decode's shrink was rate-limited: trim the growth
        ((2, 6), (6, 5), Limits(gpu_budget=8), (1, 1), (3, 5), ("GrowthTrimmedToGpuBudget",)),
        ((2, 2), (5, 5), Limits(gpu_budget=8), (1, 1), (4, 4), ("GrowthTrimmedToGpuBudget",)),
        # already over budget (budget was lowered): shrink regardless of rate limits
        (
            (6, 6),
            (6, 6),
            Limits(gpu_budget=8),
            (1, 1),
            (4, 4),
            ("GrowthTrimmedToGpuBudget", "ShrunkToGpuBudget"),
        ),
        ((1, 1), (3, 1), Limits(gpu_budget=6), (2, 2), (2, 1), ("GrowthTrimmedToGpuBudget",)),
    ],
)
def test_enforce_limits(
    *,
    current: tuple[int, int],
    proposed: tuple[int, int],
    limits: Limits,
    gpus: tuple[int, int],
    expected: tuple[int, int],
    reasons: tuple[str, ...],
) -> None:
    bounded = enforce_limits(current, proposed, limits, *gpus)
    assert ((bounded.prefill, bounded.decode), bounded.reasons) == (expected, reasons)


def test_a_binding_budget_moves_an_instance_between_the_pools_only_after_a_down_window() -> None:
    """Under a budget one pool grows only by what the other gives up, a scale-in of the giver: it is
    stabilised as one, so an ask that flips by one instance does not move instances back and forth."""
    layers = ScalingLayers(ScalingBehavior(down_window_s=300.0), 1, 1)
    limits = Limits(prefill_max=20, decode_max=20, gpu_budget=14)
    steady = layers.apply(0.0, (6, 8), (6, 8), limits)
    assert (steady.prefill, steady.decode) == (6, 8)
    asked_more = layers.apply(15.0, (6, 8), (6, 10), limits)
    assert (asked_more.prefill, asked_more.decode) == (6, 8)
    assert "PrefillShareHeldUnderGpuBudget" in asked_more.reasons
    assert "GrowthTrimmedToGpuBudget" in asked_more.reasons
    for time_s in range(30, 316, 15):
        layers.apply(float(time_s), (6, 8), (6, 10), limits)
    moved = layers.apply(330.0, (6, 8), (6, 10), limits)  # the share of 6 has left the window
    assert (moved.prefill, moved.decode) == (5, 9)


def test_a_budget_takes_at_once_what_a_pool_does_not_keep() -> None:
    """A share granted for work that drains once (what the caller does not keep) is not held."""
    layers = ScalingLayers(ScalingBehavior(down_window_s=300.0, down_percent=100.0), 1, 1)
    limits = Limits(prefill_max=20, decode_max=20, gpu_budget=14)
    layers.apply(0.0, (10, 4), (10, 4), limits, kept=(6, 4))
    moved = layers.apply(15.0, (10, 4), (10, 8), limits, kept=(6, 8))
    assert (moved.prefill, moved.decode) == (8, 6)  # the budget's proportional split, at once
    assert "PrefillShareHeldUnderGpuBudget" not in moved.reasons


def test_layers_hold_an_in_flight_pool() -> None:
    layers = ScalingLayers(ScalingBehavior(), 1, 1)
    result = layers.apply(0.0, (2, 2), (5, 5), Limits(), held=(True, False))
    assert (result.prefill, result.decode) == (2, 5)
    assert "PrefillHeldInFlight" in result.reasons


@given(
    time_steps=st.lists(
        st.tuples(
            st.integers(0, 40),
            st.integers(0, 40),
            st.integers(0, 60),
            st.integers(0, 60),
            st.booleans(),
            st.booleans(),
        ),
        min_size=1,
        max_size=30,
    ),
    prefill_min=st.integers(0, 3),
    decode_min=st.integers(0, 3),
    spread=st.integers(0, 30),
    budget_slack=st.one_of(st.none(), st.integers(0, 40)),
    gpus=st.tuples(st.integers(1, 4), st.integers(1, 4)),
)
def test_layers_always_within_limits_and_budget(
    *,
    time_steps: list[tuple[int, int, int, int, bool, bool]],
    prefill_min: int,
    decode_min: int,
    spread: int,
    budget_slack: int | None,
    gpus: tuple[int, int],
) -> None:
    floor = prefill_min * gpus[0] + decode_min * gpus[1]
    limits = Limits(
        prefill_min=prefill_min,
        prefill_max=prefill_min + spread,
        decode_min=decode_min,
        decode_max=decode_min + spread,
        gpu_budget=None if budget_slack is None else floor + budget_slack,
    )
    layers = ScalingLayers(ScalingBehavior(up_window_s=30.0), *gpus)
    for index, (cur_p, cur_d, rec_p, rec_d, hold_p, hold_d) in enumerate(time_steps):
        result = layers.apply(15.0 * index, (cur_p, cur_d), (rec_p, rec_d), limits, (hold_p, hold_d))
        assert limits.prefill_min <= result.prefill <= limits.prefill_max
        assert limits.decode_min <= result.decode <= limits.decode_max
        if limits.gpu_budget is not None:
            assert result.prefill * gpus[0] + result.decode * gpus[1] <= limits.gpu_budget
