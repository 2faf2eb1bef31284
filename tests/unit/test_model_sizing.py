"""xPyD sizing: the seeds' formulas by hand, their published numbers, and the beyond-the-seeds options."""

from __future__ import annotations

import math

import numpy as np
import pytest

from xpyd_controller.model.presets import DATASHEET_GPUS, LINK_PRESETS, MODEL_PRESETS
from xpyd_controller.model.roofline import decode_step_seconds, prefill_seconds
from xpyd_controller.model.sizing import (
    JSON_KEYS,
    DecodeMeasurement,
    PoolConfig,
    Slo,
    Workload,
    dp_ratio,
    normal_quantile,
    prefill_ttft_quantile,
    size_pools,
    std_from_quantile,
)
from xpyd_controller.model.specs import GpuSpec, LinkSpec, ModelSpec, SpecError

LLAMA_8B = MODEL_PRESETS["llama-3.1-8b"]
LLAMA_70B = MODEL_PRESETS["llama-3.1-70b"]
H100 = DATASHEET_GPUS["h100-sxm"]  # at the seeds' MFU 0.4 and MBU 1, which the hand numbers below use
H200 = DATASHEET_GPUS["h200"]
IB = LINK_PRESETS["ib-400g"]
LECTURE_SLO = Slo(ttft=2.0, tpot=0.05, transfer_budget=0.2)  # the lecture's 2 s TTFT, 200 ms budget

ARTICLE_MODEL = ModelSpec(params=8e9, layers=32, kv_heads=8, head_dim=128)
ARTICLE_GPU = GpuSpec(peak_flops=990e12, hbm_bandwidth=3.35e12, hbm_bytes=80e9, mfu=0.4)


def plan_8b(**workload: float) -> dict[str, object]:
    return size_pools(
        LLAMA_8B, H100, IB, Workload(**{"rate": 10, "isl": 4096, "osl": 256, **workload}), LECTURE_SLO
    ).as_dict()


def test_article_decode_prefill_ratio() -> None:
    # (280 × 9.8 ms / 30) / 172 ms = 0.53: E[N_out] = 280 (U[80, 480]), c = 30, E[t_p] at 4250 tokens.
    step = decode_step_seconds(ARTICLE_MODEL, ARTICLE_GPU, 30, 0, step_overhead=5e-3)
    ratio = dp_ratio(280, step, 30, prefill_seconds(ARTICLE_MODEL, ARTICLE_GPU, 4250))
    assert float(ratio) == pytest.approx(0.53, abs=0.005)


def test_json_keys_fixed_by_design_are_present() -> None:
    assert set(JSON_KEYS) <= set(plan_8b())


def test_prefill_instances_follow_the_lecture_formula() -> None:
    plan = plan_8b(rate=7.0, hit_rate=0.25)
    crossover = 2 * LLAMA_8B.params / (4 * 4096 * 32)
    supply = H100.effective_flops / (2 * LLAMA_8B.params * (1 + 4096 / crossover))
    assert plan["prefill_instances"] == math.ceil(7.0 * 0.75 * 4096 / supply)
    assert plan["prefill_binding"] == "throughput"


def test_caching_is_capacity_45_vs_444() -> None:
    # The lecture's "45 vs 444 GPUs" at a 90 % hit rate, reconstructed: pick the rate whose cache-free
    # prefill load is 443.5 busy GPUs; a 0.9 hit rate leaves 44.35 → 45.
    mean_service = float(prefill_seconds(LLAMA_8B, H100, 4096))
    rate = 443.5 / mean_service
    assert plan_8b(rate=rate)["prefill_instances"] == 444
    assert plan_8b(rate=rate, hit_rate=0.9)["prefill_instances"] == 45


