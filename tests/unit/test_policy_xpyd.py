"""The xpyd policy against the real capacity model: its steps, every reason it gives, its knobs, its state."""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.unit.policy_context import CONTEXT

from xpyd_controller.model.sizing import PoolConfig, Slo, Workload, size_pools
from xpyd_controller.policy.context import PolicyConfigError
from xpyd_controller.policy.registry import make_policy
from xpyd_controller.policy.types import Decision, Limits, Observation, PoolState
from xpyd_controller.policy.xpyd import XpydConfig, XpydPolicy
from xpyd_controller.policy.xpyd.choose import (
    Pools,
    missed_slos,
    recommend,
    release_for_conversion,
)
from xpyd_controller.policy.xpyd.need import Need

ISL, OSL = 6000.0, 300.0


def model_plan(rate: float) -> tuple[int, int]:
    """The capacity model's own sizing at the SLOs."""
    plan = size_pools(
        CONTEXT.model,
        CONTEXT.gpu,
        CONTEXT.link,
        Workload(rate=rate, isl=ISL, osl=OSL),
        Slo(ttft=0.6, tpot=0.1, ttft_quantile=0.99),
        pools=PoolConfig(step_overhead=5e-3),
    )
    return int(plan.prefill_instances), int(plan.decode_instances)


def observe(time_s: float, prefill: int | PoolState, decode: int | PoolState, **changes: Any) -> Observation:
    fields: dict[str, Any] = {"arrival_rate": 20.0, "mean_input_tokens": ISL, "mean_output_tokens": OSL}
    fields.update(changes)
    return Observation(
        time_s=time_s,
        window_s=30.0,
        prefill=prefill if isinstance(prefill, PoolState) else PoolState(ready=prefill),
        decode=decode if isinstance(decode, PoolState) else PoolState(ready=decode),
        **fields,
    )


def policy(**knobs: float) -> XpydPolicy:
    made = make_policy("xpyd", dataclasses.replace(CONTEXT, knobs=knobs))
    assert isinstance(made, XpydPolicy)
    return made


def counts(decision: Decision) -> tuple[int | None, int | None]:
    return decision.prefill, decision.decode


def floors(decision: Decision) -> tuple[int, int]:
    return int(decision.details["prefill_floor"]), int(decision.details["decode_floor"])


def test_the_floor_is_the_capacity_models_plan() -> None:
    decision = policy().decide(observe(0, 1, 1), Limits())
    assert floors(decision) == model_plan(20.0)
    assert min(model_plan(20.0)) >= 2  # big enough for the tables below to mean something
    x, y = model_plan(20.0)
    assert counts(decision) == (min(x, 5), min(y, 5))  # 1 → at most 1 + max(4, 100 %) per 15 s
    assert decision.details["predicted_ttft_seconds"] <= 0.6
    assert decision.details["predicted_tpot_seconds"] <= 0.1
    assert decision.binding == "prefill_ttft_quantile+decode_kv_capacity"


def test_queued_prefill_work_is_sized_to_drain_within_the_backlog_time() -> None:
    calm = policy().decide(observe(0, 9, 9), Limits())
    queued = policy(backlog_drain_s=30).decide(observe(0, 9, 9, prefill_queue=309.0), Limits())
    assert queued.details["backlog_rate"] == 10.0  # 300 requests beyond one per ready instance, over 30 s
    assert floors(queued)[0] == model_plan(30.0)[0] > floors(calm)[0]
    assert floors(queued)[1] == floors(calm)[1]  # decode serves the arrivals, not the queue twice
    assert "PrefillBacklog" in queued.reasons


def test_a_rising_load_is_sized_for_the_lead_time_ahead() -> None:
    scaler = policy(lead_time_s=120)
    decision = None
    for step in range(20):
        decision = scaler.decide(observe(step * 15.0, 20, 20, arrival_rate=10.0 + step), Limits())
    assert decision is not None and "SizedForForecastLoad" in decision.reasons
    assert decision.details["sized_arrival_rate"] > decision.details["arrival_rate"] == 29.0


