"""The generalisation suite (`benchmarks/generalisation.py`): its scenarios are drawn, not hand-made,
the same way every time; its traces follow their rate curves; and its fixed-split reference is the
cheapest split that passes, as a brute force over every split finds it."""

from __future__ import annotations

import dataclasses
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import generated_traffic as gt
from autoscaling import Outcome
from generalisation import (
    Results,
    foresight_lines,
    reachable_lines,
    repair_schedule,
    search_fixed_split,
    undercut_lines,
    verdicts,
)
from xpyd_controller.policy.types import Limits
from xpyd_controller.sim.scenarios import trace_dir

PRESETS = {p.key: p for p in gt.PRESETS}
needs_traces = pytest.mark.skipif(
    not all((trace_dir() / f).is_file() for f in gt.TRACE_FILES.values()),
    reason=f"the real-trace scenarios read {', '.join(gt.TRACE_FILES.values())} from $XPYD_TRACE_DIR",
)


def drawn(kind: str, preset: str = "70b-h100-tp4", budget: str = "none", draw: int = 0) -> gt.GenScenario:
    return gt.draw_scenario(kind, draw, (11, draw), PRESETS[preset], budget)


@pytest.fixture(scope="module")
def suite() -> list[gt.GenScenario]:
    return gt.generate()


@needs_traces
def test_the_same_master_seed_draws_the_same_scenarios_and_another_draws_others(
    suite: list[gt.GenScenario],
) -> None:
    assert [repr(g) for g in gt.generate()] == [repr(g) for g in suite]
    assert [g.recipe for g in gt.generate(gt.DEFAULT_MASTER_SEED + 1)] != [g.recipe for g in suite]


@needs_traces
def test_the_suite_covers_every_class_preset_and_budget_kind(suite: list[gt.GenScenario]) -> None:
    assert len(suite) >= 30
    assert len({g.name for g in suite}) == len(suite)
    kinds = Counter(g.kind for g in suite)
    assert set(kinds) == set(gt.CLASSES) and min(kinds.values()) >= 3
    assert {g.preset for g in suite} == set(PRESETS)
    assert {g.budget for g in suite} == {"none", "loose", "binding"}
    assert any(g.name.startswith("tail-lognormal") for g in suite)
    assert any(g.name.startswith("tail-pareto") for g in suite)
    files = {s.file for g in suite for s in g.recipe.streams if isinstance(s, gt.TraceStream)}
    assert files == set(gt.TRACE_FILES.values())
    for gen in suite:
        config, limits = gen.scenario.config, gen.scenario.limits
        assert config.realism.kv_capacity and config.realism.layerwise_transfer
        assert 60 <= config.realism.cold_start_s <= 300 and 20 <= config.realism.conversion_s <= 40
        assert (config.control.scrape_interval_s, config.control.window_s, config.control.lag_s) == (
            15,
            60,
            15,
        )
        assert config.control.role_conversion
        assert 30 * 60 <= gen.recipe.duration_s <= 60 * 60
        assert max(gen.estimated_peak) <= gt.TARGET_PEAK_INSTANCES[1]
        peak_gpus = config.hardware.gpus_per_instance * sum(gen.estimated_peak)
        if gen.budget == "binding":
            assert limits.gpu_budget is not None and limits.gpu_budget < peak_gpus
        if gen.budget == "loose":
            assert limits.gpu_budget is not None and limits.gpu_budget >= peak_gpus


@needs_traces
def test_real_traces_are_sped_up_thinned_and_superposed(suite: list[gt.GenScenario]) -> None:
    gen = next(g for g in suite if g.kind == "real-traces" and len(g.recipe.streams) == 3)
    expected = sum(
        s.keep
        * len(gt.source_trace(s.file))
        * s.speedup
        * gen.recipe.duration_s
        / gt.source_trace(s.file).arrival_s[-1]
        for s in gen.recipe.streams
        if isinstance(s, gt.TraceStream)
    )
    trace = gen.trace(1)
    assert len(trace) == pytest.approx(expected, rel=0.03)
    assert trace.prompt_tokens.max() < gen.recipe.context_tokens
    assert trace.prefix_hit_tokens.sum() > 0  # Mooncake's prefix hits come along


def test_a_run_seed_redraws_the_requests_and_nothing_else() -> None:
    gen = drawn("three-class")
    assert repr(drawn("three-class")) == repr(gen)
    first, again, other = (
        gt.build_trace(gen.recipe, 1),
        gt.build_trace(gen.recipe, 1),
        gt.build_trace(gen.recipe, 2),
    )
    assert np.array_equal(first.arrival_s, again.arrival_s)
    assert np.array_equal(first.prompt_tokens, again.prompt_tokens)
    assert not np.array_equal(first.prompt_tokens[:100], other.prompt_tokens[:100])
    assert len(other) == pytest.approx(len(first), rel=0.05)
    assert (first.prompt_tokens + first.output_tokens).max() <= gen.recipe.context_tokens


def rate(trace_arrivals: np.ndarray, start: float, end: float) -> float:
    return float(((trace_arrivals >= start) & (trace_arrivals < end)).sum()) / (end - start)


