"""A PDDeployment spec → the policy's context: the request flow follows the engine and the router; the
autoscaling windows and periods become knobs; the GPU's efficiencies come from the spec, a confident
online calibration or the preset."""

from __future__ import annotations

import dataclasses

import pytest
from tests.unit.operator_builders import make_spec

from xpyd_controller.control.setup import calibrated_gpu, policy_context
from xpyd_controller.model.calibration import MIN_SAMPLES, OnlineCalibration
from xpyd_controller.model.presets import GPU_PRESETS


@pytest.mark.parametrize(
    ("engine", "router", "flow"),
    [
        ("vllm", "vllm-router", "prefill_first"),  # vllm-router: prefill, then decode with the KV's address
        ("sglang", "sglang-router", "decode_first"),  # to both at once; decode pre-allocates KV
        ("vllm", "none", "decode_first"),
        ("custom", "vllm-router", "decode_first"),
    ],
)
def test_request_flow_follows_engine_and_router(engine: str, router: str, flow: str) -> None:
    spec = make_spec(
        model={"preset": "llama-3.1-8b"}, engine={"type": engine}, router={"type": router, "image": "r:1"}
    )
    assert policy_context(spec).request_flow == flow


def test_the_autoscaling_windows_and_the_scale_down_period_become_the_policy_knobs() -> None:
    spec = make_spec(
        model={"preset": "llama-3.1-8b"},
        autoscaling={"scaleDownWindowSeconds": 6, "scaleDownPeriodSeconds": 6, "tolerance": 0.2},
    )
    knobs = policy_context(spec).knobs
    assert (knobs["down_window_s"], knobs["down_period_s"], knobs["tolerance"]) == (6, 6, 0.2)
    assert policy_context(make_spec(model={"preset": "llama-3.1-8b"})).knobs["down_period_s"] == 60


def _fit(mfu: float | None, mbu: float | None, samples: int = MIN_SAMPLES) -> OnlineCalibration:
    """A calibration whose readings all agree on these values (or have none)."""
    return OnlineCalibration(
        mfu_samples=() if mfu is None else (mfu,) * samples,
        mbu_samples=() if mbu is None else (mbu,) * samples,
    )


PRESET = GPU_PRESETS["h100-sxm"]


@pytest.mark.parametrize(
    ("hardware", "calibration", "in_use", "expected"),
    [
        ({}, OnlineCalibration(), None, (PRESET.mfu, PRESET.mbu)),  # nothing measured: the preset
        ({}, _fit(0.3, 0.7, samples=MIN_SAMPLES - 1), None, (PRESET.mfu, PRESET.mbu)),  # too few yet
        ({}, _fit(0.3, 0.7), None, (0.3, 0.7)),  # confident: the fit
        ({}, _fit(None, 1.4), None, (PRESET.mfu, PRESET.mbu)),  # above the peak: not physical, not used
        ({"mfu": 0.45, "mbu": 0.9}, _fit(0.3, 0.7), None, (0.45, 0.9)),  # the spec's numbers win
        ({"mbu": 0.9}, _fit(0.3, 0.7), None, (0.3, 0.9)),
        ({}, _fit(0.32, 0.74), (0.3, 0.7), (0.3, 0.7)),  # within 10 % of the fit in use: kept
        ({}, _fit(0.36, 0.7), (0.3, 0.7), (0.36, 0.7)),  # moved more than 10 %: replaced
        ({}, OnlineCalibration(), (0.3, 0.7), (0.3, 0.7)),  # readings gone quiet: the last fit stays
    ],
)
def test_calibrated_gpu_uses_a_confident_fit_unless_the_spec_says(
    hardware: dict[str, float],
    calibration: OnlineCalibration,
    in_use: tuple[float, float] | None,
    expected: tuple[float, float],
) -> None:
    spec = make_spec(model={"preset": "llama-3.1-8b"}, hardware={"gpu": "h100-sxm", **hardware})
    current = None if in_use is None else dataclasses.replace(PRESET, mfu=in_use[0], mbu=in_use[1])
    gpu = calibrated_gpu(spec.hardware, calibration, current)
    assert (gpu.mfu, gpu.mbu) == pytest.approx(expected)
    assert (gpu.peak_flops, gpu.hbm_bandwidth) == (PRESET.peak_flops, PRESET.hbm_bandwidth)
