"""The live fleet (the demo's data plane): exposition text, routing, role switches, request conservation."""

from __future__ import annotations

import dataclasses
import re

import pytest

from xpyd_api.names import Role
from xpyd_controller.model.presets import GPU_PRESETS, LINK_PRESETS, MODEL_PRESETS
from xpyd_controller.sim.config import GoodputSlo, Hardware
from xpyd_controller.sim.exposition import EngineSeries, Histogram, render
from xpyd_controller.sim.live import LiveFleet, LiveFleetError, LiveTraffic
from xpyd_controller.sim.traces.synthetic import Constant, MixDrift, Step, UniformLengths

# A slow GPU with little HBM, so a few requests/s keep a handful of instances busy.
SMALL_GPU = dataclasses.replace(
    GPU_PRESETS["h100-sxm"], peak_flops=3e14, mfu=0.4, hbm_bandwidth=1e12, hbm_bytes=20e9
)
HARDWARE = Hardware(MODEL_PRESETS["llama-3.1-8b"], SMALL_GPU, LINK_PRESETS["ib-400g"])
SLO = GoodputSlo(ttft_s=2.0, tpot_s=0.04, max_token_gap_s=None)
CHAT = UniformLengths(200, 800, 300, 600)
RAG = UniformLengths(3000, 6000, 20, 80)


def fleet(rate: float = 4.0, seed: int = 1, lengths: UniformLengths | MixDrift = CHAT) -> LiveFleet:
    return LiveFleet(HARDWARE, LiveTraffic(Constant(rate), lengths), SLO, seed=seed)


def sample(text: str, name: str) -> float:
    """The value of the one sample called `name` in an exposition body."""
    match = re.search(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? (\S+)$", text, re.MULTILINE)
    assert match, f"{name} not in:\n{text}"
    return float(match.group(1))


def conserved(live: LiveFleet) -> bool:
    stats = live.stats()
    return stats.arrived == stats.completed + stats.in_system


# ---- exposition -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("observations", "expected_buckets", "expected_sum", "expected_count"),
    [
        ([], {"1.0": 0, "10.0": 0, "+Inf": 0}, 0.0, 0),
        ([(1.0, 1)], {"1.0": 1, "10.0": 1, "+Inf": 1}, 1.0, 1),  # a bound is inclusive (le)
        ([(5.0, 3)], {"1.0": 0, "10.0": 3, "+Inf": 3}, 15.0, 3),
        ([(0.5, 1), (50.0, 2)], {"1.0": 1, "10.0": 1, "+Inf": 3}, 100.5, 3),
    ],
)
def test_histograms_render_cumulative_buckets_sum_and_count(
    observations: list[tuple[float, int]],
    expected_buckets: dict[str, int],
    expected_sum: float,
    expected_count: int,
) -> None:
    series = EngineSeries(ttft=Histogram((1.0, 10.0)))
    for value, count in observations:
        series.ttft.observe(value, count)
    text = render(series, "m")
    name = "vllm:time_to_first_token_seconds"
    for bound, count in expected_buckets.items():
        assert f'{name}_bucket{{model_name="m",le="{bound}"}} {float(count)}' in text
    assert sample(text, f"{name}_sum") == expected_sum
    assert sample(text, f"{name}_count") == expected_count
    assert f"# TYPE {name} histogram" in text


@pytest.mark.parametrize(
    ("field", "value", "sample_name", "family_type"),
    [
        ("running", 7, "vllm:num_requests_running", "# TYPE vllm:num_requests_running gauge"),
        ("waiting", 2, "vllm:num_requests_waiting", "# TYPE vllm:num_requests_waiting gauge"),
        ("kv_usage", 0.25, "vllm:kv_cache_usage_perc", "# TYPE vllm:kv_cache_usage_perc gauge"),
        (
            "prefix_queries",
            900.0,
            "vllm:prefix_cache_queries_total",
            "# TYPE vllm:prefix_cache_queries counter",
        ),
        ("prefix_hits", 300.0, "vllm:prefix_cache_hits_total", "# TYPE vllm:prefix_cache_hits counter"),
    ],
)
def test_gauges_and_counters_carry_vllm_names(
    field: str, value: float, sample_name: str, family_type: str
) -> None:
    series = EngineSeries()
    setattr(series, field, value)
    text = render(series, 'a"b')
    assert sample(text, sample_name) == value
    assert family_type in text
    assert 'model_name="a\\"b"' in text  # label values escaped