def test_decode_batch_cap_by_hand() -> None:
    plan = plan_8b(rate=10.0)
    kv = 128 * 1024
    context = 4096 + 256 / 2
    weights = LLAMA_8B.params * 2
    kv_bound = math.floor((80e9 - weights) / (kv * context))
    tpot_bound = math.floor((0.05 - weights / 3.35e12) * 3.35e12 / (kv * context))
    assert plan["decode_kv_capacity_cap"] == kv_bound
    assert plan["decode_tpot_cap"] == tpot_bound
    assert plan["decode_batch_cap"] == min(kv_bound, tpot_bound)
    assert plan["decode_batch_bound"] == ("kv_capacity" if kv_bound <= tpot_bound else "tpot_bandwidth")
    cap = min(kv_bound, tpot_bound)
    # Little's law at full batch: y·B_cap ≥ λ(TTFT + L_out·t_step(B_cap)), not the TPOT SLO.
    step_at_cap = weights / 3.35e12 + cap * context * kv / 3.35e12
    assert plan["decode_instances"] == math.ceil(10.0 * (2.0 + 256 * step_at_cap) / cap)
    # The predicted step is the operating point: y·B = λ(TTFT + L_out·t_step(B)).
    step = float(plan["decode_step_seconds"])  # type: ignore[arg-type]
    batch = (step - weights / 3.35e12) * 3.35e12 / (context * kv)
    assert batch * plan["decode_instances"] == pytest.approx(10.0 * (2.0 + 256 * step))
    assert plan["concurrency"] == pytest.approx(10.0 * (2.0 + 256 * step))
    assert step < step_at_cap < 0.05


@pytest.mark.parametrize(
    ("gpu", "tpot", "isl", "bound"),
    [
        (H100, 0.05, 4096, "kv_capacity"),  # 80 GB fills up before 50 ms of reads
        (H200, 0.012, 4096, "tpot_bandwidth"),  # 141 GB, but only 12 ms per step
        (DATASHEET_GPUS["b200"], 0.02, 64, "tpot_compute"),  # tiny contexts: 2·P·B FLOPs bind first
    ],
)
def test_binding_decode_bound(gpu: GpuSpec, tpot: float, isl: int, bound: str) -> None:
    plan = size_pools(
        LLAMA_8B, gpu, IB, Workload(rate=10, isl=isl, osl=16), Slo(ttft=2.0, tpot=tpot)
    ).as_dict()
    assert plan["decode_batch_bound"] == bound
    assert plan["decode_step_seconds"] <= tpot  # type: ignore[operator]


@pytest.mark.parametrize(
    ("model", "tokens", "feasible"),
    [
        (LLAMA_70B, 8 * 1024, True),  # lecture: GQA-70B crosses the (50 GB/s, 200 ms) line
        (LLAMA_70B, 32 * 1024, False),  # between 8K and 32K
        (MODEL_PRESETS["deepseek-v3"], 128 * 1024, True),  # MLA survives to 128K
        (MODEL_PRESETS["deepseek-v3"], 1024 * 1024, False),  # at 1M even MLA needs NVLink
    ],
)
def test_lecture_transfer_feasible_region(model: ModelSpec, tokens: int, feasible: bool) -> None:
    """The lecture's region is for the serialized transfer: plan without layer-wise pipelining."""
    plan = size_pools(
        model,
        H100,
        IB,
        Workload(rate=1, isl=tokens, osl=128),
        Slo(ttft=30, tpot=0.1, transfer_budget=0.2),
        pools=PoolConfig(layerwise_transfer=False),
    )
    row = plan.as_dict()
    assert row["transfer_feasible"] is feasible
    assert (model.kv_bytes_per_token <= row["kv_max_bytes_per_token"]) is feasible  # type: ignore[operator]