def test_a_flash_crowd_peaks_at_k_times_its_base_rate() -> None:
    gen = drawn("flash-crowd")
    stream = gen.recipe.streams[0]
    assert isinstance(stream, gt.SyntheticStream)
    times, values = stream.rate.times_s, stream.rate.values
    k = values[2] / values[0]
    assert 3 <= k <= 6 and 120 <= times[3] - times[2] <= 300  # a 3-6x crowd over 2-5 minutes
    arrivals = gen.trace(1).arrival_s
    assert rate(arrivals, times[2], times[3]) / rate(arrivals, 0.0, times[1]) == pytest.approx(k, rel=0.1)
    assert gen.name.startswith(f"flash-crowd-{k:.1f}x")


def test_a_drop_falls_to_near_zero_and_comes_back() -> None:
    gen = drawn("drop", preset="8b-h100")
    stream = gen.recipe.streams[0]
    assert isinstance(stream, gt.SyntheticStream)
    times, values = stream.rate.times_s, stream.rate.values
    arrivals = gen.trace(2).arrival_s
    base = rate(arrivals, 0.0, times[1])
    assert rate(arrivals, times[2], times[3]) / base == pytest.approx(values[2] / values[0], abs=0.02)
    assert values[2] / values[0] <= 0.05
    assert rate(arrivals, times[4], times[5]) == pytest.approx(base, rel=0.1)


def test_bursty_arrivals_have_the_drawn_coefficient_of_variation() -> None:
    gen = drawn("bursty", preset="8b-a100")
    stream = gen.recipe.streams[0]
    assert isinstance(stream, gt.SyntheticStream) and 2 <= stream.cv <= 4
    gaps = np.diff(gen.trace(1).arrival_s)
    assert gaps.std() / gaps.mean() == pytest.approx(stream.cv, rel=0.15)