def test_an_instance_starting_longer_than_the_lead_time_lengthens_it() -> None:
    scaler = policy(lead_time_s=120)
    first = scaler.decide(observe(0, 1, 1), Limits())  # grows both pools: timed until they serve
    assert first.prefill is not None and first.decode is not None and min(counts(first)) > 1
    prefill, decode = (PoolState(ready=1, starting=n - 1) for n in (first.prefill, first.decode))
    waiting = [scaler.decide(observe(t, prefill, decode), Limits()) for t in (60.0, 120.0, 200.0)]
    assert [d.details["lead_time_seconds"] for d in waiting] == [120.0, 120.0, 200.0]
    served = scaler.decide(observe(260, first.prefill, first.decode), Limits())
    assert served.details["lead_time_seconds"] == 260.0  # the growth served: measured


@pytest.mark.parametrize("rate", [5e-324, 2.2e-309, 1e-300])
def test_a_vanishing_rate_after_a_rising_one_forecasts_a_finite_load(rate: float) -> None:
    scaler = policy(lead_time_s=120)
    rates = [0.0, 4.0, 9.0, rate, 9.0]
    decisions = [
        scaler.decide(observe(i * 15.0, 2, 2, arrival_rate=r), Limits()) for i, r in enumerate(rates)
    ]
    assert all(math.isfinite(d.details["sized_arrival_rate"]) for d in decisions)
    assert all(d.prefill is not None and d.decode is not None for d in decisions)


def _decode_floor_after(prompts: list[float], step_s: float | None) -> tuple[int, int]:
    """Both floors once windows 15 s apart showed these mean prompts, with 1000-token answers."""
    scaler = policy()
    for index, prompt in enumerate(prompts):
        decision = scaler.decide(
            observe(
                index * 15.0, 2, 2, mean_input_tokens=prompt, mean_output_tokens=1000.0, tpot_mean_s=step_s
            ),
            Limits(),
        )
    return floors(decision)


def test_decode_pairs_the_answers_finishing_now_with_the_prompts_of_one_session_ago() -> None:
    # Answers of 1000 tokens at 0.03 s a token finish 30 s after their prompts: the 6000-token prompts
    # of the last window have no answers yet, the 500-token ones of 30 s ago have these.
    switched = _decode_floor_after([500.0] * 4 + [6000.0], 0.03)
    long_prompts = _decode_floor_after([6000.0] * 5, 0.03)
    short_prompts = _decode_floor_after([500.0] * 5, 0.03)
    assert switched[0] == long_prompts[0]  # prefill computes the window's prompts
    assert switched[1] == short_prompts[1] < long_prompts[1]
    # one session later the long prompts have their own answers
    assert _decode_floor_after([500.0] * 4 + [6000.0] * 3, 0.03)[1] == long_prompts[1]


@pytest.mark.parametrize(
    ("prompts", "step_s"),
    [([6000.0] * 4 + [500.0], 0.03), ([500.0] * 4 + [6000.0], None)],
    ids=["prompts that got shorter", "no step measured"],
)
def test_decode_keeps_the_windows_own_prompts_where_pairing_would_not_shorten_them(
    prompts: list[float], step_s: float | None
) -> None:
    assert _decode_floor_after(prompts, step_s) == _decode_floor_after(prompts[-1:], step_s)


def test_the_kept_prompts_stay_few_at_any_decision_interval() -> None:
    scaler = policy()
    for second in range(1200):  # a decision every second: the kept state stays small
        scaler.decide(observe(float(second), 2, 2, tpot_mean_s=0.03), Limits())
    kept = scaler.state()["demand"]["prompts"]
    assert 60 <= len(kept) <= 65 and kept[-1][0] - kept[0][0] <= 600.0


def test_mean_lengths_below_one_token_are_no_lengths() -> None:
    decision = policy().decide(observe(0, 2, 2, mean_input_tokens=1e-310), Limits())
    assert "MissingRequestLengths" in decision.reasons


def test_a_measured_ttft_above_the_models_raises_the_prefill_correction() -> None:
    scaler = policy(calibration_s=60)
    ready = model_plan(20.0)[0]
    for step in range(12):
        decision = scaler.decide(observe(step * 15.0, ready, 9, ttft_p90_s=0.59), Limits())
    assert decision.details["prefill_correction"] > 1.2
    assert floors(decision)[0] > ready
    unlearned = policy(calibration_s=60)
    for step in range(12):  # requests waiting on decode: the TTFT is decode's to explain, not prefill's
        other = unlearned.decide(
            observe(step * 15.0, ready, 9, ttft_p90_s=0.59, decode_waiting=3.0), Limits()
        )
    assert other.details["prefill_correction"] == 1.0