def test_transfer_budget_is_judged_on_the_exposed_time_when_layers_overlap() -> None:
    """70B at 128K over IB: 859 ms serialized, 10.7 ms exposed; bandwidth stays a hard limit."""
    workload = Workload(rate=1, isl=128 * 1024, osl=256)
    slo = Slo(ttft=60, tpot=0.05, transfer_budget=0.2)
    overlapped = size_pools(LLAMA_70B, H100, IB, workload, slo, pools=PoolConfig(8, 8)).as_dict()
    assert overlapped["overlap_feasible"] is True
    assert overlapped["transfer_seconds"] == pytest.approx(0.859, rel=0.01)
    assert overlapped["exposed_transfer_seconds"] == pytest.approx(0.859 / 80, rel=0.01)
    assert overlapped["transfer_feasible"] is True
    serialized = size_pools(
        LLAMA_70B, H100, IB, workload, slo, pools=PoolConfig(8, 8, layerwise_transfer=False)
    ).as_dict()
    assert serialized["exposed_transfer_seconds"] == serialized["transfer_seconds"]
    assert serialized["transfer_feasible"] is False
    # Latency can be hidden, bandwidth cannot: a link that carries less than λ·L·kv stays infeasible.
    slow = Slo(ttft=1000, tpot=0.05, transfer_budget=900)  # any latency is within budget here
    thin = size_pools(LLAMA_70B, H100, LinkSpec(bandwidth=1e8), workload, slow, pools=PoolConfig(8, 8))
    assert bool(thin.transfer_feasible)
    assert not bool(thin.link_feasible) and not bool(thin.feasible)


def test_lecture_128k_70b_link_demand() -> None:
    # "At 128K context, one GQA-70B request per second already demands ≈ 43 GB/s" (decimal GB).
    plan = size_pools(LLAMA_70B, H100, IB, Workload(rate=1, isl=128 * 1024, osl=128), Slo(ttft=300, tpot=0.1))
    assert plan.as_dict()["link_demand_bytes_per_second"] == pytest.approx(43e9, rel=0.01)


def test_lecture_exposed_transfer_after_pipelining() -> None:
    # 8B at 32K over PCIe: 67 ms serialized, overlap holds, exposed ≈ 67/32 ≈ 2 ms.
    plan = size_pools(
        LLAMA_8B, H100, LINK_PRESETS["pcie5"], Workload(rate=1, isl=32768, osl=128), Slo(ttft=30, tpot=0.1)
    )
    row = plan.as_dict()
    assert row["overlap_feasible"] is True
    assert row["transfer_seconds"] == pytest.approx(0.067, rel=0.01)
    assert row["exposed_transfer_seconds"] == pytest.approx(0.067 / 32, rel=0.01)


def test_exposed_transfer_when_the_link_is_the_bottleneck() -> None:
    slow = LinkSpec(bandwidth=1e9)
    plan = size_pools(
        LLAMA_8B, H100, slow, Workload(rate=1, isl=8192, osl=128), Slo(ttft=30, tpot=0.1)
    ).as_dict()
    assert plan["overlap_feasible"] is False
    wire = 8192 * 128 * 1024 / 1e9
    expected = wire - 31 / 32 * float(prefill_seconds(LLAMA_8B, H100, 8192))
    assert plan["exposed_transfer_seconds"] == pytest.approx(expected)


def test_local_prefill_threshold() -> None:
    pools = PoolConfig(prefill_gpus=2, remote_overhead=0.02)
    plan = size_pools(
        LLAMA_8B, H100, IB, Workload(rate=1, isl=1024, osl=128), LECTURE_SLO, pools=pools
    ).as_dict()
    expected = 0.02 / (2 * LLAMA_8B.params / (2 * H100.effective_flops) - 128 * 1024 / 50e9)
    assert plan["local_prefill_threshold_tokens"] == pytest.approx(expected)


def test_no_threshold_when_the_wire_is_slower_than_compute() -> None:
    crawl = LinkSpec(bandwidth=1e6)
    plan = size_pools(
        LLAMA_8B,
        H100,
        crawl,
        Workload(rate=1, isl=1024, osl=128),
        LECTURE_SLO,
        pools=PoolConfig(remote_overhead=0.02),
    )
    assert plan.as_dict()["local_prefill_threshold_tokens"] is None


def test_weights_that_do_not_fit_are_infeasible_not_nan() -> None:
    row = size_pools(LLAMA_70B, H100, IB, Workload(rate=5, isl=4096, osl=256), LECTURE_SLO).as_dict()
    assert row["decode_weights_fit"] is False
    assert row["prefill_weights_fit"] is False
    assert row["decode_instances"] == 0
    assert row["feasible"] is False
    two = size_pools(
        LLAMA_70B, H100, IB, Workload(rate=5, isl=4096, osl=256), LECTURE_SLO, pools=PoolConfig(2, 2)
    ).as_dict()
    assert two["decode_weights_fit"] is True
    assert two["decode_instances"] > 0  # type: ignore[operator]