def test_a_fast_mix_swing_moves_the_mix_within_minutes() -> None:
    gen = drawn("mix-swing")
    trace = gen.trace(1)
    long_prompt = trace.prompt_tokens > np.median(trace.prompt_tokens)
    per_minute = np.bincount((trace.arrival_s // 60).astype(int), weights=long_prompt) / np.bincount(
        (trace.arrival_s // 60).astype(int)
    )
    assert per_minute.max() - per_minute.min() > 0.3


def tiny_scenario() -> gt.GenScenario:
    """Five minutes of 8B chat at a rate a handful of instances serve: a grid of splits runs in seconds."""
    base = drawn("flat-poisson", preset="8b-h100")
    duration = 300.0
    chat = gt.LengthClass("chat", gt.Dist("lognormal", 2500.0, 0.5), gt.Dist("lognormal", 400.0, 0.5))
    stream = gt.SyntheticStream(
        gt.curve((0.0, duration), (28.0, 28.0)), (chat,), (gt.curve((0.0, duration), (1.0, 1.0)),)
    )
    recipe = gt.Recipe(duration, base.recipe.context_tokens, (stream,))
    limits = Limits(prefill_max=4, decode_max=4)
    return dataclasses.replace(
        base, recipe=recipe, scenario=dataclasses.replace(base.scenario, limits=limits)
    )


def test_the_fixed_split_search_finds_the_cheapest_split_a_brute_force_finds() -> None:
    gen = tiny_scenario()
    goodput = {(p, d): gt.measure(gen, 1, fleet=(p, d))["goodput"] for p in range(1, 5) for d in range(1, 5)}
    passing = sorted((p + d, -g, p, d) for (p, d), g in goodput.items() if g >= 0.99)
    assert passing and passing[0][0] > 2 and not goodput[(4, 4)] < 0.99  # neither trivial nor impossible
    calls: list[tuple[int, int]] = []

    def evaluate(p: int, d: int) -> float:
        calls.append((p, d))
        return goodput[(p, d)]

    for start in ((1, 1), (2, 2), (4, 4), (3, 1)):
        calls.clear()
        found = search_fixed_split(evaluate, start, gen.scenario.limits, 1)
        assert (found.prefill, found.decode) == passing[0][2:] and found.reached
        assert found.simulations == len(set(calls)) <= 12


def test_without_a_passing_split_the_search_reports_the_best_goodput_on_the_budget() -> None:
    def goodput(p: int, d: int) -> float:  # needs 6P + 6D; the budget pays for 8 instances
        return 0.5 + 0.4 * min(p / 6, 1) * min(d / 6, 1)

    found = search_fixed_split(goodput, (6, 6), Limits(prefill_max=10, decode_max=10, gpu_budget=16), 2)
    assert not found.reached and (found.prefill, found.decode) == (4, 4)
    assert found.simulations <= 20


def test_hindsight_repairs_the_blamed_pool_and_moves_instances_under_a_budget() -> None:
    def window(
        w: int, ttft: float, tpot: float, queued: float = 5.0, waiting: float = 0.0
    ) -> dict[str, float]:
        return {f"n{w}": 100.0, f"ttft{w}": ttft, f"tpot{w}": tpot, f"pq{w}": queued, f"dw{w}": waiting}

    # Window 0 met its SLOs; 1 missed TTFT waiting for prefill, 2 TPOT, 3 TTFT waiting on decode.
    metrics = window(0, 0, 0) | window(1, 20, 0) | window(2, 0, 5) | window(3, 20, 0, queued=0.5, waiting=40)
    prefill, decode = [2, 2, 2, 2], [3, 3, 3, 3]
    assert repair_schedule(metrics, prefill, decode, Limits(), 1)
    assert (prefill, decode) == ([2, 3, 2, 2], [3, 3, 4, 4])
    prefill, decode = [2, 2, 2, 2], [3, 3, 3, 3]
    assert repair_schedule(metrics, prefill, decode, Limits(gpu_budget=10), 2)  # 5 instances: no room
    assert (prefill, decode) == ([2, 3, 1, 1], [3, 2, 4, 4])  # the instance moves to the blamed pool
    assert not repair_schedule(window(0, 0.5, 0.4), [1], [1], Limits(), 1)


def test_the_targets_are_judged_on_the_hindsight_schedule_too() -> None:
    """(a)-(c) for the schedule that knows each window's traffic: counted over the same scenarios."""
    rows = {  # scenario: (fixed-split goodput, GPU-h), (hindsight goodput, GPU-h)
        "met-cheaper": ((0.995, 10.0), (0.992, 9.0)),
        "met-costlier": ((0.995, 10.0), (0.999, 12.0)),
        "missed": ((0.995, 10.0), (0.95, 8.0)),
        "fixed-fails": ((0.9, 10.0), (0.97, 11.0)),
    }
    outcomes = [
        Outcome(name, row, 1, {"goodput": goodput, "gpu_hours": gpu_h}, 0.0)
        for name, pair in rows.items()
        for row, (goodput, gpu_h) in zip(("fixed-split", "hindsight"), pair, strict=True)
    ]
    assert foresight_lines(Results(outcomes), list(rows)) == [
        "- the same targets for hindsight (each window's traffic known a cold start ahead): "
        "(a) 2/3, (b) 2/3, (c) 2/4"
    ]
    assert foresight_lines(Results(outcomes[:1]), ["met-cheaper"]) == []  # no hindsight row run


def test_target_a_is_also_counted_where_asking_the_fixed_split_at_once_reaches_it() -> None:
    """Where the fixed split asked at the first decision misses 99 %, the start fleet lost more than
    1 % before a cold start served: (a) is counted apart there."""
    rows = {  # scenario: goodput of fixed-split, fixed-split-asked, xpyd
        "reachable-met": (0.995, 0.993, 0.991),
        "reachable-missed": (0.995, 0.992, 0.97),
        "start-short": (0.995, 0.97, 0.96),
        "fixed-fails": (0.9, 0.9, 0.9),
    }
    outcomes = [
        Outcome(name, row, 1, {"goodput": goodput, "gpu_hours": 1.0}, 0.0)
        for name, values in rows.items()
        for row, goodput in zip(("fixed-split", "fixed-split-asked", "xpyd"), values, strict=True)
    ]
    results = Results(outcomes)
    assert reachable_lines(results, verdicts(results, list(rows))) == [
        "- (a) where the fixed split asked at the first decision also reaches 99 %: 1/2 (asking for it "
        "at once misses 99 % too in `start-short`)"
    ]
    without = Results([o for o in outcomes if o.policy != "fixed-split-asked"])
    assert reachable_lines(without, verdicts(without, list(rows))) == []


def test_target_c_at_99_percent_counts_cheaper_schedules_that_hold_the_target() -> None:
    """Fewer GPU-hours counts only at 99 % where the fixed split reaches it; the line also says in how
    many of those any row run does so (the bound on what (c) can reach)."""
    rows = {  # scenario: (goodput, GPU-h) of fixed-split, xpyd, hindsight
        "xpyd-undercuts": ((0.995, 10.0), (0.993, 9.0), (0.999, 11.0)),
        "xpyd-cheaper-but-late": ((0.995, 10.0), (0.95, 8.0), (0.992, 9.5)),
        "nobody-undercuts": ((0.991, 10.0), (0.999, 10.5), (0.995, 10.0)),
        "fixed-fails": ((0.9, 10.0), (0.97, 9.0), (0.995, 9.0)),
    }
    outcomes = [
        Outcome(name, row, 1, {"goodput": goodput, "gpu_hours": gpu_h}, 0.0)
        for name, cells in rows.items()
        for row, (goodput, gpu_h) in zip(("fixed-split", "xpyd", "hindsight"), cells, strict=True)
    ]
    assert undercut_lines(Results(outcomes), list(rows)) == [
        "- (c) at 99 %: where fixed-split reaches 99 %, xpyd does on fewer GPU-h in 1/3 (target ≥ 2/3); "
        "some row run here does in 2/3, hindsight included"
    ]
    without_xpyd = Results([o for o in outcomes if o.policy != "xpyd"])
    assert undercut_lines(without_xpyd, list(rows)) == []