def test_a_window_that_began_with_work_already_late_teaches_the_correction_nothing() -> None:
    ready = model_plan(20.0)[0]
    draining = policy(calibration_s=60)  # a backlog at every scrape: its TTFTs measure the wait
    for step in range(12):
        late = draining.decide(
            observe(step * 15.0, ready, 9, ttft_p90_s=0.59, prefill_queue=4.0 * ready), Limits()
        )
    assert late.details["prefill_correction"] == 1.0
    bursty = policy(calibration_s=60)  # a queue that builds within a window and is gone by the next
    for step in range(12):
        queue = 4.0 * ready if step % 2 else 0.0
        burst = bursty.decide(observe(step * 15.0, ready, 9, ttft_p90_s=0.59, prefill_queue=queue), Limits())
    assert burst.details["prefill_correction"] > 1.1


def test_a_window_whose_load_stepped_teaches_the_correction_nothing() -> None:
    """A return from a lull or a crowd queues requests within the window that its mean rate does not
    explain; the same TTFT at a steady rate does teach."""
    ready = model_plan(20.0)[0]
    stepping = policy(calibration_s=60)
    for step in range(12):
        rate = 20.0 if step % 2 else 8.0  # 2.5x from one window to the next, and back
        stepped = stepping.decide(
            observe(step * 15.0, ready, 9, ttft_p90_s=0.59, arrival_rate=rate), Limits()
        )
    assert stepped.details["prefill_correction"] == 1.0
    steady = policy(calibration_s=60)
    for step in range(12):
        rate = 20.0 if step % 2 else 16.0  # within 1.5x: noise, not a step
        kept = steady.decide(observe(step * 15.0, ready, 9, ttft_p90_s=0.59, arrival_rate=rate), Limits())
    assert kept.details["prefill_correction"] > 1.1


def test_decode_full_at_fewer_sessions_than_the_model_holds_lowers_its_kv_room() -> None:
    scaler = policy(calibration_s=60)
    first = scaler.decide(observe(0, X, Y, decode_running=Y * 10.0, decode_kv_usage=0.2), Limits())
    model_cap = first.details["decode_kv_capacity_cap"]
    assert "decode_kv_correction_target" not in first.details  # a fifth full: too empty to say
    for step in range(1, 12):  # full at half the model's cap per instance
        decision = scaler.decide(
            observe(step * 15.0, X, Y, decode_running=Y * model_cap / 2, decode_kv_usage=1.0), Limits()
        )
    assert decision.details["decode_kv_correction_target"] == pytest.approx(0.5, abs=0.01)
    assert decision.details["decode_kv_correction"] < 0.6
    assert decision.details["decode_kv_capacity_cap"] < 0.6 * model_cap
    assert floors(decision)[1] > floors(first)[1]


def test_a_pool_above_its_floor_releases_instances_to_a_pool_that_grows_now() -> None:
    x, y = model_plan(20.0)
    scaler = policy()
    scaler.decide(observe(0, x - 2, y + 2, arrival_rate=40.0), Limits())  # the window holds decode up
    decision = scaler.decide(observe(15, x - 2, y + 2), Limits())
    assert decision.prefill == x and decision.decode is not None and decision.decode < y + 2
    assert "DecodeReleasedForConversion" in decision.reasons  # now, not after decode's down window


def test_a_pool_in_flight_may_grow_but_not_shrink() -> None:
    x, y = model_plan(20.0)
    decision = policy().decide(observe(0, PoolState(ready=x + 5, starting=1), y), Limits())
    assert decision.prefill == x + 6
    assert "PrefillHeldInFlight" in decision.reasons
    grow = policy().decide(observe(0, PoolState(ready=1, starting=1), y), Limits())
    assert grow.prefill == min(x, 2 + 4)


# ---- every reason, from the smallest situation that gives it ----------------------------------------