def test_zero_traffic_is_zero_demand() -> None:
    row = plan_8b(rate=0.0)
    assert row["prefill_instances"] == 0
    assert row["decode_instances"] == 0
    assert row["ttft_feasible"] is True


def test_ttft_quantile_adds_instances_where_throughput_sizing_saturates() -> None:
    slo = Slo(ttft=1.0, tpot=0.05, ttft_quantile=0.9)
    rates = np.linspace(1, 60, 40)
    mean = size_pools(LLAMA_8B, H100, IB, Workload(rate=rates, isl=4096, osl=256), Slo(ttft=1.0, tpot=0.05))
    queued = size_pools(LLAMA_8B, H100, IB, Workload(rate=rates, isl=4096, osl=256), slo)
    assert np.all(queued.prefill_instances >= mean.prefill_instances)
    assert np.any(queued.prefill_instances > mean.prefill_instances)
    assert np.all(queued.predicted_ttft_seconds <= 1.0)
    assert np.any(mean.predicted_ttft_seconds > 1.0)  # the seeds' pool meets throughput, misses the SLO
    assert set(np.unique(queued.prefill_binding)) == {"throughput", "ttft_quantile"}


def test_context_quantile_shrinks_the_batch_cap() -> None:
    workload = Workload(rate=10, isl=4096, osl=256, isl_std=2000, osl_std=120)
    mean = size_pools(LLAMA_8B, H100, IB, workload, LECTURE_SLO).as_dict()
    tail = size_pools(LLAMA_8B, H100, IB, workload, Slo(ttft=2.0, tpot=0.05, context_quantile=0.99)).as_dict()
    assert tail["decode_batch_cap"] < mean["decode_batch_cap"]  # type: ignore[operator]


def test_length_spread_makes_slots_longer() -> None:
    # Long outputs stay in the batch longer (length-biased): E = L_in + E[L_out²]/(2·E[L_out]).
    row = size_pools(
        LLAMA_8B, H100, IB, Workload(rate=1, isl=1000, osl=200, osl_std=100), LECTURE_SLO
    ).as_dict()
    assert row["decode_context_tokens"] == pytest.approx(1000 + (200**2 + 100**2) / 400)


def test_vectorised_sweep_matches_scalar_calls() -> None:
    rates = np.array([0.5, 3.0, 17.0])
    sweep = size_pools(LLAMA_8B, H100, IB, Workload(rate=rates, isl=4096, osl=256), LECTURE_SLO)
    for i, rate in enumerate(rates):
        assert sweep.as_dict(i) == plan_8b(rate=float(rate))


def test_from_samples_and_std_from_quantile() -> None:
    workload = Workload.from_samples(2.0, np.array([100.0, 300.0]), np.array([10.0, 30.0]))
    assert (workload.isl, workload.isl_std, workload.osl, workload.osl_std) == (200.0, 100.0, 20.0, 10.0)
    assert std_from_quantile(100.0, 100.0 + 1.2815515655446004, 0.9) == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("build", "field", "value"),
    [
        (lambda: Workload(rate=-1, isl=1, osl=1), "rate", -1.0),
        (lambda: Workload(rate=float("nan"), isl=1, osl=1), "rate", None),
        (lambda: Workload(rate=1, isl=np.array([10.0, 0.0]), osl=1), "isl", 0.0),
        (lambda: Workload(rate=1, isl=1, osl=1, hit_rate=1.0), "hit_rate", 1.0),
        (lambda: Slo(ttft=0, tpot=0.05), "ttft", 0.0),
        (lambda: Slo(ttft=1, tpot=0.05, ttft_quantile=1.0), "ttft_quantile", 1.0),
        (lambda: PoolConfig(prefill_gpus=1.5), "prefill_gpus", 1.5),
        (lambda: PoolConfig(step_overhead=-0.001), "step_overhead", -0.001),
    ],
)
def test_invalid_inputs_name_field_value_and_rule(build: object, field: str, value: float | None) -> None:
    with pytest.raises(SpecError) as caught:
        build()  # type: ignore[operator]
    assert caught.value.field == field
    if value is not None:
        assert caught.value.value == value
    assert "must" in caught.value.rule


