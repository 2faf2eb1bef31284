"""Holding the fleet for a load that fell fast below its usual level: which falls hold, and for how long."""

from __future__ import annotations

import json
from typing import Any

import pytest

from xpyd_controller.policy.state import StateError
from xpyd_controller.policy.xpyd.returning import ReturnHold

REGROWTH_S = 150.0  # a cold start plus a measuring window


def run(rates: list[float], kept: list[tuple[int, int]], hold_s: float = 1800.0) -> list[tuple[int, int]]:
    """The held sizes at one observation every 15 s, each asking the pools to keep `kept`."""
    hold = ReturnHold(hold_s)
    return [
        hold.observe(15.0 * step, rate, REGROWTH_S, sizes)
        for step, (rate, sizes) in enumerate(zip(rates, kept, strict=True))
    ]


def test_a_drop_to_near_zero_holds_the_fleet_until_the_load_is_back() -> None:
    rates = [40.0] * 40 + [20.0, 2.0] + [0.4] * 30 + [10.0, 30.0, 40.0]
    kept = [(7, 6)] * 42 + [(1, 1)] * 33  # the lull alone needs one of each
    held = run(rates, kept)
    assert held[:41] == [(0, 0)] * 41  # a steady load, and a fall to half of it, hold nothing
    assert held[41:72] == [(7, 6)] * 31  # fallen to 5 %: the fleet before the fall, through the lull
    assert held[72] == (7, 6)  # 10 req/s is below half the usual level still
    assert held[73:] == [(0, 0)] * 2  # back: followed as ever


def test_the_end_of_a_flash_crowd_is_followed() -> None:
    rates = [10.0] * 80 + [50.0] * 12 + [30.0, 10.0] + [10.0] * 40
    kept = [(3, 1)] * 80 + [(14, 3)] * 54
    assert set(run(rates, kept)) == {(0, 0)}  # back to the usual level, not below it


def test_a_ramp_down_slower_than_a_regrowth_is_followed() -> None:
    rates = [40.0 - 0.3 * step for step in range(120)]  # 40 to 4 req/s over 30 minutes
    kept = [(7, 6)] * 120
    assert set(run(rates, kept)) == {(0, 0)}


def test_the_hold_ends_hold_s_after_the_load_was_last_seen_fallen() -> None:
    rates = [40.0] * 40 + [0.0] * 200
    held = run(rates, [(7, 6)] * 240, hold_s=600.0)
    fallen_until = max(step for step, size in enumerate(held) if size != (0, 0))
    assert held[41] == (7, 6)
    # the usual level decays towards the lull, so the fall stays visible for a while, then the hold ends
    assert 41 < fallen_until < 239
    assert held[fallen_until + 1 :] == [(0, 0)] * (239 - fallen_until)


def test_a_hold_time_of_zero_never_holds() -> None:
    assert set(run([40.0] * 40 + [0.0] * 10, [(7, 6)] * 50, hold_s=0.0)) == {(0, 0)}


def test_a_hold_resumed_from_its_kept_state_continues_exactly() -> None:
    rates = [40.0] * 40 + [0.5] * 20 + [40.0] * 5
    kept = [(7, 6)] * 45 + [(2, 2)] * 20
    whole = run(rates, kept)
    first = ReturnHold(1800.0)
    got = [
        first.observe(15.0 * i, r, REGROWTH_S, s)
        for i, (r, s) in enumerate(zip(rates[:50], kept[:50], strict=True))
    ]
    second = ReturnHold(1800.0)
    second.restore(json.loads(json.dumps(first.state())), latest_s=49 * 15.0)
    got += [second.observe(15.0 * i, rates[i], REGROWTH_S, kept[i]) for i in range(50, len(rates))]
    assert got == whole


@pytest.mark.parametrize(
    ("change", "path"),
    [
        ({"recent": [[0.0, -1.0, 1, 1]]}, "recent"),
        ({"recent": [[0.0, 1.0, 1, 1]] * 65}, "recent"),
        ({"recent": [[1e15, 1.0, 1, 1]]}, "recent[0]"),
        ({"held": [1.5, 2]}, "held"),
        ({"held": [1]}, "held"),
        ({"usual": -3.0}, "usual"),
        ({"sinceS": 1e15}, "sinceS"),
    ],
)
def test_a_corrupt_kept_hold_is_rejected_by_name_and_changes_nothing(
    change: dict[str, Any], path: str
) -> None:
    hold = ReturnHold(1800.0)
    for step in range(45):
        hold.observe(15.0 * step, 40.0 if step < 40 else 0.5, REGROWTH_S, (7, 6))
    before = hold.state()
    with pytest.raises(StateError, match=rf"^{path.replace('[', '.').replace(']', '.')}"):
        hold.restore(before | change, latest_s=45 * 15.0)
    assert hold.state() == before