X, Y = model_plan(20.0)
REASONS: list[tuple[str, dict[str, Any], Limits, str]] = [
    ("no rate", {"arrival_rate": None}, Limits(), "MissingArrivalRate"),
    ("no lengths yet", {"mean_input_tokens": None}, Limits(), "MissingRequestLengths"),
    ("zero traffic", {"arrival_rate": 0.0}, Limits(), "ZeroTraffic"),
    ("short prefill", {}, Limits(), "PrefillBelowModelFloor"),
    ("spare decode", {"decode": Y + 9, "prefill": X}, Limits(), "DecodeAboveNeed"),
    ("at the floor", {"decode": Y, "prefill": X}, Limits(), "DecodeWithinTolerance"),
    ("tpot missed", {"decode": Y, "prefill": X, "tpot_p90_s": 0.2}, Limits(), "DecodeTpotMissed"),
    ("sessions measured", {"decode_running": 500.0}, Limits(), "DecodeSessionsMeasured"),
    ("slow steps", {"tpot_mean_s": 0.09}, Limits(), "DecodeSessionsFromMeasuredTpot"),
    ("queue", {"prefill_queue": 10.0}, Limits(), "PrefillBacklog"),
    (
        "a new policy holds",
        {"prefill": X + 5, "decode": Y},
        Limits(),
        "PrefillScaleDownHeldWhileInputsSettle",
    ),
    (
        "budget",
        {"prefill": X, "decode": Y},
        Limits(gpu_budget=4, prefill_max=3, decode_max=3),
        "LimitedByGpuBudget",
    ),
    ("max", {"prefill": X, "decode": Y}, Limits(prefill_max=1), "PrefillLimitedByMax"),
    ("min", {"prefill": X, "decode": 1, "arrival_rate": 0.0}, Limits(decode_min=2), "DecodeRaisedToMin"),
    ("rate limit", {"prefill": 1, "decode": Y}, Limits(), "PrefillScaleUpRateLimited"),
    ("slo beyond reach", {"mean_input_tokens": 200_000.0}, Limits(prefill_max=64), "TtftSloBelowModelFloor"),
]


@pytest.mark.parametrize(("situation", "changes", "limits", "reason"), REASONS, ids=[r[0] for r in REASONS])
def test_every_reason_is_given_where_it_applies(
    situation: str, changes: dict[str, Any], limits: Limits, reason: str
) -> None:
    prefill, decode = changes.pop("prefill", 1), changes.pop("decode", 1)
    decision = policy().decide(observe(0, prefill, decode, **changes), limits)
    assert reason in decision.reasons, (situation, decision.reasons)


def test_a_fast_fall_below_the_usual_load_holds_the_fleet_it_had() -> None:
    def lull(**knobs: float) -> list[Decision]:
        xpyd = policy(**knobs)
        for step in range(40):
            xpyd.decide(observe(15 * step, X, Y), Limits())
        return [xpyd.decide(observe(15 * step, X, Y, arrival_rate=0.2), Limits()) for step in range(40, 70)]

    held, followed = lull(), lull(return_hold_s=0)
    assert [counts(d) for d in held] == [(X, Y)] * 30
    assert {"PrefillHeldForReturningLoad", "DecodeHeldForReturningLoad"} <= set(held[-1].reasons)
    assert held[-1].details["prefill_held_for_return"] == X
    assert held[-1].details["usual_arrival_rate"] > 10.0
    assert counts(followed[-1]) < (X, Y)  # past the down window, the fleet follows the lull


def test_a_decode_side_that_cannot_be_built_is_said_and_never_shrunk_for_it() -> None:
    huge = dataclasses.replace(CONTEXT.model, params=400e9)  # 800 GB of weights on one 80 GB GPU
    made = make_policy("xpyd", dataclasses.replace(CONTEXT, model=huge))
    decision = made.decide(observe(0, 4, 4), Limits())
    assert "DecodeInfeasible" in decision.reasons
    assert decision.decode == 4


def test_a_window_of_partial_data_scales_up_but_never_down() -> None:
    scaler = policy()
    scaler.decide(observe(0, X, Y), Limits())
    partial = scaler.decide(observe(15, X + 9, 1, mean_input_tokens=None), Limits())
    assert partial.prefill == X + 9 and partial.decode is not None and partial.decode > 1
    assert "PrefillPartialDataNoScaleDown" in partial.reasons