def test_length_moments_match_monte_carlo() -> None:
    # The closed forms behind the queueing and context-quantile options, against sampling.
    rng = np.random.default_rng(7)
    isl, isl_std, osl, osl_std = 6000.0, 1500.0, 300.0, 90.0
    prompts = rng.normal(isl, isl_std, 2_000_000)
    outputs = np.clip(rng.normal(osl, osl_std, 2_000_000), 1, None)  # 3.3σ: a handful clipped
    plan = size_pools(
        LLAMA_70B, H100, IB, Workload(rate=1, isl=isl, osl=osl, isl_std=isl_std, osl_std=osl_std), LECTURE_SLO
    )
    crossover = LLAMA_70B.attention_crossover_tokens
    assert crossover is not None
    work = prompts + prompts**2 / crossover
    per_token = 2 * LLAMA_70B.params / H100.effective_flops
    assert float(plan.prefill_load) == pytest.approx(per_token * work.mean(), rel=2e-3)
    # A batch slot samples requests in proportion to their output length, at a uniform point of it.
    weights = outputs / outputs.sum()
    picks = rng.choice(outputs.size, 2_000_000, p=weights)
    slots = prompts[rng.permutation(prompts.size)] + rng.uniform(0, 1, picks.size) * outputs[picks]
    assert float(plan.decode_context_tokens) == pytest.approx(slots.mean(), rel=2e-3)
    # The context quantile's spread: 99 % of a one-slot batch's KV must fit within mean + z·std.
    one_slot = size_pools(
        LLAMA_70B,
        H100,
        IB,
        Workload(rate=1, isl=isl, osl=osl, isl_std=isl_std, osl_std=osl_std),
        Slo(ttft=2.0, tpot=0.05, context_quantile=0.99),
        pools=PoolConfig(decode_gpus=2),
    )
    assert int(one_slot.decode_batch_cap) < int(
        size_pools(
            LLAMA_70B,
            H100,
            IB,
            Workload(rate=1, isl=isl, osl=osl),
            LECTURE_SLO,
            pools=PoolConfig(decode_gpus=2),
        ).decode_batch_cap
    )
    spread = np.sqrt(slots.var())
    z = 2.3263478740408408
    token_budget = (2 * 80e9 - LLAMA_70B.weight_footprint_bytes) / LLAMA_70B.kv_bytes_per_token
    cap = int(one_slot.decode_batch_cap)
    assert cap * slots.mean() + z * spread * np.sqrt(cap) <= token_budget * (1 + 1e-3)
    assert (cap + 1) * slots.mean() + z * spread * np.sqrt(cap + 1) > token_budget * (1 - 1e-3)


def test_service_spread_feeds_the_queue() -> None:
    steady = Workload(rate=3, isl=4096, osl=256)
    spread = Workload(rate=3, isl=4096, osl=256, isl_std=3000)
    slo = Slo(ttft=4.0, tpot=0.05)
    assert float(size_pools(LLAMA_8B, H100, IB, spread, slo).predicted_ttft_seconds) > float(
        size_pools(LLAMA_8B, H100, IB, steady, slo).predicted_ttft_seconds
    )


