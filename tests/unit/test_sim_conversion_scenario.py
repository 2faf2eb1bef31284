"""xpyd's role conversion fires where the mix swings, and pays off against the same run without it."""

from __future__ import annotations

import dataclasses

import pytest

from xpyd_controller.sim.config import SimConfigError
from xpyd_controller.sim.policies import build_policy
from xpyd_controller.sim.results import SimResult
from xpyd_controller.sim.runner import simulate
from xpyd_controller.sim.scenarios import builtin_scenarios, load_scenario, mix_swing

SEEDS = (1, 2, 3)  # one run's GPU-hours move by about 1 % either way with its trajectory


def run(role_conversion: bool, seed: int) -> SimResult:
    """One full chat → RAG → chat swing (2 h) of `mix-swing` under xpyd."""
    scenario = mix_swing(hours=2.0)
    control = dataclasses.replace(scenario.config.control, role_conversion=role_conversion)
    config = dataclasses.replace(scenario.config, control=control)
    trace = scenario.traffic.build(seed)
    return simulate(config, trace, build_policy("xpyd", config, trace), limits=scenario.limits)


@pytest.fixture(scope="module")
def runs() -> dict[bool, list[SimResult]]:
    return {allowed: [run(allowed, seed) for seed in SEEDS] for allowed in (True, False)}


def test_xpyd_converts_roles_on_the_swing(runs: dict[bool, list[SimResult]]) -> None:
    assert sum(result.conversions for result in runs[True]) >= 1
    assert all(result.conversions == 0 for result in runs[False])


def test_conversion_saves_cold_starts_without_losing_goodput(runs: dict[bool, list[SimResult]]) -> None:
    with_conversion, without = runs[True], runs[False]
    assert sum(r.scale_ups for r in with_conversion) < sum(r.scale_ups for r in without)
    assert all(a.goodput >= b.goodput for a, b in zip(with_conversion, without, strict=True))
    assert sum(r.gpu_hours for r in with_conversion) <= sum(r.gpu_hours for r in without) * 1.01


def test_the_swing_moves_prefill_and_decode_needs_in_opposite_directions(
    runs: dict[bool, list[SimResult]],
) -> None:
    series = runs[False][0].series
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
