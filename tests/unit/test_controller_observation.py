"""Query answers → Observation: ratios of windowed rates, None for no data, 0 traffic kept as 0."""

from __future__ import annotations

import math

import pytest

from xpyd_controller.adapters.prometheus import single_value
from xpyd_controller.control.observation import (
    build_observation,
    implausible_signals,
    live_window,
    missing_signals,
    sanitized,
)
from xpyd_controller.control.promql import POLICY_SIGNALS, Signal
from xpyd_controller.model.calibration import LiveWindow
from xpyd_controller.policy.types import PoolState

PREFILL, DECODE = PoolState(2, 1, 0, 1), PoolState(3, 0, 1, 1)
FULL = {
    Signal.ARRIVAL_RATE: 4.0,
    Signal.PREFILL_FINISHED_RATE: 4.0,
    Signal.INPUT_TOKENS_RATE: 8000.0,
    Signal.INPUT_TOKENS_P90: 3500.0,
    Signal.OUTPUT_REQUESTS_RATE: 2.0,
    Signal.OUTPUT_TOKENS_RATE: 600.0,
    Signal.OUTPUT_TOKENS_P90: 450.0,
    Signal.PREFIX_QUERIES_RATE: 8000.0,
    Signal.PREFIX_HITS_RATE: 2000.0,
    Signal.PREFILL_QUEUE: 5.0,
    Signal.DECODE_RUNNING: 40.0,
    Signal.DECODE_WAITING: 3.0,
    Signal.DECODE_KV_USAGE: 0.5,
    Signal.TTFT_P90: 0.4,
    Signal.TPOT_P90: 0.03,
    Signal.PREFILL_TTFT_MEAN: 0.2,
    Signal.TPOT_MEAN: 0.02,
}


def observe(**changes: float | None) -> dict[str, object]:
    answers = {**FULL, **{Signal(k): v for k, v in changes.items()}}
    return vars(build_observation(answers, PREFILL, DECODE, 100.0, 60.0))


def test_full_answers() -> None:
    obs = observe()
    assert (obs["time_s"], obs["window_s"], obs["prefill"], obs["decode"]) == (100.0, 60.0, PREFILL, DECODE)
    assert obs["arrival_rate"] == 4.0
    assert obs["mean_input_tokens"] == 2000.0
    assert obs["mean_output_tokens"] == 300.0
    assert obs["prefix_hit_rate"] == 0.25
    assert (obs["p90_input_tokens"], obs["p90_output_tokens"]) == (3500.0, 450.0)
    assert (obs["prefill_queue"], obs["decode_running"], obs["decode_kv_usage"]) == (5.0, 40.0, 0.5)
    assert (obs["ttft_p90_s"], obs["tpot_p90_s"], obs["tpot_mean_s"]) == (0.4, 0.03, 0.02)
    assert obs["decode_waiting"] == 3.0


@pytest.mark.parametrize(
    ("changes", "field", "expected"),
    [
        ({"arrival_rate": 0.0, "input_tokens_rate": 0.0}, "arrival_rate", 0.0),  # no traffic is a real 0
        ({"prefill_finished_rate": 0.0, "input_tokens_rate": 0.0}, "mean_input_tokens", None),  # of nothing
        ({"arrival_rate": None}, "arrival_rate", None),
        ({"prefill_finished_rate": None}, "mean_input_tokens", None),
        # prefill behind: 4 req/s arrive, it finishes 1.6; the prompt mean is over the finished ones
        (
            {"arrival_rate": 4.0, "prefill_finished_rate": 1.6, "input_tokens_rate": 8000.0},
            "mean_input_tokens",
            5000.0,
        ),
        ({"input_tokens_rate": None}, "mean_input_tokens", None),
        ({"output_requests_rate": 0.0}, "mean_output_tokens", None),
        ({"prefix_queries_rate": 0.0}, "prefix_hit_rate", None),
        ({"prefix_hits_rate": None}, "prefix_hit_rate", None),
        ({"prefix_hits_rate": 0.0}, "prefix_hit_rate", 0.0),
        ({"decode_kv_usage": None}, "decode_kv_usage", None),
        ({"prefill_queue": 0.0}, "prefill_queue", 0.0),
        ({"ttft_p90": None}, "ttft_p90_s", None),
    ],
)
def test_missing_and_zero(changes: dict[str, float | None], field: str, expected: float | None) -> None:
    assert observe(**changes)[field] == expected


def test_missing_signals_in_signal_order() -> None:
    answers = {**FULL, Signal.TPOT_P90: None, Signal.ARRIVAL_RATE: None}
    assert missing_signals(answers) == [Signal.ARRIVAL_RATE, Signal.TPOT_P90]
    assert missing_signals({}) == list(POLICY_SIGNALS)


@pytest.mark.parametrize(
    ("result", "expected"),
    [
        ([{"metric": {}, "value": [1.0, "2.5"]}], 2.5),
        ([{"metric": {}, "value": [1.0, "0"]}], 0.0),
        ([], None),  # empty: no series
        ([{"value": [1, "1"]}, {"value": [1, "2"]}], None),  # ambiguous: more than one series
        ([{"metric": {}, "value": [1.0, "NaN"]}], None),
        ([{"metric": {}, "value": [1.0, "+Inf"]}], None),
        ([{"metric": {}, "value": [1.0, "-Inf"]}], None),
        ([{"metric": {}}], None),
        ("garbage", None),
    ],
)
def test_single_value_is_strict(result: object, expected: float | None) -> None:
    value = single_value(result)
    assert value == expected and (value is None or math.isfinite(value))


def window(**changes: float | None) -> LiveWindow:
    answers = {**FULL, **{Signal(k): v for k, v in changes.items()}}
    return live_window(answers, build_observation(answers, PREFILL, DECODE, 100.0, 60.0))


def test_live_window_for_the_calibration() -> None:
    idle = window(prefill_queue=0.0)
    # 2000-token prompts, a quarter from the prefix cache; 40 running on 3 ready decode instances
    assert idle == LiveWindow(1500.0, 0.2, 40 / 3, 2000.0 + 300.0 / 2, 0.02)
    assert window().prefill_seconds is None  # 5 requests waited: their TTFT is queueing, not compute
    assert window(prefill_queue=None).prefill_seconds is None
    assert window(tpot_mean=None, decode_running=None).decode_step_seconds is None
    assert window(decode_running=None).decode_batch is None
    assert window(output_tokens_rate=None).decode_context is None


def test_calibration_signals_are_not_policy_inputs() -> None:
    """Without them (xpyd's simulator records no prefill TTFT) nothing is missing for the policy, and a
    corrupt one only skips a calibration reading: it never holds a scale-down."""
    answers = {**FULL, Signal.PREFILL_TTFT_MEAN: None, Signal.TPOT_MEAN: 1e308}
    assert missing_signals(answers) == [] and implausible_signals(answers) == []
    assert sanitized(answers)[Signal.TPOT_MEAN] is None
