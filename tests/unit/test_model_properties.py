"""Properties of the sizing that must hold for any valid input (hypothesis)."""

from __future__ import annotations

from dataclasses import fields

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from xpyd_controller.model.presets import GPU_PRESETS, LINK_PRESETS, MODEL_PRESETS
from xpyd_controller.model.sizing import Plan, PoolConfig, Slo, Workload, size_pools

# Fields allowed to be +inf: a saturated pool's wait and "remote prefill never wins".
MAY_BE_INFINITE = {"predicted_ttft_seconds", "local_prefill_threshold_tokens"}

scenario = st.fixed_dictionaries(
    {
        "model": st.sampled_from(sorted(MODEL_PRESETS)),
        "gpu": st.sampled_from(sorted(GPU_PRESETS)),
        "link": st.sampled_from(sorted(LINK_PRESETS)),
        "rate": st.floats(0.0, 200.0),
        "isl": st.floats(16.0, 200_000.0),
        "osl": st.floats(1.0, 8_000.0),
        "hit_rate": st.floats(0.0, 0.99),
        "isl_std": st.floats(0.0, 5_000.0),
        "osl_std": st.floats(0.0, 2_000.0),
        "ttft": st.floats(0.05, 60.0),
        "tpot": st.floats(0.005, 0.5),
        "gpus": st.sampled_from([1, 2, 4, 8, 16]),
        "step_overhead": st.floats(0.0, 0.01),
        "ttft_quantile": st.sampled_from([None, 0.9, 0.99]),
        "context_quantile": st.sampled_from([None, 0.9]),
        "kv_memory_fraction": st.sampled_from([1.0, 0.9]),
    }
)


def plan_for(s: dict[str, object], **changes: object) -> Plan:
    s = {**s, **changes}
    return size_pools(
        MODEL_PRESETS[s["model"]],  # type: ignore[index]
        GPU_PRESETS[s["gpu"]],  # type: ignore[index]
        LINK_PRESETS[s["link"]],  # type: ignore[index]
        Workload(
            rate=s["rate"],  # type: ignore[arg-type]
            isl=s["isl"],  # type: ignore[arg-type]
            osl=s["osl"],  # type: ignore[arg-type]
            hit_rate=s["hit_rate"],  # type: ignore[arg-type]
            isl_std=s["isl_std"],  # type: ignore[arg-type]
            osl_std=s["osl_std"],  # type: ignore[arg-type]
        ),
        Slo(
            ttft=s["ttft"],  # type: ignore[arg-type]
            tpot=s["tpot"],  # type: ignore[arg-type]
            ttft_quantile=s["ttft_quantile"],  # type: ignore[arg-type]
            context_quantile=s["context_quantile"],  # type: ignore[arg-type]
        ),
        pools=PoolConfig(
            prefill_gpus=s["gpus"],  # type: ignore[arg-type]
            decode_gpus=s["gpus"],  # type: ignore[arg-type]
            step_overhead=s["step_overhead"],  # type: ignore[arg-type]
            kv_memory_fraction=s["kv_memory_fraction"],  # type: ignore[arg-type]
        ),
    )


@settings(max_examples=150, deadline=None)
@given(scenario, st.floats(1.0, 5.0))
def test_more_rate_never_fewer_instances(s: dict[str, object], factor: float) -> None:
    rates = float(s["rate"]) * np.array([1.0, factor])  # type: ignore[arg-type]
    plan = plan_for(s, rate=rates)
    assert plan.prefill_instances[1] >= plan.prefill_instances[0]
    assert plan.decode_instances[1] >= plan.decode_instances[0]


@settings(max_examples=150, deadline=None)
@given(scenario, st.floats(0.5, 1.0))
def test_less_usable_hbm_never_fewer_decode_instances(s: dict[str, object], share: float) -> None:
    fraction = float(s["kv_memory_fraction"])  # type: ignore[arg-type]
    plan = plan_for(s, kv_memory_fraction=np.array([fraction, fraction * share]))
    assert plan.decode_kv_capacity_cap[1] <= plan.decode_kv_capacity_cap[0]
    if plan.decode_feasible[1]:
        assert plan.decode_instances[1] >= plan.decode_instances[0]


@settings(max_examples=150, deadline=None)
@given(scenario, st.floats(0.0, 0.99))
def test_higher_hit_rate_never_more_prefill(s: dict[str, object], higher: float) -> None:
    low, high = sorted([float(s["hit_rate"]), higher])  # type: ignore[arg-type]
    plan = plan_for(s, hit_rate=np.array([low, high]))
    assert plan.prefill_instances[1] <= plan.prefill_instances[0]


@settings(max_examples=150, deadline=None)
@given(scenario, st.floats(0.1, 1.0))
def test_tighter_tpot_never_larger_batch_cap(s: dict[str, object], tighter: float) -> None:
    tpot = float(s["tpot"])  # type: ignore[arg-type]
    plan = plan_for(s, tpot=np.array([tpot, tpot * tighter]))
    assert plan.decode_batch_cap[1] <= plan.decode_batch_cap[0]


@settings(max_examples=200, deadline=None)
@given(scenario)
def test_outputs_are_finite_numbers(s: dict[str, object]) -> None:
    plan = plan_for(s)
    for spec in fields(plan):
        value = np.asarray(getattr(plan, spec.name))
        if value.dtype.kind != "f":
            continue
        assert not np.isnan(value).any(), spec.name
        if spec.name not in MAY_BE_INFINITE:
            assert np.isfinite(value).all(), spec.name
    assert plan.prefill_instances.min() >= 0
    assert plan.decode_instances.min() >= 0


@settings(max_examples=200, deadline=None)
@given(scenario)
def test_a_buildable_decode_pool_meets_its_tpot(s: dict[str, object]) -> None:
    # y ≥ λ(TTFT + L_out·t(B_cap))/B_cap puts the operating batch at or below the cap, whose step
    # fits the TPOT SLO by construction of the caps.
    plan = plan_for(s)
    buildable = plan.decode_feasible & (plan.decode_instances > 0)
    assert np.all(plan.decode_step_seconds[buildable] <= plan.tpot_slo_seconds[buildable] * (1 + 1e-9))