@pytest.mark.parametrize(
    ("bounds", "value", "count"),
    [((), 1.0, 1), ((2.0, 1.0), 1.0, 1), ((1.0,), float("nan"), 1), ((1.0,), 1.0, -1)],
)
def test_histograms_reject_bad_bounds_and_observations(
    bounds: tuple[float, ...], value: float, count: float
) -> None:
    with pytest.raises(ValueError, match=r"histogram bounds|observation"):
        Histogram(bounds).observe(value, count)


# ---- routing ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("instances", "busy"),
    [
        ({"p0": (Role.PREFILL, True), "p1": (Role.PREFILL, False), "d0": (Role.DECODE, True)}, {"p0", "d0"}),
        ({"p0": (Role.PREFILL, False), "p1": (Role.PREFILL, True), "d0": (Role.DECODE, True)}, {"p1", "d0"}),
        (
            {"p0": (Role.PREFILL, True), "d0": (Role.DECODE, False), "d1": (Role.DECODE, True)},
            {"p0", "d1"},
        ),
    ],
)
def test_only_serving_instances_get_work(instances: dict[str, tuple[Role, bool]], busy: set[str]) -> None:
    live = fleet()
    for key, (role, serving) in instances.items():
        live.add(key, role, serving)
    live.advance(20.0)
    counted = {
        key
        for key in instances
        if sample(live.metrics_text(key, "m"), "vllm:request_prompt_tokens_count")
        + sample(live.metrics_text(key, "m"), "vllm:request_generation_tokens_count")
        > 0
    }
    assert counted == busy
    assert conserved(live)


def test_least_loaded_routing_spreads_prefill_work() -> None:
    live = fleet(rate=6.0, lengths=RAG)
    for key in ("p0", "p1", "p2"):
        live.add(key, Role.PREFILL)
    live.add("d0", Role.DECODE)
    live.advance(60.0)
    counts = [
        sample(live.metrics_text(k, "m"), "vllm:request_prompt_tokens_count") for k in ("p0", "p1", "p2")
    ]
    assert min(counts) > 0.2 * sum(counts)


def test_the_router_holds_requests_until_an_instance_serves() -> None:
    live = fleet()
    live.add("p0", Role.PREFILL, serving=False)
    live.add("d0", Role.DECODE)
    live.advance(10.0)
    held = live.stats()
    assert held.arrived > 0 and held.waiting_for_instance == held.arrived and held.completed == 0
    live.set_serving("p0", True)
    live.advance(30.0)
    stats = live.stats()
    assert stats.completed > held.arrived * 0.5 and stats.waiting_for_instance == 0
    assert conserved(live)


def test_a_non_serving_instance_finishes_what_it_holds() -> None:
    """The operator's drain: serving=false, then in-flight requests go to 0 without new ones."""
    live = fleet(rate=6.0)
    live.add("p0", Role.PREFILL)
    live.add("d0", Role.DECODE)
    live.advance(20.0)
    assert live.stats().in_system > 0
    live.add("p1", Role.PREFILL)
    live.add("d1", Role.DECODE)
    live.set_serving("p0", False)
    live.set_serving("d0", False)
    live.advance(60.0)
    for key in ("p0", "d0"):
        text = live.metrics_text(key, "m")
        assert sample(text, "vllm:num_requests_running") + sample(text, "vllm:num_requests_waiting") == 0
    assert conserved(live) and live.stats().recomputed == 0


# ---- role switches and removals ----------------------------------------------------------------------------


