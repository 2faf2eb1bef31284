"""The event engine request by request: timings from the roofline, and each realism switch."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np
import pytest

from xpyd_controller.model.roofline import decode_step_seconds, kv_transfer_seconds, prefill_seconds
from xpyd_controller.policy.types import Decision, Limits, Observation
from xpyd_controller.sim.config import Control, Fleet, Realism, SimConfig, SimConfigError
from xpyd_controller.sim.engine import run_events
from xpyd_controller.sim.engine_observe import numpy_mean
from xpyd_controller.sim.runner import simulate
from xpyd_controller.sim.seed import SEED_HARDWARE, SEED_SLO, seed_requests
from xpyd_controller.sim.traces import Trace

HW = SEED_HARDWARE


def trace(
    arrivals: Sequence[float], prompts: Sequence[int], outputs: Sequence[int], hits: Sequence[int] = ()
) -> Trace:
    n = len(arrivals)
    return Trace(
        np.asarray(arrivals, dtype=np.float64),
        np.asarray(prompts, dtype=np.int64),
        np.asarray(outputs, dtype=np.int64),
        np.asarray(hits or [0] * n, dtype=np.int64),
    )


def config(mode: str = "disagg", prefill: int = 1, decode: int = 1, **realism: object) -> SimConfig:
    return SimConfig(HW, Fleet(mode, prefill, decode), Realism(**realism), SEED_SLO)  # type: ignore[arg-type]


def prefill_s(tokens: float) -> float:
    return float(prefill_seconds(HW.model, HW.gpu, tokens))


def step_s(batch: int) -> float:
    return float(decode_step_seconds(HW.model, HW.gpu, batch, 0, step_overhead=HW.step_overhead_s))


def xfer_s(tokens: float) -> float:
    return float(kv_transfer_seconds(HW.model, HW.link, tokens))


def test_one_colocated_request_is_four_chunks_then_steps() -> None:
    raw = run_events(config("colocated", 0, 1), trace([0.0], [4000], [10]))
    assert raw.first_token_s[0] == pytest.approx(prefill_s(4000) + step_s(1))
    assert raw.finish_s[0] == pytest.approx(prefill_s(4000) + 10 * step_s(1))
    assert raw.max_gap_s[0] == pytest.approx(step_s(1))


def test_one_disaggregated_request_pays_prefill_transfer_and_a_step() -> None:
    raw = run_events(config(), trace([1.0], [4000], [5]))
    assert raw.first_token_s[0] - 1.0 == pytest.approx(prefill_s(4000) + xfer_s(4000) + step_s(1))
    assert raw.gpu_seconds == pytest.approx(2 * raw.end_s)


def test_layerwise_transfer_exposes_only_the_tail() -> None:
    monolithic = run_events(config(), trace([0.0], [8000], [2])).first_token_s[0]
    layerwise = run_events(config(layerwise_transfer=True), trace([0.0], [8000], [2])).first_token_s[0]
    wire = xfer_s(8000) - HW.link.overhead
    tail = max(wire / HW.model.layers + HW.link.overhead, xfer_s(8000) - prefill_s(8000))
    assert layerwise == pytest.approx(prefill_s(8000) + tail + step_s(1))
    assert layerwise < monolithic


def test_shared_link_makes_concurrent_transfers_wait_for_each_other() -> None:
    requests = trace([0.0, 0.0], [4000, 4000], [2, 2])
    alone = run_events(config(prefill=2), requests).first_token_s
    shared = run_events(config(prefill=2, shared_link_bandwidth=HW.link.bandwidth), requests).first_token_s
    wire = xfer_s(4000) - HW.link.overhead
    assert max(shared) - max(alone) == pytest.approx(wire, rel=1e-6)


def test_prefix_hits_skip_prefill_compute() -> None:
    raw = run_events(config(), trace([0.0], [4000], [2], hits=[3000]))
    assert raw.first_token_s[0] == pytest.approx(prefill_s(1000) + xfer_s(4000) + step_s(1))
    ignored = run_events(config(prefix_cache=False), trace([0.0], [4000], [2], hits=[3000]))
    assert ignored.first_token_s[0] == pytest.approx(prefill_s(4000) + xfer_s(4000) + step_s(1))


def test_short_prompts_prefill_locally_on_decode() -> None:
    requests = trace([0.0, 0.0], [300, 3000], [2, 2])
    raw = run_events(config(local_prefill_threshold=512), requests)
    assert raw.first_token_s[0] == pytest.approx(prefill_s(300) + step_s(1))  # no transfer
    assert raw.first_token_s[1] >= prefill_s(3000) + xfer_s(3000)


def test_kv_capacity_holds_admission_until_a_request_leaves() -> None:
    # Room for one 2000+100-token request at a time: the second waits for the first to finish.
    hbm_for_weights = HW.model.weight_footprint_bytes + 2500 * HW.model.kv_bytes_per_token
    small = dataclasses.replace(HW, gpu=dataclasses.replace(HW.gpu, hbm_bytes=hbm_for_weights))
    cfg = dataclasses.replace(config(prefill=2, kv_capacity=True, kv_memory_fraction=1.0), hardware=small)
    raw = run_events(cfg, trace([0.0, 0.0], [2000, 2000], [100, 100]))
    assert raw.first_token_s[1] > raw.finish_s[0]
    unlimited = run_events(
        dataclasses.replace(cfg, realism=Realism()), trace([0.0, 0.0], [2000, 2000], [100, 100])
    )
    assert unlimited.first_token_s[1] < unlimited.finish_s[0]


class Scripted:
    """Asks for (prefill, decode) from given times on; records what it observed."""

    name = "scripted"

    def __init__(self, plan: Sequence[tuple[float, int, int]]) -> None:
        self.plan = plan
        self.seen: list[Observation] = []

    def decide(self, observation: Observation, limits: Limits) -> Decision:
        self.seen.append(observation)
        prefill = decode = None
        for start, p, d in self.plan:
            if observation.time_s >= start:
                prefill, decode = p, d
        return Decision(prefill=prefill, decode=decode)


def steady(rate: float = 4.0, count: int = 2000) -> Trace:
    return seed_requests(rate, count=count, seed=3, prompt_range=(500, 2000), output_range=(20, 100))


@pytest.mark.parametrize(
    ("role_conversion", "scale_ups", "scale_downs", "conversions"),
    [(True, 0, 0, 1), (False, 1, 1, 0)],
)
def test_opposite_resizes_convert_in_place_only_when_enabled(
    role_conversion: bool, scale_ups: int, scale_downs: int, conversions: int
) -> None:
    cfg = dataclasses.replace(
        config(prefill=2, decode=3, cold_start_s=60.0, conversion_s=5.0),
        control=Control(role_conversion=role_conversion),
    )
    raw = run_events(cfg, steady(), Scripted([(100.0, 3, 2)]))
    assert (raw.scale_ups, raw.scale_downs, raw.conversions) == (scale_ups, scale_downs, conversions)
    assert raw.samples[-1].prefill_ready == 3
    assert raw.samples[-1].decode_ready == 2
    assert all(map(math.isfinite, raw.finish_s))  # draining lost no request


def test_cold_start_is_paid_for_and_delays_readiness() -> None:
    cfg = config(prefill=1, decode=1, cold_start_s=120.0)
    raw = run_events(cfg, steady(count=3000), Scripted([(0.0, 1, 2)]))
    first_ready = next(s.time_s for s in raw.samples if s.decode_ready == 2)
    assert 120.0 <= first_ready <= 120.0 + cfg.control.scrape_interval_s
    assert raw.gpu_seconds == pytest.approx(3 * raw.end_s, rel=1e-9)  # warming counts


@pytest.mark.parametrize("drain_s", [0.0, 30.0])
def test_scale_in_drains_and_stops_paying_after_the_last_request(drain_s: float) -> None:
    cfg = config(prefill=1, decode=2, drain_s=drain_s)
    raw = run_events(cfg, steady(count=3000), Scripted([(300.0, 1, 1)]))
    assert raw.scale_downs == 1
    assert all(map(math.isfinite, raw.finish_s))
    assert 2 * raw.end_s + 300.0 + drain_s <= raw.gpu_seconds < 2 * raw.end_s + 400.0 + drain_s


@pytest.mark.timeout(60)
def test_a_draining_decode_instance_taken_back_mid_batch_finishes_its_requests() -> None:
    # Long answers keep both decode instances busy after the last arrival (~100 s); one drains at
    # 120 s and is taken back at 135 s, mid-batch, with no newcomer to wake it: its requests still
    # finish (none stalls, so the run ends).
    requests = seed_requests(2.0, count=200, seed=5, prompt_range=(500, 1000), output_range=(3000, 4000))
    raw = run_events(config(prefill=1, decode=2), requests, Scripted([(120.0, 1, 1), (135.0, 1, 2)]))
    assert raw.scale_downs == 1
    assert raw.samples[-1].decode_ready == 2
    assert all(map(math.isfinite, raw.finish_s))
    assert raw.end_s == pytest.approx(max(raw.finish_s))


def test_policy_sees_lagged_windowed_arrival_rate() -> None:
    cfg = dataclasses.replace(config(), control=Control(scrape_interval_s=10.0, window_s=60.0, lag_s=20.0))
    policy = Scripted([])
    requests = steady(rate=4.0, count=1600)
    run_events(cfg, requests, policy)
    at_200 = next(o for o in policy.seen if o.time_s == 200.0)
    expected = np.count_nonzero((requests.arrival_s >= 120.0) & (requests.arrival_s < 180.0)) / 60.0
    assert at_200.arrival_rate == pytest.approx(expected)
    assert policy.seen[0].arrival_rate is None  # nothing measured yet: no data, not zero


@pytest.mark.parametrize("mode", ["colocated", "disagg"])
@pytest.mark.parametrize(
    "realism",
    [
        {},
        {"kv_capacity": True, "decode_kv_reads": True},
        {"layerwise_transfer": True, "shared_link_bandwidth": 100e9, "local_prefill_threshold": 1000},
    ],
)
def test_every_request_finishes_in_causal_order(mode: str, realism: dict[str, object]) -> None:
    requests = seed_requests(20.0, count=1500, seed=11)
    prefill = 0 if mode == "colocated" else 3
    raw = run_events(config(mode, prefill, 8 - prefill, **realism), requests)
    assert np.all(raw.first_token_s > requests.arrival_s)
    assert np.all(raw.finish_s >= raw.first_token_s)
    assert raw.end_s == pytest.approx(max(raw.finish_s))


def test_simulate_summarises_goodput_against_the_slo() -> None:
    result = simulate(config("colocated", 0, 8), seed_requests(8.0, count=500))
    assert 0.0 < result.goodput <= 1.0
    assert result.requests == 500
    assert result.gpu_hours == pytest.approx(8 * result.duration_s / 3600)


def test_shrink_while_the_other_pool_is_starting_converts_instead() -> None:
    cfg = dataclasses.replace(
        config(prefill=2, decode=3, cold_start_s=300.0, conversion_s=5.0),
        control=Control(role_conversion=True),
    )
    raw = run_events(cfg, steady(), Scripted([(100.0, 3, 3), (130.0, 3, 2)]))
    assert (raw.scale_ups, raw.conversions) == (1, 1)
    ready = next(s for s in raw.samples if s.prefill_ready == 3)
    assert ready.time_s < 100.0 + 300.0  # the converted instance, not the cold start, arrived
    assert ready.decode_ready == 2


def test_a_request_that_can_never_fit_is_rejected_up_front() -> None:
    tiny = dataclasses.replace(
        HW, gpu=dataclasses.replace(HW.gpu, hbm_bytes=HW.model.weight_footprint_bytes * 1.01)
    )
    cfg = dataclasses.replace(config(kv_capacity=True, kv_memory_fraction=1.0), hardware=tiny)
    with pytest.raises(SimConfigError) as caught:
        run_events(cfg, trace([0.0], [8000], [100]))
    assert caught.value.field == "kv_capacity"


@pytest.mark.parametrize(
    ("mode", "prefill", "decode"), [("disagg", 0, 4), ("disagg", 4, 0), ("colocated", 0, 0)]
)
def test_fleets_that_cannot_serve_are_rejected(mode: str, prefill: int, decode: int) -> None:
    with pytest.raises(SimConfigError) as caught:
        Fleet(mode, prefill, decode)  # type: ignore[arg-type]
    assert caught.value.field == "fleet"


@pytest.mark.parametrize("count", [1, 3, 7, 8, 9, 16, 31, 128, 129, 300, 1000])
def test_the_kv_usage_mean_is_numpys_to_the_bit(count: int) -> None:
    """Policies read the decode KV usage; it was numpy's mean when the benchmark tables were measured."""
    rng = np.random.default_rng(count)
    for _ in range(50):
        values = (rng.random(count) * 10.0 ** rng.integers(-3, 3, count)).tolist()
        assert numpy_mean(values) == float(np.mean(values))