def test_the_stabilisation_window_and_a_restart_without_state() -> None:
    scaler = policy(down_window_s=300)
    first = scaler.decide(observe(0, X + 9, Y), Limits())
    assert first.prefill == X + 9  # as the HPA, the replicas it finds are its first recommendation
    assert "PrefillScaleDownHeldWhileInputsSettle" in first.reasons
    keep = int(first.details["prefill_down_target"])
    assert scaler.decide(observe(300, X + 9, Y), Limits()).prefill == keep  # a window later
    held = scaler.decide(observe(315, keep, Y, arrival_rate=12.0), Limits())
    assert held.prefill == keep and "PrefillScaleDownStabilized" in held.reasons
    restarted = policy(down_window_s=300)
    assert restarted.resume(None, 30.0) == ""
    after = restarted.decide(observe(330, X + 9, Y, arrival_rate=5.0), Limits())
    assert after.prefill == X + 9 and "PrefillScaleDownHeldAfterRestart" in after.reasons


# ---- pure steps --------------------------------------------------------------------------------------


def test_recommend_table() -> None:
    need = Need(floor=(4, 4), keep=(5, 6), binding="")
    cases = [
        ((2, 4), (False, False), {}, [4, 4], ["PrefillBelowModelFloor", "DecodeWithinTolerance"]),
        ((7, 9), (False, False), {}, [5, 6], ["PrefillAboveNeed", "DecodeAboveNeed"]),
        ((7, 9), (True, False), {}, [7, 6], ["PrefillHeldInFlight", "DecodeAboveNeed"]),
        (
            (4, 4),
            (False, False),
            {1: "DecodeTpotMissed"},
            [4, 5],
            ["PrefillWithinTolerance", "DecodeTpotMissed"],
        ),
        (
            (4, 4),
            (False, True),
            {1: "DecodeTpotMissed"},
            [4, 4],
            ["PrefillWithinTolerance", "DecodeWithinTolerance"],
        ),
    ]
    for supply, in_flight, missed, expected, reasons in cases:
        assert recommend(Pools(supply, in_flight), need, partial=False, missed=missed) == (expected, reasons)


def test_release_for_conversion_gives_only_the_surplus_above_keep_and_meets_trimmed_growth() -> None:
    need = Need(floor=(2, 3), keep=(3, 4), binding="")
    decided = [6, 7]
    reason = release_for_conversion(
        Pools((4, 7), (False, False)), need, decided, limits=Limits(), denied=(0, 0), cold_start_faster=False
    )
    assert (decided, reason) == ([6, 5], "DecodeReleasedForConversion")  # growth 2, surplus 7 - 4 = 3
    decided = [4, 7]
    reason = release_for_conversion(
        Pools((4, 7), (False, False)), need, decided, limits=Limits(), denied=(2, 0), cold_start_faster=True
    )
    assert (decided, reason) == ([6, 5], "DecodeReleasedForConversion")  # the budget-trimmed growth pairs
    decided = [6, 7]
    reason = release_for_conversion(
        Pools((4, 7), (False, False)), need, decided, limits=Limits(), denied=(0, 0), cold_start_faster=True
    )
    assert (decided, reason) == ([6, 7], "")  # cold starts are faster and the budget has room


def test_release_for_conversion_keeps_what_the_giver_was_asked_to_hold_over_a_conversion() -> None:
    need = Need(floor=(2, 3), keep=(3, 4), binding="")
    for recent, expected in (((0, 6), ([6, 6], "DecodeReleasedForConversion")), ((0, 7), ([6, 7], ""))):
        decided = [6, 7]
        reason = release_for_conversion(
            Pools((4, 7), (False, False)),
            need,
            decided,
            limits=Limits(),
            denied=(0, 0),
            cold_start_faster=False,
            recent=recent,
        )
        assert (decided, reason) == expected  # decode was asked for 6 (7) lately: it gives 1 (none)


def test_a_pool_gives_no_instance_it_needed_within_the_last_conversion_time() -> None:
    x, y = model_plan(20.0)
    scaler = policy()
    scaler.decide(observe(0, x - 2, y + 2, arrival_rate=40.0), Limits())  # decode needed y + 2 then
    scaler._demand.lead_times.seconds["conversion"] = 30.0  # as if a conversion had been timed
    held = scaler.decide(observe(15, x - 2, y + 2), Limits())
    assert "DecodeReleasedForConversion" not in held.reasons  # 15 s ago is within a conversion
    later = scaler.decide(observe(60, x - 2, y + 2), Limits())
    assert "DecodeReleasedForConversion" in later.reasons


