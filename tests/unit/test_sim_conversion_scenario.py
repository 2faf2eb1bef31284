"""xpyd's role conversion fires where the mix swings, and pays off against the same run without it."""

from __future__ import annotations

import dataclasses

import pytest

from xpyd_controller.sim.config import SimConfigError
from xpyd_controller.sim.policies import build_policy
from xpyd_controller.sim.results import SimResult
from xpyd_controller.sim.runner import simulate
from xpyd_controller.sim.scenarios import builtin_scenarios, load_scenario, mix_swing

SEED = 1


def run(role_conversion: bool) -> SimResult:
    """One full chat → RAG → chat swing (2 h) of `mix-swing` under xpyd."""
    scenario = mix_swing(hours=2.0)
    control = dataclasses.replace(scenario.config.control, role_conversion=role_conversion)
    config = dataclasses.replace(scenario.config, control=control)
    trace = scenario.traffic.build(SEED)
    return simulate(config, trace, build_policy("xpyd", config, trace), limits=scenario.limits)


@pytest.fixture(scope="module")
def runs() -> dict[bool, SimResult]:
    return {allowed: run(allowed) for allowed in (True, False)}


def test_xpyd_converts_roles_on_the_swing(runs: dict[bool, SimResult]) -> None:
    assert runs[True].conversions >= 1
    assert runs[False].conversions == 0


def test_conversion_saves_cold_starts_without_losing_goodput(runs: dict[bool, SimResult]) -> None:
    with_conversion, without = runs[True], runs[False]
    assert with_conversion.scale_ups < without.scale_ups
    assert with_conversion.goodput >= without.goodput
    assert with_conversion.gpu_hours <= without.gpu_hours * 1.01


def test_the_swing_moves_prefill_and_decode_needs_in_opposite_directions(
    runs: dict[bool, SimResult],
) -> None:
    series = runs[False].series
    chat_heavy = max(series, key=lambda point: point.mean_output_tokens)
    rag_heavy = max(series, key=lambda point: point.mean_input_tokens)
    assert rag_heavy.prefill_ready >= chat_heavy.prefill_ready + 3
    assert chat_heavy.decode_ready > rag_heavy.decode_ready


def test_mix_swing_is_a_builtin_driven_by_xpyd() -> None:
    scenario = load_scenario("mix-swing")
    assert scenario == builtin_scenarios()["mix-swing"]
    assert scenario.policy == "xpyd" and scenario.config.control.role_conversion
    realism = scenario.config.realism
    assert realism.decode_kv_reads and realism.conversion_s < realism.cold_start_s / 5
    assert scenario.traffic.duration_s == 4 * 3600.0


def test_the_heavy_chat_swing_is_mix_swing_at_a_higher_rate() -> None:
    swing, heavy = load_scenario("mix-swing"), load_scenario("mix-swing-heavy-chat")
    assert (swing.traffic.rate, heavy.traffic.rate) == (6.0, 8.0)
    assert heavy.config == swing.config and heavy.limits == swing.limits
    assert dataclasses.replace(heavy.traffic, rate=6.0) == swing.traffic
    assert "8 req/s" in heavy.description


@pytest.mark.parametrize("period", [0.0, -60.0, float("inf"), float("nan")])
def test_a_bad_mix_period_is_rejected_by_name(period: float) -> None:
    with pytest.raises(SimConfigError, match=r"traffic\.mix_period_s"):
        dataclasses.replace(mix_swing().traffic, mix_period_s=period)
