"""The xpyd policy layer by layer, including the field lessons, against the real capacity model."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.unit.policy_context import CONTEXT

from xpyd_controller.model.sizing import PoolConfig, Slo, Workload, size_pools
from xpyd_controller.policy.context import PolicyConfigError
from xpyd_controller.policy.registry import make_policy
from xpyd_controller.policy.types import Decision, Limits, Observation, PoolState, Recommended
from xpyd_controller.policy.xpyd import XpydConfig, XpydPolicy

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


def floor(rate: float) -> tuple[int, int]:
    """The floor a fresh policy derives for this demand."""
    details = policy().decide(observe(0, 1, 1, arrival_rate=rate), Limits()).details
    return int(details["prefill_floor"]), int(details["decode_floor"])


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


def running(prefill: int, decode: int, **knobs: float) -> XpydPolicy:
    """A policy whose stabilisation window holds these sizes (recommended at -1 s, before its first call)."""
    made = policy(**knobs)
    made.resume([Recommended(-1.0, prefill, decode)])
    return made


def counts(decision: Decision) -> tuple[int | None, int | None]:
    return decision.prefill, decision.decode


def test_floor_comes_from_the_capacity_model() -> None:
    x, y = floor(20.0)
    assert x >= 2 and y >= 2  # the scenario must be big enough for the tables below to mean something
    decision = policy().decide(observe(0, 1, 1), Limits())
    assert counts(decision) == (min(x, 5), min(y, 5))  # 1 → at most 1 + max(4, 100 %) per period
    details = decision.details
    assert details["predicted_ttft_seconds"] <= 0.6
    assert details["predicted_tpot_seconds"] <= 0.1
    assert decision.binding == "prefill_ttft_quantile+decode_kv_capacity"
    assert "PrefillBelowModelFloor" in decision.reasons
    assert decision.allow_conversion is True
    # The floor is the model's own plan at the TPOT SLO.
    assert (x, y) == model_plan(20.0)


@pytest.mark.parametrize(
    ("name", "make_observation", "expected_reason"),
    [
        ("missing rate holds", lambda: observe(0, 9, 9, arrival_rate=None), "MissingArrivalRate"),
        ("NaN rate holds", lambda: observe(0, 9, 9, arrival_rate=float("nan")), "MissingArrivalRate"),
        ("lengths never seen", lambda: observe(0, 9, 9, mean_input_tokens=None), "MissingRequestLengths"),
    ],
)
def test_missing_data_holds_everything(name: str, make_observation: Any, expected_reason: str) -> None:
    decision = policy(down_window_s=0).decide(make_observation(), Limits())
    assert counts(decision) == (None, None), name
    assert decision.reasons[0] == expected_reason
    assert decision.binding == "missing_data"


def test_partial_data_scales_up_on_last_lengths_but_never_down() -> None:
    scaler = policy(down_window_s=0)
    x, y = floor(20.0)
    first = scaler.decide(observe(0, x, y), Limits())
    assert counts(first) == (x, y)
    up = scaler.decide(observe(60, x, y, arrival_rate=40.0, mean_input_tokens=None), Limits())
    assert counts(up) == floor(40.0)
    assert "PrefillBelowModelFloor" in up.reasons
    bx, by = floor(40.0)
    down = scaler.decide(observe(120, bx, by, arrival_rate=1.0, mean_output_tokens=None), Limits())
    assert counts(down) == (bx, by)
    assert "PrefillPartialDataNoScaleDown" in down.reasons


def test_zero_traffic_is_zero_demand_not_missing_data() -> None:
    scaler = policy(down_window_s=0, down_instances=100)
    scaler.decide(observe(0, 4, 4), Limits())
    idle = scaler.decide(
        observe(60, 4, 4, arrival_rate=0.0, mean_input_tokens=None, mean_output_tokens=None), Limits()
    )
    assert counts(idle) == (1, 1)
    assert "ZeroTraffic" in idle.reasons
    assert "PrefillRaisedToMin" in idle.reasons


def test_zero_traffic_from_a_cold_start_needs_no_lengths() -> None:
    idle = policy().decide(observe(0, 1, 1, arrival_rate=0.0, mean_input_tokens=None), Limits(prefill_min=0))
    assert counts(idle) == (1, 1)  # no demand, but no lengths to trust either: keeps what it found


def test_scale_down_is_slow_stabilised_and_rate_limited() -> None:
    x, y = floor(5.0)
    assert x < 8
    scaler = running(8, y)
    decisions = [counts(scaler.decide(observe(t, 8, y, arrival_rate=5.0), Limits())) for t in (0, 150, 299)]
    assert decisions == [(8, y)] * 3
    later = scaler.decide(observe(300, 8, y, arrival_rate=5.0), Limits())
    assert counts(later) == (7, y)  # 1 instance (or 10 %) per minute
    assert "PrefillScaleDownRateLimited" in later.reasons


def test_tolerance_band_keeps_n_when_n_minus_1_is_too_tight() -> None:
    """Scale in only if the smaller pool still meets the SLO at demand × (1 + tolerance)."""
    rates = np.linspace(1.0, 60.0, 600)
    edge = next(r for r in rates if floor(r)[0] < floor(r * 1.1)[0])  # N−1 fits, but without margin
    x_tight, x_margin = floor(edge)[0], floor(edge * 1.1)[0]
    scaler = policy(down_window_s=0)
    hold = scaler.decide(observe(0, x_margin, 9, arrival_rate=float(edge)), Limits())
    assert hold.prefill == x_margin > x_tight
    assert "PrefillWithinTolerance" in hold.reasons


def test_in_flight_pool_holds_and_counts_pending_as_supply() -> None:
    scaler = policy(down_window_s=0)
    x, y = floor(20.0)
    starting = PoolState(ready=x - 2, starting=2)
    decision = scaler.decide(observe(0, starting, y, arrival_rate=10.0), Limits())
    assert decision.prefill == x  # held at ready + starting although demand halved
    assert "PrefillInFlight" in decision.reasons and "PrefillHeldInFlight" in decision.reasons
    assert decision.decode == floor(10.0)[1]  # the other pool is free to move


def test_a_held_pool_grows_to_its_floor_counting_what_is_on_its_way() -> None:
    """Starting instances and the count last asked for are supply: growth beyond them is not held."""
    scaler = policy()
    x, y = floor(20.0)
    wanted = floor(40.0)[0]
    starting = PoolState(ready=x - 2, starting=2)
    grows = scaler.decide(observe(0, starting, y, arrival_rate=40.0), Limits())
    assert grows.prefill == wanted > x
    assert "PrefillGrowsWhileInFlight" in grows.reasons and "PrefillHeldInFlight" not in grows.reasons
    # the driver does not show the new instances yet: what was asked for still counts, nothing more
    again = scaler.decide(observe(5, starting, y, arrival_rate=40.0), Limits())
    assert "PrefillGrowsWhileInFlight" not in again.reasons


def test_a_stuck_pending_instance_stops_counting_after_the_timeout() -> None:
    scaler = policy(in_flight_timeout_s=300)
    x, y = floor(20.0)
    stuck = PoolState(ready=x - 1, starting=1)
    assert scaler.decide(observe(0, stuck, y), Limits()).prefill == x
    late = scaler.decide(observe(301, stuck, y), Limits())
    assert "PrefillInFlightTimedOut" in late.reasons
    assert late.prefill == x  # supply is x − 1 now, below the floor: asks for x again


@pytest.mark.parametrize("budget", [4, 7, 10])
def test_never_exceeds_the_gpu_budget(budget: int) -> None:
    decision = policy().decide(observe(0, 1, 1, arrival_rate=60.0), Limits(gpu_budget=budget))
    assert decision.prefill is not None and decision.decode is not None
    assert decision.prefill + decision.decode <= budget


def test_gpus_per_instance_count_against_the_budget() -> None:
    wide = dataclasses.replace(CONTEXT, prefill_gpus_per_instance=2, decode_gpus_per_instance=4)
    scaler = make_policy("xpyd", wide)
    decision = scaler.decide(observe(0, 1, 1, arrival_rate=60.0), Limits(gpu_budget=14))
    assert decision.prefill is not None and decision.decode is not None
    assert decision.prefill * 2 + decision.decode * 4 <= 14


def test_prefix_hits_shrink_the_prefill_floor() -> None:
    cold = policy().decide(observe(0, 1, 1, arrival_rate=40.0), Limits())
    warm = policy().decide(observe(0, 1, 1, arrival_rate=40.0, prefix_hit_rate=0.8), Limits())
    assert warm.details["prefill_floor"] < cold.details["prefill_floor"]
    assert warm.details["decode_floor"] == cold.details["decode_floor"]


def test_infeasible_ttft_is_reported_and_still_sized() -> None:
    decision = policy().decide(observe(0, 1, 1, mean_input_tokens=200_000.0), Limits())
    assert "TtftSloBelowModelFloor" in decision.reasons
    assert decision.prefill is not None and decision.prefill > 1


@pytest.mark.parametrize(
    ("knobs", "message"),
    [
        ({"ttft_quantile": 0.3}, r"ttft_quantile = 0\.3: must be 0 \(mean sizing\) or in \[0\.5, 1\)"),
        ({"tolerance": -0.1}, r"tolerance = -0\.1: must be in \[0, 0\.99\]"),
        ({"in_flight_timeout_s": 0}, r"in_flight_timeout_s = 0\.0: must be a finite number > 0"),
        ({"down_window_s": -5}, r"down_window_s = -5\.0: must be a finite number >= 0"),
        ({"speed": 1}, "speed = 1: unknown knob"),
        ({"decode_kv_full": 0.3}, r"decode_kv_full = 0\.3: must be 0 \(off\) or in \[0\.5, 1\]"),
        ({"decode_kv_full": 1.5}, r"decode_kv_full = 1\.5: must be 0 \(off\) or in \[0\.5, 1\]"),
    ],
)
def test_bad_knobs_are_rejected(knobs: dict[str, float], message: str) -> None:
    with pytest.raises(PolicyConfigError, match=message):
        policy(**knobs)


def test_defaults_are_documented_values() -> None:
    config = XpydConfig()
    assert (config.ttft_quantile, config.tolerance, config.up_window_s, config.down_window_s) == (
        0.99,
        0.1,
        0,
        300,
    )


@settings(max_examples=60, deadline=None)
@given(
    steps=st.lists(
        st.tuples(
            st.one_of(st.none(), st.just(0.0), st.floats(0.01, 80.0)),
            st.one_of(st.none(), st.floats(50.0, 20_000.0)),
            st.integers(0, 12),
            st.integers(0, 3),
            st.integers(0, 12),
            st.integers(0, 3),
        ),
        min_size=1,
        max_size=12,
    ),
    budget=st.one_of(st.none(), st.integers(2, 30)),
    maximum=st.integers(1, 20),
)
def test_decisions_always_within_limits_and_budget(
    steps: list[tuple[float | None, float | None, int, int, int, int]], budget: int | None, maximum: int
) -> None:
    scaler = policy()
    limits = Limits(prefill_max=maximum, decode_max=maximum, gpu_budget=budget)
    for index, (rate, isl, ready_p, starting_p, ready_d, starting_d) in enumerate(steps):
        observation = observe(
            30.0 * index,
            PoolState(ready=ready_p, starting=starting_p),
            PoolState(ready=ready_d, starting=starting_d),
            arrival_rate=rate,
            mean_input_tokens=isl,
        )
        decision = scaler.decide(observation, limits)
        if rate is None:
            assert counts(decision) == (None, None)
            continue
        if decision.prefill is None or decision.decode is None:
            assert "MissingRequestLengths" in decision.reasons
            continue
        assert 1 <= decision.prefill <= maximum and 1 <= decision.decode <= maximum
        if budget is not None:
            assert decision.prefill + decision.decode <= budget
        assert decision.binding and all(reason[0].isupper() for reason in decision.reasons)


@pytest.mark.parametrize(
    ("smoothing_s", "expected_isl"), [(0.0, 5000.0), (300.0, 1000.0 + 4000.0 * (1 - np.exp(-0.05)))]
)
def test_lengths_are_smoothed_but_the_rate_is_not(smoothing_s: float, expected_isl: float) -> None:
    scaler = policy(length_smoothing_s=smoothing_s)
    scaler.decide(observe(0, 1, 1, mean_input_tokens=1000.0), Limits())
    decision = scaler.decide(observe(15, 1, 1, arrival_rate=33.0, mean_input_tokens=5000.0), Limits())
    assert decision.details["mean_input_tokens"] == pytest.approx(expected_isl)
    assert decision.details["arrival_rate"] == 33.0


def test_a_single_long_prompt_window_moves_prefill_but_not_the_smoothed_lengths() -> None:
    """Its prompts arrived (prefill's work now); the smoothed lengths decode is sized on barely move."""
    x, y = floor(20.0)
    smoothed, raw, window_off = policy(), policy(length_smoothing_s=0), policy(prefill_window_lengths=0)
    for scaler in (smoothed, raw, window_off):
        for t in range(0, 300, 15):
            scaler.decide(observe(t, x, y), Limits())
    spike = observe(300, x, y, mean_input_tokens=ISL * 1.5)
    assert window_off.decide(spike, Limits()).prefill == x
    followed = smoothed.decide(spike, Limits())
    jumped = raw.decide(spike, Limits())
    assert jumped.prefill is not None and followed.prefill is not None and jumped.prefill > x
    # the window rose by half in one interval of a window twice as long: its newest half had twice the rise
    assert followed.details["prefill_input_tokens"] == pytest.approx(ISL * 2)
    assert "PrefillOnNewestPrompts" in followed.reasons and followed.prefill > jumped.prefill
    assert followed.details["mean_input_tokens"] < ISL * 1.1 < jumped.details["mean_input_tokens"]


def test_a_surplus_pool_releases_instances_for_conversion_at_once() -> None:
    x, y = floor(20.0)
    decision = running(x - 2, y + 3).decide(observe(0, x - 2, y + 3), Limits())
    assert decision.prefill == x
    assert decision.decode == y + 1  # two of the three surplus decode instances convert now
    assert "DecodeAboveNeed" in decision.reasons and "DecodeReleasedForConversion" in decision.reasons


@pytest.mark.parametrize(
    ("later_s", "decode", "changes", "released"),
    [
        (15, 0, {"tpot_p90_s": 0.12}, False),  # a latency blip on decode: prefill keeps what it took
        (330, 0, {"tpot_p90_s": 0.12}, True),  # one down window after it settled it may give back
        (15, -1, {}, True),  # decode below its model floor: the mix really reversed
    ],
)
def test_a_pool_keeps_converted_instances_for_a_down_window_after_they_settle_unless_the_mix_reversed(
    later_s: float, decode: int, changes: dict[str, Any], released: bool
) -> None:
    x, y = floor(20.0)
    scaler = policy(tolerance=0.5)  # a band wide enough to keep prefill's x + 1 unless released
    assert "DecodeReleasedForConversion" in scaler.decide(observe(0, x - 2, y + 3), Limits()).reasons
    converting = observe(5, PoolState(ready=x - 2, starting=2), PoolState(ready=y + 1, draining=2))
    scaler.decide(converting, Limits())  # in flight: the hold starts once the conversion settled
    scaler.decide(observe(15, x + 1, y + 1), Limits())  # settled
    decision = scaler.decide(observe(later_s, x + 1, y + decode, **changes), Limits())
    assert decision.details["prefill_down_target"] >= x + 1
    assert ("PrefillReleasedForConversion" in decision.reasons) is released
    assert ("PrefillKeepsConvertedInstances" in decision.reasons) is not released
    assert decision.prefill == (x if released else x + 1)


def test_no_release_between_pools_of_different_width() -> None:
    wide = dataclasses.replace(CONTEXT, decode_gpus_per_instance=2)
    scaler = make_policy("xpyd", wide)
    assert isinstance(scaler, XpydPolicy)
    scaler.resume([Recommended(-1.0, 1, 20)])
    decision = scaler.decide(observe(0, 1, 20), Limits())
    assert decision.decode == 20  # the down window holds; nothing could be converted anyway
    assert not any("ReleasedForConversion" in reason for reason in decision.reasons)


def test_no_release_from_a_pool_within_tolerance() -> None:
    x, y = floor(20.0)
    decision = policy().decide(observe(0, x - 2, y), Limits())
    assert (decision.prefill, decision.decode) == (x, y)


def test_a_pool_inside_its_band_releases_down_to_its_floor_when_the_other_grows() -> None:
    x, y = floor(20.0)
    decision = policy(tolerance=0.5).decide(observe(0, x - 1, y + 1), Limits())
    assert decision.details["decode_down_target"] >= y + 1  # the band alone would keep y + 1
    assert "DecodeWithinTolerance" in decision.reasons and "DecodeReleasedForConversion" in decision.reasons
    assert counts(decision) == (x, y)


def test_under_a_spent_gpu_budget_the_growing_pool_gets_what_the_other_releases() -> None:
    x, y = floor(20.0)
    budget = Limits(gpu_budget=x + y + 1)  # spent: prefill one below its floor, decode two above
    decision = running(x - 1, y + 2).decide(observe(0, x - 1, y + 2), budget)
    assert counts(decision) == (x, y + 1)  # decode gives one instance; prefill takes it, by conversion
    assert "DecodeReleasedForConversion" in decision.reasons
    assert decision.binding == "gpu_budget"


def test_a_spent_gpu_budget_without_a_surplus_holds() -> None:
    x, y = floor(20.0)
    decision = policy().decide(observe(0, x - 1, y), Limits(gpu_budget=x + y - 1))
    assert counts(decision) == (x - 1, y)
    assert not any("ReleasedForConversion" in reason for reason in decision.reasons)


@pytest.mark.parametrize(
    ("prefill_offset", "changes"),
    [
        (0, {}),  # prefill at its floor: nothing grows, the band keeps decode
        (-1, {"mean_input_tokens": None, "mean_output_tokens": None}),  # partial data: never down
    ],
)
def test_no_release_inside_the_band_without_growth_or_with_partial_data(
    prefill_offset: int, changes: dict[str, Any]
) -> None:
    x, y = floor(20.0)
    scaler = policy(tolerance=0.5)
    scaler.decide(observe(0, x, y + 1), Limits())  # lengths seen once, so later gaps are partial data
    decision = scaler.decide(observe(15, x + prefill_offset, y + 1, **changes), Limits())
    assert decision.decode == y + 1
    assert not any("ReleasedForConversion" in reason for reason in decision.reasons)


@pytest.mark.parametrize(
    ("knobs", "measured", "expected", "reason"),
    [
        ({}, {"ttft_p90_s": 0.9}, (1, 0), "PrefillSloMissedAboveFloor"),
        ({}, {"tpot_p90_s": 0.12}, (0, 1), "DecodeSloMissedAboveFloor"),
        ({}, {"ttft_p90_s": 0.5, "tpot_p90_s": 0.09}, (0, 0), None),  # within the SLOs
        ({"latency_feedback": 2.0}, {"ttft_p90_s": 0.9}, (0, 0), None),  # 0.9 < 2 × 0.6
        ({"latency_feedback": 0}, {"ttft_p90_s": 5.0, "tpot_p90_s": 1.0}, (0, 0), None),  # off
        ({}, {"ttft_p90_s": float("nan")}, (0, 0), None),
    ],
)
def test_measured_slo_misses_add_one_instance_above_the_floor(
    knobs: dict[str, float], measured: dict[str, float], expected: tuple[int, int], reason: str | None
) -> None:
    x, y = floor(20.0)
    decision = policy(**knobs).decide(observe(0, x, y, **measured), Limits())
    assert (decision.prefill, decision.decode) == (x + expected[0], y + expected[1])
    if reason:
        assert reason in decision.reasons
    assert not any("SloMissed" in r for r in decision.reasons) or reason


@pytest.mark.parametrize(
    ("knobs", "measured", "decode", "expected", "reason"),
    [
        # Decode KV full: requests wait for decode admission after prefill, so decode grows.
        (
            {},
            {"ttft_p90_s": 0.9, "decode_kv_usage": 0.97, "prefill_queue": 0.0},
            0,
            (0, 1),
            "DecodeKvFullTtftMissed",
        ),
        ({}, {"ttft_p90_s": 0.9, "decode_kv_usage": 0.95}, 0, (0, 1), "DecodeKvFullTtftMissed"),
        # Room in the decode KV cache: the wait is prefill's.
        (
            {},
            {"ttft_p90_s": 0.9, "decode_kv_usage": 0.94, "prefill_queue": 6.0},
            0,
            (1, 0),
            "PrefillSloMissedAboveFloor",
        ),
        ({}, {"ttft_p90_s": 0.9, "decode_kv_usage": None}, 0, (1, 0), "PrefillSloMissedAboveFloor"),
        ({}, {"ttft_p90_s": 0.9, "decode_kv_usage": float("nan")}, 0, (1, 0), "PrefillSloMissedAboveFloor"),
        # Off: every TTFT miss is prefill's, as before the attribution.
        (
            {"decode_kv_full": 0},
            {"ttft_p90_s": 0.9, "decode_kv_usage": 1.0},
            0,
            (1, 0),
            "PrefillSloMissedAboveFloor",
        ),
        (
            {"decode_kv_full": 0.8},
            {"ttft_p90_s": 0.9, "decode_kv_usage": 0.85},
            0,
            (0, 1),
            "DecodeKvFullTtftMissed",
        ),
        # Full KV but no TTFT miss: nothing to blame.
        ({}, {"ttft_p90_s": 0.5, "decode_kv_usage": 1.0}, 0, (0, 0), None),
        # TTFT and TPOT both missed with full KV: decode grows once, prefill not at all.
        (
            {},
            {"ttft_p90_s": 0.9, "tpot_p90_s": 0.12, "decode_kv_usage": 0.99},
            0,
            (0, 1),
            "DecodeSloMissedAboveFloor",
        ),
        # One decode instance starting and counted empty in the average: the ready ones are full, and
        # decode holds for it instead of blaming prefill.
        ({}, {"ttft_p90_s": 0.9, "decode_kv_usage": 0.75}, 1, (0, 0), None),
        ({}, {"ttft_p90_s": 0.9, "decode_kv_usage": 0.5}, 1, (1, 0), "PrefillSloMissedAboveFloor"),
    ],
)
def test_a_ttft_miss_is_blamed_on_decode_when_its_kv_cache_is_full(
    knobs: dict[str, float],
    measured: dict[str, Any],
    decode: int,
    expected: tuple[int, int],
    reason: str | None,
) -> None:
    x, y = floor(20.0)
    decode_pool = PoolState(ready=y - decode, starting=decode) if decode else PoolState(ready=y)
    decision = policy(**knobs).decide(observe(0, x, decode_pool, **measured), Limits())
    assert (decision.prefill, decision.decode) == (x + expected[0], y + expected[1])
    if reason:
        assert reason in decision.reasons
    assert not any("Missed" in r for r in decision.reasons) or reason


def test_a_ttft_miss_while_decode_is_below_its_floor_grows_decode_only() -> None:
    """Under a prefill-first router the TTFT includes decode admission: a decode pool short of its
    floor delays first tokens, and another prefill instance would not bring them sooner."""
    x, y = floor(20.0)
    decision = policy().decide(observe(0, x, y - 1, ttft_p90_s=0.9), Limits())
    assert (decision.prefill, decision.decode) == (x, y)
    assert (
        "PrefillSloMissedAboveFloor" not in decision.reasons and "DecodeBelowModelFloor" in decision.reasons
    )


@pytest.mark.parametrize(
    ("queues", "expected", "reason"),
    [
        ({"decode_waiting": 6.0, "prefill_queue": 0.0}, (0, 1), "DecodeWaitingTtftMissed"),
        ({"decode_waiting": 6.0, "prefill_queue": 40.0}, (1, 0), "PrefillSloMissedAboveFloor"),
        ({"decode_waiting": 0.0, "prefill_queue": 0.0}, (1, 0), "PrefillSloMissedAboveFloor"),
        ({"decode_waiting": 6.0}, (1, 0), "PrefillSloMissedAboveFloor"),  # no prefill queue measured
    ],
)
def test_a_ttft_miss_with_requests_waiting_on_decode_and_no_prefill_queue_is_decodes(
    queues: dict[str, float], expected: tuple[int, int], reason: str
) -> None:
    """A paged KV cache admits before its usage reads full, then makes requests wait: the waiting
    requests on decode, with prefill keeping up, say where the first tokens were delayed."""
    x, y = floor(20.0)
    decision = policy().decide(observe(0, x, y, ttft_p90_s=0.9, decode_kv_usage=0.6, **queues), Limits())
    assert (decision.prefill, decision.decode) == (x + expected[0], y + expected[1])
    assert reason in decision.reasons


def test_swing_headroom_only_takes_gpus_the_other_pool_does_not_hold() -> None:
    budget = Limits(prefill_max=8, decode_max=8, gpu_budget=10)
    scaler = policy()
    mixed_windows(scaler, 600)
    # decode holds 7 instances although this window needs fewer: the headroom does not take them
    decision = scaler.decide(observe(600, 2, 7, mean_input_tokens=600.0, mean_output_tokens=900.0), budget)
    assert decision.prefill is not None and decision.decode is not None
    assert decision.prefill <= 10 - 7
    assert decision.prefill + decision.decode <= 10


def test_slo_feedback_waits_for_in_flight_instances() -> None:
    x, y = floor(20.0)
    starting = PoolState(ready=x - 1, starting=1)
    decision = policy().decide(observe(0, starting, y, ttft_p90_s=2.0), Limits())
    assert decision.prefill == x
    assert "PrefillSloMissedAboveFloor" not in decision.reasons


def test_latency_feedback_below_one_is_rejected() -> None:
    with pytest.raises(PolicyConfigError, match=r"latency_feedback = 0\.5: must be a finite number >= 1"):
        policy(latency_feedback=0.5)


@pytest.mark.parametrize(
    "broken",
    [
        {"mean_input_tokens": float("inf")},
        {"mean_output_tokens": float("nan")},
        {"mean_input_tokens": 0.0},
        {"p90_input_tokens": float("nan"), "p90_output_tokens": float("inf")},
    ],
)
def test_non_finite_lengths_are_missing_data_not_errors(broken: dict[str, float]) -> None:
    decision = policy(down_window_s=0).decide(observe(0, 9, 9, **broken), Limits())
    if "p90_input_tokens" in broken:
        assert decision.prefill is not None  # means are fine: only the spread is unknown
    else:
        assert counts(decision) == (None, None)
        assert "MissingRequestLengths" in decision.reasons


def prefill_first_policy() -> XpydPolicy:
    made = make_policy("xpyd", dataclasses.replace(CONTEXT, request_flow="prefill_first"))
    assert isinstance(made, XpydPolicy)
    return made


@pytest.mark.parametrize(
    ("measured", "reason", "grows"),
    [
        ({}, None, False),  # nothing measured: the prediction
        ({"tpot_mean_s": 1e-3, "decode_running": 1.0}, None, False),  # a fast, light pool never shrinks it
        ({"tpot_mean_s": 0.09}, "DecodeSessionsFromMeasuredTpot", True),  # steps slower than the roofline's
        ({"decode_running": 400.0}, "DecodeSessionsMeasured", True),  # more on decode than predicted
        ({"decode_running": 300.0, "decode_waiting": 100.0}, "DecodeSessionsMeasured", True),
        ({"decode_running": float("nan"), "tpot_mean_s": float("inf")}, None, False),  # corrupt: unused
    ],
)
def test_measured_decode_sessions_raise_the_decode_floor(
    measured: dict[str, float], reason: str | None, grows: bool
) -> None:
    """Prefill-first, the decode floor uses the pool's measured TPOT and requests on decode where they
    show the roofline's sessions too short (the e2e demo's fleet held 76 where the model counted 48)."""
    base = prefill_first_policy().decide(observe(0, 4, 4), Limits()).details
    decision = prefill_first_policy().decide(observe(0, 4, 4, **measured), Limits())
    details = decision.details
    session_reasons = {"DecodeSessionsFromMeasuredTpot", "DecodeSessionsMeasured"}
    assert [r for r in decision.reasons if r in session_reasons] == ([reason] if reason else [])
    if grows:
        assert details["decode_floor"] > base["decode_floor"]
        assert details["decode_session_seconds"] > base["decode_session_seconds"]
    else:
        assert details["decode_floor"] == base["decode_floor"]
        assert details["decode_session_seconds"] == base["decode_session_seconds"]
    assert details["prefill_floor"] == base["prefill_floor"]  # prefill is not decode's measurement
    if "decode_running" in measured and np.isfinite(measured["decode_running"]):
        on_decode = measured["decode_running"] + measured.get("decode_waiting", 0.0)
        assert details["measured_decode_sessions"] == on_decode
    if reason == "DecodeSessionsMeasured":
        # Little's law: the session time the plan reports is what is on decode over the arrival rate.
        on_decode = measured["decode_running"] + measured.get("decode_waiting", 0.0)
        assert details["decode_session_seconds"] == pytest.approx(on_decode / 20.0)


# Two request classes, as in `make demo`: short prompts with long answers, long prompts with short ones.
CHAT, RAG = (500.0, 1000.0), (4500.0, 50.0)


def mixed_windows(scaler: XpydPolicy, until_s: int, noise: float = 0.0) -> None:
    """Windows every 15 s whose mix swings between the two classes (their means on the line between)."""
    rng = np.random.default_rng(0)
    for t in range(0, until_s, 15):
        share = (t // 90) % 2 * 0.8 + 0.1  # 10 % or 90 % long prompts, by 90 s phase
        isl = CHAT[0] + share * (RAG[0] - CHAT[0])
        osl = (CHAT[1] + share * (RAG[1] - CHAT[1])) * (1 + noise * rng.standard_normal())
        scaler.decide(observe(t, 2, 2, mean_input_tokens=isl, mean_output_tokens=osl), Limits())


@pytest.mark.parametrize(
    ("title", "knobs", "windows", "coupled"),
    [
        ("classes on a line: the window's prompt length sets the mix", {}, "swing", True),
        ("the same with noisy answers (r² still high)", {}, "noisy", True),
        # windows whose answer length jumps by more than STEADY_SHARE each time never enter the fit
        ("answers too noisy for a steady window", {}, "very noisy", False),
        ("switched off", {"length_coupling_r2": 0}, "swing", False),
        ("no smoothing, no coupling", {"length_smoothing_s": 0}, "swing", False),
        ("lengths that never moved: nothing to fit", {}, "flat", False),
        ("answers unrelated to prompts (r² low)", {}, "unrelated", False),
    ],
)
def test_a_mixture_of_two_request_classes_is_sized_for_the_windows_mix(
    title: str, knobs: dict[str, float], windows: str, coupled: bool
) -> None:
    scaler = policy(**knobs)
    if windows in ("swing", "noisy", "very noisy"):
        mixed_windows(scaler, 600, noise={"swing": 0.0, "noisy": 0.03, "very noisy": 0.3}[windows])
    else:
        rng = np.random.default_rng(1)
        for t in range(0, 600, 15):
            isl, osl = (ISL, OSL) if windows == "flat" else (rng.uniform(500, 4500), rng.uniform(50, 1000))
            scaler.decide(observe(t, 2, 2, mean_input_tokens=isl, mean_output_tokens=osl), Limits())
    # a window of almost only long prompts, right after a phase of long answers
    decision = scaler.decide(observe(600, 2, 2, mean_input_tokens=4300.0, mean_output_tokens=900.0), Limits())
    assert ("LengthsFromWindowMix" in decision.reasons) is coupled, title
    if coupled:
        assert decision.details["mean_input_tokens"] == 4300.0
        assert decision.details["mean_output_tokens"] == pytest.approx(100.0, abs=60.0)  # on the line
        assert decision.details["length_coupling_r2"] >= 0.6
    else:
        assert decision.details["mean_input_tokens"] != 4300.0 or knobs == {"length_smoothing_s": 0}
        assert "length_coupling_r2" not in decision.details


def test_a_window_beyond_the_prompt_lengths_seen_is_not_sized_on_the_line() -> None:
    """Beyond two standard deviations of the prompt lengths the line was fitted on, it says nothing:
    prefill is sized on the window's own prompt length, decode on the smoothed lengths."""
    scaler = policy()
    mixed_windows(scaler, 600)
    decision = scaler.decide(
        observe(600, 2, 2, mean_input_tokens=30_000.0, mean_output_tokens=50.0), Limits()
    )
    assert "LengthsFromWindowMix" not in decision.reasons
    assert decision.details["prefill_input_tokens"] >= 30_000.0  # the newest arrivals' (see below)
    assert decision.details["mean_input_tokens"] < 5_000.0


def test_prefill_is_sized_on_the_windows_prompt_length_once_it_leaves_the_band() -> None:
    """Prompt lengths are counted at arrival: a window well beyond the smoothed length is the work
    prefill sees now. Inside the tolerance band the smoothed length sizes both pools."""
    scaler = policy()
    for t in range(0, 300, 15):
        scaler.decide(observe(t, 2, 2, mean_input_tokens=1000.0, mean_output_tokens=OSL), Limits())
    inside = scaler.decide(observe(300, 2, 2, mean_input_tokens=1050.0, mean_output_tokens=OSL), Limits())
    assert "prefill_input_tokens" not in inside.details
    swung = scaler.decide(observe(315, 2, 2, mean_input_tokens=4000.0, mean_output_tokens=OSL), Limits())
    # the window (30 s) moved 2950 tokens in one 15 s interval: the newest 15 s had twice that rise
    assert swung.details["prefill_input_tokens"] == pytest.approx(1050.0 + 2 * 2950.0)
    assert "PrefillOnNewestPrompts" in swung.reasons
    assert swung.details["mean_input_tokens"] < 1500.0  # decode still on the smoothed lengths
    off = policy(prefill_window_lengths=0)
    for t in range(0, 300, 15):
        off.decide(observe(t, 2, 2, mean_input_tokens=1000.0, mean_output_tokens=OSL), Limits())
    same = off.decide(observe(315, 2, 2, mean_input_tokens=4000.0, mean_output_tokens=OSL), Limits())
    assert "prefill_input_tokens" not in same.details
    assert swung.details["prefill_floor"] > same.details["prefill_floor"]
    steady = scaler.decide(observe(330, 2, 2, mean_input_tokens=4000.0, mean_output_tokens=OSL), Limits())
    assert steady.details["prefill_input_tokens"] == 4000.0  # the window stopped moving: its own length
    assert "PrefillOnNewestPrompts" not in steady.reasons


def test_under_a_budget_spare_gpus_wait_in_the_pool_the_other_end_of_the_mix_needs() -> None:
    """After a swing between two classes, a budget's unused GPUs go to the pool the other end needs."""
    budget = Limits(prefill_max=8, decode_max=8, gpu_budget=10)
    with_headroom, without = policy(), policy(swing_headroom=0)
    for scaler in (with_headroom, without):
        mixed_windows(scaler, 600)
    chat = observe(600, 2, 2, mean_input_tokens=600.0, mean_output_tokens=900.0)
    raised = with_headroom.decide(chat, budget)
    plain = without.decide(chat, budget)
    assert "PrefillHeadroomForMixSwing" in raised.reasons
    assert raised.details["prefill_swing_floor"] > plain.details["prefill_floor"]
    assert raised.prefill is not None and plain.prefill is not None and raised.decode is not None
    assert raised.prefill > plain.prefill
    assert raised.prefill + raised.decode <= 10
    assert raised.decode == plain.decode  # the pool this mix needs is sized first
    unbounded = with_headroom.decide(
        observe(615, 2, 2, mean_input_tokens=600.0, mean_output_tokens=900.0), Limits()
    )
    assert not any("HeadroomForMixSwing" in reason for reason in unbounded.reasons)  # no budget, no headroom


@pytest.mark.parametrize(
    ("title", "knobs", "limits", "headroom"),
    [
        (
            "a budget, no mix seen: the spare waits in prefill",
            {},
            Limits(prefill_max=8, decode_max=8, gpu_budget=12),
            True,
        ),
        ("prefill's maximum bounds it", {}, Limits(prefill_max=4, decode_max=8, gpu_budget=12), True),
        ("no budget: a cap on nothing, no headroom", {}, Limits(prefill_max=8, decode_max=8), False),
        (
            "swing_headroom 0: the budget is a cap",
            {"swing_headroom": 0},
            Limits(prefill_max=8, decode_max=8, gpu_budget=12),
            False,
        ),
    ],
)
def test_before_the_mix_has_shown_its_ends_a_budgets_spare_gpus_wait_in_prefill(
    title: str, knobs: dict[str, float], limits: Limits, headroom: bool
) -> None:
    """The other end unknown, the spare goes where it moves fastest: a prefill instance hands over
    to decode within a prefill, and a swing to longer prompts loads prefill at once."""
    x, y = floor(5.0)
    assert x + y <= 4  # the budget leaves GPUs the demand does not need
    decision = policy(**knobs).decide(observe(0, x, y, arrival_rate=5.0), limits)
    assert decision.prefill is not None and decision.decode is not None
    assert decision.prefill + decision.decode <= (limits.gpu_budget or 1 << 30)
    assert decision.decode >= y  # the pool the demand needs is sized first
    if headroom:
        assert "PrefillHeadroomForUnseenMix" in decision.reasons
        assert x < decision.prefill <= limits.prefill_max
        assert decision.details["prefill_swing_floor"] == limits.prefill_max
        if limits.prefill_max == 4:  # prefill full: what is left waits in decode
            assert decision.decode > y and "DecodeHeadroomForUnseenMix" in decision.reasons
    else:
        assert (decision.prefill, decision.decode) == (x, y)
        assert not any("Headroom" in reason for reason in decision.reasons)


@pytest.mark.parametrize(("budget", "held"), [(800, True), (None, False)])
def test_after_a_swing_to_long_prompts_decode_is_sized_on_the_requests_it_holds_under_a_budget(
    budget: int | None, held: bool
) -> None:
    """The averaged answer length still describes the mix before; what decode must hold is what it
    holds. Only under a GPU budget, where the old mix's decode would take prefill's GPUs."""
    limits = Limits(prefill_max=400, decode_max=400, gpu_budget=budget)
    scaler = policy()
    for t in range(0, 300, 15):
        scaler.decide(
            observe(t, 2, 2, mean_input_tokens=1000.0, mean_output_tokens=3000.0, decode_running=40.0), limits
        )
    swung = observe(300, 2, 2, mean_input_tokens=4000.0, mean_output_tokens=3000.0, decode_running=2.0)
    decision = scaler.decide(swung, limits)
    assert ("DecodeSizedOnHeldRequests" in decision.reasons) is held
    if held:
        assert decision.details["decode_floor"] == decision.details["decode_held_floor"] == 1.0
    else:
        assert decision.details["decode_floor"] > 2 and "decode_held_floor" not in decision.details


@pytest.mark.parametrize(("isl", "capped"), [(2500.0, True), (CHAT[0], False)])
def test_a_window_between_the_mix_ends_needs_no_more_decode_than_the_more_demanding_end(
    isl: float, capped: bool
) -> None:
    scaler = policy()
    mixed_windows(scaler, 600)
    window = observe(600, 2, 2, mean_input_tokens=isl, mean_output_tokens=600.0, arrival_rate=100.0)
    decision = scaler.decide(window, Limits(prefill_max=400, decode_max=400, gpu_budget=800))
    assert ("DecodeFloorWithinMixEnds" in decision.reasons) is capped
    if capped:
        assert decision.details["decode_floor"] == decision.details["decode_ends_floor"]
        assert decision.details["decode_floor"] <= decision.details["decode_swing_floor"]


def test_a_ttft_miss_with_decode_waiting_behind_a_lightly_loaded_prefill_queue_is_decodes() -> None:
    """A prefill instance holds each finished prompt's KV until decode pulls it: with decode full, a
    prefill queue builds that another prefill instance would not clear."""
    x, y = floor(20.0)
    observation = observe(
        0, 3 * x, y, ttft_p90_s=0.9, decode_kv_usage=0.6, decode_waiting=6.0, prefill_queue=40.0
    )
    decision = policy().decide(observation, Limits())
    assert decision.decode == y + 1 and "DecodeWaitingTtftMissed" in decision.reasons
    assert "PrefillSloMissedAboveFloor" not in decision.reasons


def test_a_pool_grows_by_cold_start_when_cold_starts_were_measured_faster_than_conversions() -> None:
    """Each growth is timed from the decision to the pass whose ready count reaches it."""
    x, y = floor(20.0)
    limits = Limits(prefill_max=40, decode_max=40, gpu_budget=80)
    # without the swing headroom, which would fill the budget's spare with prefill instances
    measured, always_pair = policy(swing_headroom=0), policy(swing_headroom=0, measured_growth=0)
    for scaler in (measured, always_pair):
        first = scaler.decide(observe(0, x - 2, y + 3), limits)  # paired: prefill takes two of decode's
        assert "DecodeReleasedForConversion" in first.reasons
        scaler.decide(observe(30, x, y + 1), limits)  # the conversion served after 30 s
        grown = scaler.decide(observe(45, x, y + 1, arrival_rate=40.0), limits)  # both grow: cold starts
        assert grown.prefill is not None and grown.decode is not None and grown.prefill > x
        scaler.decide(observe(50, grown.prefill, grown.decode, arrival_rate=40.0), limits)  # after 5 s
        later = scaler.decide(observe(400, x - 2, y + 3), limits)
        if scaler is measured:
            assert later.details["measured_cold_start_seconds"] == 5.0
            assert later.details["measured_conversion_seconds"] == 30.0
            # decode's surplus leaves on its own schedule (one per down period), not by conversion
            assert "PrefillGrowsByColdStart" in later.reasons and later.decode == y + 2
        else:
            assert "DecodeReleasedForConversion" in later.reasons and later.decode == y  # converted


def test_a_ttft_miss_within_a_window_of_decodes_misses_is_nobodys() -> None:
    """The window's p90 still holds the first tokens that waited on decode: prefill does not grow for
    them; one window later a miss is prefill's again."""
    x, y = floor(20.0)
    scaler = policy()
    waited = observe(0, x, y, ttft_p90_s=0.9, decode_kv_usage=0.6, decode_waiting=6.0, prefill_queue=0.0)
    assert "DecodeWaitingTtftMissed" in scaler.decide(waited, Limits()).reasons
    caught_up = {"ttft_p90_s": 0.9, "decode_kv_usage": 0.6, "decode_waiting": 0.0, "prefill_queue": 0.0}
    stale = scaler.decide(observe(15, x, y + 1, **caught_up), Limits())
    assert "TtftMissesOfDecodeInWindow" in stale.reasons and stale.prefill == x
    fresh = scaler.decide(observe(45, x, y + 1, **caught_up), Limits())  # one 30 s window later
    assert "PrefillSloMissedAboveFloor" in fresh.reasons and fresh.prefill == x + 1


@pytest.mark.parametrize(
    ("usage", "share_of_cap", "decode", "knobs", "fires"),
    [
        (1.0, 0.5, PoolState(ready=4), {}, True),  # full at half the model's batch: floor at that batch
        (0.92, 0.5, PoolState(ready=4), {}, True),
        (0.85, 0.5, PoolState(ready=4), {}, False),  # below `decode_measured_kv`: the model's cap
        (0.75, 0.3, PoolState(ready=3, starting=1), {}, True),  # a starting instance reads empty
        (1.0, 1.1, PoolState(ready=4), {}, False),  # its requests fit the model's cap: nothing to raise
        (1.0, 0.5, PoolState(ready=4), {"decode_measured_kv": 0}, False),  # off
        (1.0, 0.5, PoolState(ready=0, starting=4), {}, False),  # nothing serving: nothing measured
    ],
)
def test_a_full_decode_kv_sizes_decode_at_the_batch_its_requests_measure_to_hold(
    usage: float, share_of_cap: float, decode: PoolState, knobs: dict[str, float], fires: bool
) -> None:
    """While decode fills, the answers measured are the short ones that finished and the requests it
    holds are the long ones: at KV usage `decode_measured_kv` or above, running requests per full
    instance's worth of KV is the batch an instance holds (`make demo`: 27-30 at 94-100 % KV where the
    model's cap read 32, requests waiting, decode held at 2)."""
    base = policy().decide(observe(0, 4, 4), Limits()).details
    running = share_of_cap * base["decode_batch_cap"] * 4
    observation = observe(0, 4, decode, decode_running=running, decode_kv_usage=usage)
    decision = policy(**knobs).decide(observation, Limits())
    details = decision.details
    model_floor = policy(decode_measured_kv=0).decide(observation, Limits()).details["decode_floor"]
    assert ("DecodeSizedOnMeasuredKv" in decision.reasons) is fires
    if fires:
        batch = running / (usage * (decode.ready + decode.starting))
        assert details["decode_measured_batch"] == pytest.approx(batch)
        assert details["decode_floor"] == details["decode_kv_floor"]
        assert details["decode_floor"] == np.ceil(details["concurrency"] / batch)
        assert details["decode_floor"] > model_floor
    else:
        assert "decode_kv_floor" not in details
        assert details["decode_floor"] == model_floor


@pytest.mark.parametrize("value", [0.3, 1.5, -1.0])
def test_decode_measured_kv_outside_its_range_is_rejected(value: float) -> None:
    with pytest.raises(PolicyConfigError, match="decode_measured_kv"):
        policy(decode_measured_kv=value)


def test_the_batch_a_full_decode_kv_measured_holds_its_scale_down_for_the_down_window() -> None:
    """Instances the measured batch asked for bring the usage below the threshold; the model's cap would
    take them back at once (`make demo`: up, down and up again in the first phase). A pool that grows
    now may still take them by conversion (the pairing releases what is above the floor)."""
    x, _ = floor(20.0)  # prefill at its floor: nothing pairs
    base = policy().decide(observe(0, x, 4), Limits()).details
    running = 0.5 * base["decode_batch_cap"] * 4
    scaler = policy(down_window_s=60)
    fired = scaler.decide(observe(0, x, 4, decode_running=running, decode_kv_usage=1.0), Limits())
    assert "DecodeSizedOnMeasuredKv" in fired.reasons
    grown = int(fired.details["decode_floor"])
    later = [
        scaler.decide(observe(t, x, grown, decode_running=running, decode_kv_usage=0.5), Limits())
        for t in (30, 70)
    ]
    assert "DecodeHeldOnMeasuredKv" in later[0].reasons and later[0].decode == grown
    assert later[0].details["decode_measured_batch"] == fired.details["decode_measured_batch"]
    assert "DecodeHeldOnMeasuredKv" not in later[1].reasons  # the down window has passed
    assert later[1].details["decode_down_target"] < grown  # the model's cap again