def test_context_quantile_covers_poisson_swings_of_sessions() -> None:
    # The simulator's finding (docs/BENCHMARKS.md, model vs simulator): at 4 req/s of 6000/600-token
    # requests and a 30 ms TPOT, one decode instance holds the mean but not the swings of a Poisson
    # number of sessions. With a 0.99 context quantile the pool covers the compound-Poisson tokens.
    workload = Workload(rate=4, isl=6000, osl=600, isl_std=1800, osl_std=180)
    pools = PoolConfig(step_overhead=0.005)
    mean = size_pools(LLAMA_8B, H100, IB, workload, Slo(ttft=0.6, tpot=0.03), pools=pools)
    tail = size_pools(
        LLAMA_8B, H100, IB, workload, Slo(ttft=0.6, tpot=0.03, context_quantile=0.99), pools=pools
    )
    assert int(mean.decode_instances) == 1
    assert int(tail.decode_instances) == 2
    assert (mean.as_dict()["decode_binding"], tail.as_dict()["decode_binding"]) == (
        "mean_concurrency",
        "context_quantile",
    )
    kv, weights = LLAMA_8B.kv_bytes_per_token, LLAMA_8B.weight_footprint_bytes
    token_budget = min((80e9 - weights) / kv, ((0.03 - 0.005) * 3.35e12 - weights) / kv)
    step_at_cap = (
        0.005 + (weights + int(tail.decode_batch_cap) * float(tail.decode_context_tokens) * kv) / 3.35e12
    )
    sessions = 4 * (0.6 + 600 * step_at_cap)
    m = float(tail.decode_context_tokens)
    s = float(np.sqrt(1800**2 + (600**2 + 3 * 180**2) / 3 - ((600**2 + 180**2) / 1200) ** 2))
    tokens_q = sessions * m + 2.3263478740408408 * np.sqrt(sessions * (m * m + s * s))
    assert token_budget < tokens_q <= 2 * token_budget


@pytest.mark.parametrize("fraction", [1.0, 0.9, 0.5])
def test_kv_memory_fraction_shrinks_the_kv_capacity_cap(fraction: float) -> None:
    # B_kv = ⌊(f·G_D·HBM − W) / (kv·L̄)⌋ with L̄ = 4096 + 256/2; TPOT 1 s so KV capacity binds.
    plan = size_pools(
        LLAMA_8B,
        H100,
        IB,
        Workload(rate=10, isl=4096, osl=256),
        Slo(ttft=2.0, tpot=1.0),
        pools=PoolConfig(kv_memory_fraction=fraction),
    ).as_dict()
    kv, weights = LLAMA_8B.kv_bytes_per_token, LLAMA_8B.weight_footprint_bytes
    assert plan["decode_kv_capacity_cap"] == math.floor((fraction * 80e9 - weights) / (kv * (4096 + 128)))
    assert plan["decode_batch_bound"] == "kv_capacity"


@pytest.mark.parametrize("fraction", [0.0, 1.5, float("nan")])
def test_kv_memory_fraction_outside_zero_one_is_rejected(fraction: float) -> None:
    with pytest.raises(SpecError, match="kv_memory_fraction"):
        PoolConfig(kv_memory_fraction=fraction)


@pytest.mark.parametrize(
    ("rate", "mean_decode", "benchmark_decode"),
    [(4, 1, 2), (12, 3, 4)],
)
def test_simulator_consistent_inputs_size_long_context_decode(
    rate: float, mean_decode: int, benchmark_decode: int
) -> None:
    # benchmarks/model_vs_sim.py: 6000/600-token requests (uniform ±50 %), 30 ms TPOT, 5 ms step
    # overhead, the simulator's 90 % KV memory fraction. Sized for the mean (the seeds) the decode
    # pool runs at its KV cap and the simulator loses 6–24 % of goodput; sized for the same 99 %
    # quantile as TTFT, it matches the simulator's cheapest 99 %-goodput split (4:2, 8:4).
    spread = 1 / 12**0.5
    workload = Workload(rate=rate, isl=6000, osl=600, isl_std=6000 * spread, osl_std=600 * spread)
    pools = PoolConfig(step_overhead=0.005, kv_memory_fraction=0.9)

    def decode(context_quantile: float | None) -> int:
        slo = Slo(ttft=0.6, tpot=0.03, ttft_quantile=0.99, context_quantile=context_quantile)
        return int(size_pools(LLAMA_8B, H100, IB, workload, slo, pools=pools).decode_instances)

    assert (decode(None), decode(0.99)) == (mean_decode, benchmark_decode)