def test_under_a_binding_budget_a_pool_gives_what_it_no_longer_needs_once_a_conversion_would_land() -> None:
    x, y = model_plan(20.0)
    budget = Limits(gpu_budget=x + y)  # one GPU per instance: prefill grows only by what decode gives
    scaler = policy(down_window_s=120)
    scaler.decide(observe(0, x - 1, y + 1, mean_output_tokens=450.0), budget)  # longer answers
    assert floors(policy().decide(observe(0, x, y, mean_output_tokens=450.0), Limits()))[1] == y + 1
    scaler._demand.lead_times.seconds["conversion"] = 30.0  # as if a conversion had been timed
    held = scaler.decide(observe(15, x - 1, y + 1), budget)  # decode needs y again, prefill x
    assert held.binding == "gpu_budget" and counts(held) == (x - 1, y + 1)  # 15 s ago: within one
    later = scaler.decide(observe(60, x - 1, y + 1), budget)  # well within the down window
    assert counts(later) == (x, y) and "DecodeReleasedForConversion" in later.reasons


def test_only_a_tpot_miss_asks_one_more_instance() -> None:
    base = observe(0, 4, 4, ttft_p90_s=1.0, tpot_p90_s=0.2)
    assert missed_slos(base, 0.1) == {1: "DecodeTpotMissed"}  # the TTFT miss is the corrections'
    assert missed_slos(dataclasses.replace(base, tpot_p90_s=0.05), 0.1) == {}


# ---- knobs ------------------------------------------------------------------------------------------


def test_at_most_ten_public_knobs() -> None:
    assert len(dataclasses.fields(XpydConfig)) <= 10


BAD_KNOBS = [
    ("ttft_quantile", 1.0),
    ("ttft_quantile", 0.4),
    ("tolerance", -0.1),
    ("tolerance", 1.0),
    ("up_window_s", -1.0),
    ("down_window_s", math.inf),
    ("down_period_s", 0.5),
    ("lead_time_s", 0.0),
    ("backlog_drain_s", math.nan),
    ("calibration_s", 0.0),
    ("in_flight_timeout_s", 1e9),
    ("return_hold_s", -1.0),
    ("swing_headroom", 1.0),
]


@pytest.mark.parametrize(("knob", "value"), BAD_KNOBS)
def test_a_bad_knob_is_rejected_naming_it(knob: str, value: float) -> None:
    with pytest.raises(PolicyConfigError, match=f"policy 'xpyd': {knob} = "):
        policy(**{knob: value})


# ---- kept state -------------------------------------------------------------------------------------

observations = st.lists(
    st.tuples(
        st.floats(0.0, 60.0),  # arrival rate
        st.floats(500.0, 9000.0),  # mean prompt
        st.floats(20.0, 2000.0),  # mean answer
        st.integers(0, 12),  # prefill ready
        st.integers(0, 12),  # decode ready
        st.integers(0, 2),  # starting
        st.one_of(st.none(), st.floats(0.0, 3.0)),  # ttft p90
        st.one_of(st.none(), st.floats(0.0, 400.0)),  # prefill queue
        st.one_of(st.none(), st.floats(0.005, 0.2)),  # decode's mean step
    ),
    min_size=2,
    max_size=25,
)


def _observation(step: int, row: tuple[Any, ...]) -> Observation:
    rate, isl, osl, ready_p, ready_d, starting, ttft, queue, step_s = row
    return observe(
        step * 15.0,
        PoolState(ready=ready_p, starting=starting),
        PoolState(ready=ready_d),
        arrival_rate=rate,
        mean_input_tokens=isl,
        mean_output_tokens=osl,
        p90_input_tokens=isl * 1.5,
        ttft_p90_s=ttft,
        prefill_queue=queue,
        decode_running=ready_d * 8.0,
        tpot_mean_s=step_s,
    )