@pytest.mark.parametrize("drained", [True, False])
def test_a_switch_keeps_counters_and_re_routes_work_in_flight(drained: bool) -> None:
    live = fleet(rate=6.0)
    for key, role in (("p0", Role.PREFILL), ("d0", Role.DECODE), ("d1", Role.DECODE)):
        live.add(key, role)
    live.advance(30.0)
    if drained:
        live.set_serving("d1", False)
        live.advance(60.0)
    before = live.metrics_text("d1", "m")
    in_flight = sample(before, "vllm:num_requests_running") + sample(before, "vllm:num_requests_waiting")
    assert (in_flight == 0) is drained
    live.set_role("d1", Role.PREFILL)
    live.set_serving("d1", True)
    after = live.metrics_text("d1", "m")
    assert live.roles()["d1"] is Role.PREFILL
    assert live.stats().recomputed == in_flight
    generated = "vllm:request_generation_tokens_count"
    assert sample(after, generated) == sample(before, generated) > 0  # no restart: counters stay
    live.advance(30.0)
    assert sample(live.metrics_text("d1", "m"), "vllm:request_prompt_tokens_count") > 0  # now prefills
    assert conserved(live)


def test_removing_a_busy_instance_loses_no_request() -> None:
    live = fleet(rate=6.0)
    for key, role in (("p0", Role.PREFILL), ("p1", Role.PREFILL), ("d0", Role.DECODE), ("d1", Role.DECODE)):
        live.add(key, role)
    live.advance(30.0)
    live.remove("d0")
    live.remove("p0")
    assert sorted(live.roles()) == ["d1", "p1"]
    live.advance(5.0)
    assert conserved(live)


@pytest.mark.parametrize(
    ("seed", "dt", "lengths"),
    [
        (1, 0.05, CHAT),
        (2, 0.5, RAG),
        (3, 1.0, MixDrift(CHAT, RAG, Step(0.0, 1.0, 20.0))),
        (4, 7.0, MixDrift(CHAT, RAG, Step(1.0, 0.0, 15.0))),
    ],
)
def test_time_advances_conserve_requests(seed: int, dt: float, lengths: UniformLengths | MixDrift) -> None:
    live = fleet(rate=5.0, seed=seed, lengths=lengths)
    live.add("p0", Role.PREFILL)
    live.add("d0", Role.DECODE)
    for tick in range(int(60 / dt)):
        live.advance(dt)
        if tick == int(20 / dt):
            live.add("p1", Role.PREFILL)
            live.set_role("d0", Role.PREFILL)  # briefly no decode at all: the router holds the requests
        if tick == int(30 / dt):
            live.add("d1", Role.DECODE)
        assert conserved(live)
    stats = live.stats()
    assert stats.arrived > 200 and stats.completed > 0
    assert 0 <= stats.within_slo <= stats.completed
    assert stats.now_s == pytest.approx(int(60 / dt) * dt)


def test_the_same_seed_gives_the_same_fleet() -> None:
    runs = []
    for _ in range(2):
        live = fleet(seed=9)
        live.add("p0", Role.PREFILL)
        live.add("d0", Role.DECODE)
        live.advance(20.0)
        runs.append((live.stats(), live.metrics_text("d0", "m")))
    assert runs[0] == runs[1]


@pytest.mark.parametrize(
    ("action", "message"),
    [
        (lambda f: f.add("p0", Role.PREFILL), "instance = 'p0': already in the fleet"),
        (lambda f: f.remove("x"), "instance = 'x': is not in the fleet"),
        (lambda f: f.set_role("x", Role.DECODE), "instance = 'x': is not in the fleet"),
        (lambda f: f.advance(-1.0), "dt = -1.0: must be a finite number of seconds >= 0"),
        (lambda f: f.advance(float("nan")), "dt = nan"),
    ],
)
def test_bad_operations_name_field_value_and_rule(action: object, message: str) -> None:
    live = fleet()
    live.add("p0", Role.PREFILL)
    with pytest.raises(LiveFleetError, match=re.escape(message)):
        action(live)  # type: ignore[operator]


def test_settings_without_room_for_kv_are_rejected() -> None:
    tiny = dataclasses.replace(SMALL_GPU, hbm_bytes=10e9)
    with pytest.raises(LiveFleetError, match=re.escape("gpu.hbm_bytes = 10000000000.0: 1 GPU")):
        LiveFleet(dataclasses.replace(HARDWARE, gpu=tiny), LiveTraffic(Constant(1.0), CHAT), SLO)
    with pytest.raises(LiveFleetError, match=r"hit_fraction = 1.0: must be in \[0, 1\)"):
        LiveTraffic(Constant(1.0), CHAT, hit_fraction=1.0)