def test_prefill_first_flow_holds_decode_kv_only_for_the_pull_and_the_decode() -> None:
    """Prefill-first (vLLM's router): sessions last T_xfer + L_out·t_step; decode-first holds the TTFT."""
    workload = Workload(rate=12, isl=6000, osl=150)
    slo = Slo(ttft=2.0, tpot=0.05)
    flows = {
        flow: size_pools(LLAMA_8B, H100, IB, workload, slo, pools=PoolConfig(request_flow=flow))
        for flow in ("decode_first", "prefill_first")
    }
    prefill_first, decode_first = flows["prefill_first"], flows["decode_first"]
    step, pull = float(prefill_first.decode_step_seconds), float(prefill_first.transfer_seconds)
    assert float(prefill_first.concurrency) == pytest.approx(12 * (pull + 150 * step))
    step_df = float(decode_first.decode_step_seconds)
    assert float(decode_first.concurrency) == pytest.approx(12 * (2.0 + 150 * step_df))
    # A long-prompt, short-output mix: decode-first counts 24 sessions of pure waiting.
    assert float(decode_first.concurrency) - float(prefill_first.concurrency) > 24
    assert int(prefill_first.decode_instances) <= int(decode_first.decode_instances)
    assert prefill_first.request_flow == "prefill_first"
    assert prefill_first.as_dict()["request_flow"] == "prefill_first"
    # Prefill is untouched by the flow.
    assert int(prefill_first.prefill_instances) == int(decode_first.prefill_instances)


def test_request_flow_is_validated() -> None:
    with pytest.raises(SpecError) as error:
        PoolConfig(request_flow="sideways")  # type: ignore[arg-type]
    assert error.value.field == "request_flow"
    assert "prefill_first" in error.value.rule


# A KV-bound pool (the e2e demo's small GPU), prefill-first: what the live pool measures sizes decode
# when it shows the roofline's session too short, never when it shows it too long.
DEMO_GPU = GpuSpec(peak_flops=3e14, hbm_bandwidth=1e12, hbm_bytes=20e9, mfu=0.4)
DEMO_WORKLOAD = Workload(rate=4, isl=500, osl=1000)
DEMO_SLO = Slo(ttft=2.0, tpot=0.04)
PREFILL_FIRST = PoolConfig(request_flow="prefill_first")


def demo_plan(measured: DecodeMeasurement | None) -> dict[str, object]:
    return size_pools(
        LLAMA_8B, DEMO_GPU, IB, DEMO_WORKLOAD, DEMO_SLO, pools=PREFILL_FIRST, measured=measured
    ).as_dict()


@pytest.mark.parametrize(
    ("measured", "source"),
    [
        (None, "predicted"),
        (DecodeMeasurement(), "predicted"),
        (DecodeMeasurement(step_seconds=0.001), "predicted"),  # a faster step never shortens a session
        (DecodeMeasurement(sessions=3), "predicted"),  # nor do fewer requests than predicted
        (DecodeMeasurement(step_seconds=0.0235), "measured_tpot"),  # the demo's measured TPOT
        (DecodeMeasurement(sessions=200), "measured_sessions"),  # requests running + waiting now
        (DecodeMeasurement(step_seconds=0.0235, sessions=200), "measured_sessions"),
    ],
)
def test_measured_decode_sessions_replace_a_prediction_that_is_too_short(
    measured: DecodeMeasurement | None, source: str
) -> None:
    predicted = demo_plan(None)
    plan = demo_plan(measured)
    assert plan["decode_session_source"] == source
    assert plan["decode_batch_bound"] == "kv_capacity"
    cap = int(plan["decode_batch_cap"])  # type: ignore[call-overload]
    pull = float(plan["transfer_seconds"])  # type: ignore[arg-type]
    session = float(plan["decode_session_seconds"])  # type: ignore[arg-type]
    if source == "predicted":
        assert plan["decode_instances"] == predicted["decode_instances"]
        assert session == predicted["decode_session_seconds"]
    else:
        assert session > float(predicted["decode_session_seconds"])  # type: ignore[arg-type]
    assert measured is None or measured.step_seconds is None or session >= pull + 1000 * measured.step_seconds
    if measured is not None and measured.sessions is not None and source == "measured_sessions":
        assert session == pytest.approx(measured.sessions / 4)  # Little's law: T = C / λ
    assert plan["decode_instances"] == math.ceil(4 * session / cap)  # y = ⌈λ·T_sess / B_cap⌉