@settings(max_examples=40, deadline=None)
@given(observations, st.data())
def test_a_policy_resumed_from_its_kept_state_decides_exactly_as_the_uninterrupted_one(
    rows: list[tuple[Any, ...]], data: st.DataObject
) -> None:
    split = data.draw(st.integers(1, len(rows) - 1))
    limits = Limits(gpu_budget=data.draw(st.one_of(st.none(), st.integers(2, 30))))
    uninterrupted = policy(down_window_s=120, calibration_s=60)
    expected = [uninterrupted.decide(_observation(i, row), limits) for i, row in enumerate(rows)]
    first = policy(down_window_s=120, calibration_s=60)
    got = [first.decide(_observation(i, row), limits) for i, row in enumerate(rows[:split])]
    kept = json.loads(json.dumps(first.state()))  # through JSON, as through the API server
    second = policy(down_window_s=120, calibration_s=60)
    assert second.resume(kept, now_s=split * 15.0) == ""
    got += [second.decide(_observation(i, row), limits) for i, row in enumerate(rows) if i >= split]
    assert got == expected


HOSTILE: list[tuple[str, Any]] = [
    ("not an object", [1, 2]),
    ("another policy", {"policy": "threshold", "version": 1}),
    ("another version", {"policy": "xpyd", "version": 99}),
    ("from the future", {"timeS": 1e12}),
    ("NaN factor", {"correction": {"factor": math.nan, "timeS": 0.0, "steady": None}}),
    ("string count", {"layers": {"timeS": 0.0, "prefill": {"window": {"history": [[0.0, "9"]]}}}}),
    ("boolean flag as number", {"inFlight": {"Prefill": {"since": True}, "Decode": {"since": None}}}),
    ("negative level", {"demand": {"forecast": {"level": -5.0}}}),
    ("oversized window", {"layers": {"prefill": {"window": {"history": [[0.0, 1]] * 5000}}}}),
    ("missing part", {"demand": None}),
    ("a window entry later than the state", {"layers": {"prefill": {"window": {"history": [[1e15, 9]]}}}}),
    ("a rate limit entry later than the state", {"layers": {"decode": {"rate": {"history": [[1e15, 0]]}}}}),
    ("a forecast slope beyond reason", {"demand": {"forecast": {"slope": 1e300}}}),
    ("a KV correction out of range", {"kvCorrection": {"factor": 9.0}}),
    ("a kept rate later than the state", {"correction": {"rates": [[1e15, 3.0]]}}),
    ("a kept rate of zero", {"correction": {"rates": [[0.0, 0.0]]}}),
    ("too many kept rates", {"correction": {"rates": [[0.0, 1.0]] * 65}}),
    ("a held size that is no count", {"returnHold": {"held": [2.5, 1]}}),
    ("a kept prompt with a hit rate of 2", {"demand": {"prompts": [[0.0, 500.0, 100.0, 0.0, 0.0, 2.0]]}}),
    ("a kept prompt later than the state", {"demand": {"prompts": [[1e15, 500.0, 100.0, 0.0, 0.0, 0.0]]}}),
    ("a kept prompt of no tokens", {"demand": {"prompts": [[0.0, 0.0, 100.0, 0.0, 0.0, 0.0]]}}),
    ("too many kept prompts", {"demand": {"prompts": [[0.0, 500.0, 100.0, 0.0, 0.0, 0.0]] * 66}}),
    ("a usual load below zero", {"returnHold": {"usual": -1.0}}),
]


def _merged(base: dict[str, Any], change: Any) -> Any:
    if not isinstance(change, dict) or not isinstance(base, dict):
        return change
    merged = dict(base)
    for key, value in change.items():
        merged[key] = _merged(base.get(key, {}), value) if isinstance(value, dict) else value
    return merged


@pytest.mark.parametrize(("case", "change"), HOSTILE, ids=[h[0] for h in HOSTILE])
def test_a_corrupt_kept_state_is_ignored_with_a_reason_and_treated_as_lost(case: str, change: Any) -> None:
    healthy = policy()
    healthy.decide(observe(0, X, Y), Limits())
    state = _merged(json.loads(json.dumps(healthy.state())), change)
    resumed, lost = policy(), policy()
    reason = resumed.resume(state, now_s=15.0)
    assert reason and " = " in reason and ": " in reason, (case, reason)
    lost.resume(None, 15.0)
    later = observe(15, X + 6, Y + 6, arrival_rate=4.0)
    assert resumed.decide(later, Limits()) == lost.decide(later, Limits())