def test_measured_tpot_sizes_the_demo_pool_the_live_fleet_needed() -> None:
    """The demo's fleet measured 23.5 ms per token against the roofline's ~19 ms: decode needs more."""
    predicted, measured = demo_plan(None), demo_plan(DecodeMeasurement(step_seconds=0.0235))
    assert int(measured["decode_instances"]) > int(predicted["decode_instances"])  # type: ignore[call-overload]
    assert float(measured["concurrency"]) > float(predicted["concurrency"])  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("step_seconds", 0.0),
        ("step_seconds", -1.0),
        ("step_seconds", math.inf),
        ("sessions", -1.0),
        ("sessions", math.nan),
    ],
)
def test_decode_measurement_is_validated(field: str, value: float) -> None:
    with pytest.raises(SpecError) as error:
        DecodeMeasurement(**{field: value})
    assert (error.value.field, error.value.value) == (field, value)
    assert "finite" in error.value.rule


def test_measured_sessions_at_zero_traffic_leave_the_prediction() -> None:
    plan = size_pools(
        LLAMA_8B,
        DEMO_GPU,
        IB,
        Workload(rate=0, isl=500, osl=1000),
        DEMO_SLO,
        pools=PREFILL_FIRST,
        measured=DecodeMeasurement(sessions=10),
    )
    assert plan.as_dict()["decode_session_source"] == "predicted"
    assert int(plan.decode_instances) == 0


@pytest.mark.parametrize(
    "p", [1e-300, 1e-12, 0.001, 0.02425, 0.1, 0.5, 0.9, 0.975, 0.99, 0.999999, 1 - 1e-12]
)
def test_normal_quantile_matches_the_standard_library(p: float) -> None:
    """The sizing's own Φ⁻¹ (no `statistics` import at start-up) agrees with NormalDist to double precision."""
    from statistics import NormalDist

    expected = NormalDist().inv_cdf(p)
    assert normal_quantile(p) == pytest.approx(expected, rel=1e-14, abs=1e-14)


@pytest.mark.parametrize("p", [0.0, 1.0, -0.5, math.nan])
def test_normal_quantile_rejects_probabilities_outside_the_open_interval(p: float) -> None:
    with pytest.raises(SpecError) as error:
        normal_quantile(p)
    assert error.value.rule == "must be in (0, 1)"


@pytest.mark.parametrize("spread", [0.0, 1500.0])
def test_prefill_ttft_quantile_is_the_sizings_prediction_at_its_own_pool(spread: float) -> None:
    """The TTFT quantile at a given pool is what `size_pools` predicts at the pool it sized, and it
    falls as the pool grows (a policy holds a measured TTFT against it)."""
    model = ModelSpec(params=8e9, layers=32, kv_heads=8, head_dim=128)
    gpu = GpuSpec(peak_flops=990e12, hbm_bandwidth=3.35e12, hbm_bytes=80e9)
    link = LinkSpec(bandwidth=50e9, overhead=2e-3)
    workload = Workload(rate=20.0, isl=3000.0, osl=300.0, isl_std=spread)
    slo = Slo(ttft=1.0, tpot=0.05, ttft_quantile=0.99)
    pools = PoolConfig(step_overhead=5e-3, request_flow="prefill_first")
    plan = size_pools(model, gpu, link, workload, slo, pools=pools)
    sized = int(plan.prefill_instances)
    at = prefill_ttft_quantile(
        model,
        gpu,
        link,
        workload,
        slo,
        instances=np.array([sized, sized + 1, sized + 4]),
        quantile=0.99,
        pools=pools,
    )
    assert at[0] == pytest.approx(float(plan.predicted_ttft_seconds), rel=1e-9)
    assert at[0] <= 1.0
    assert at[0] > at[1] >= at[2] >= float(plan.ttft_floor_seconds) - 1e-12
    below = prefill_ttft_quantile(
        model, gpu, link, workload, slo, instances=sized - 1, quantile=0.99, pools=pools
    )
    assert float(below) > 1.0  # one fewer misses the SLO (or saturates): why the sizing stopped there
