"""Calibration inverts the roofline: efficiencies in → times → the same efficiencies out."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from xpyd_controller.model.calibration import (
    MAX_SAMPLES,
    MAX_SPREAD,
    MIN_SAMPLES,
    LiveWindow,
    OnlineCalibration,
    mbu_from_decode_step,
    mfu_from_prefill,
)
from xpyd_controller.model.presets import GPU_PRESETS, MODEL_PRESETS
from xpyd_controller.model.roofline import decode_step_seconds, prefill_seconds
from xpyd_controller.model.specs import SpecError


@pytest.mark.parametrize("model", ["llama-3.1-8b", "llama-3.1-70b", "deepseek-v3"])
def test_mfu_round_trip(model: str) -> None:
    gpu = dataclasses.replace(GPU_PRESETS["h200"], mfu=0.37)
    tokens = np.array([512.0, 4096.0, 65536.0])
    measured = prefill_seconds(MODEL_PRESETS[model], gpu, tokens, gpus=4)
    np.testing.assert_allclose(mfu_from_prefill(MODEL_PRESETS[model], gpu, tokens, measured, gpus=4), 0.37)


def test_mbu_round_trip_while_memory_bound() -> None:
    model = MODEL_PRESETS["llama-3.1-8b"]
    gpu = dataclasses.replace(GPU_PRESETS["h100-sxm"], mbu=0.8)
    batch = np.array([1.0, 8.0, 32.0])
    measured = decode_step_seconds(model, gpu, batch, 3000, gpus=2, step_overhead=0.004)
    mbu = mbu_from_decode_step(model, gpu, batch, 3000, measured, gpus=2, step_overhead=0.004)
    np.testing.assert_allclose(mbu, 0.8)


def test_step_at_or_below_the_overhead_is_rejected() -> None:
    with pytest.raises(SpecError) as caught:
        mbu_from_decode_step(
            MODEL_PRESETS["llama-3.1-8b"], GPU_PRESETS["h100-sxm"], 1, 100, 0.003, step_overhead=0.005
        )
    assert caught.value.field == "seconds"
    assert "step overhead" in caught.value.rule


def test_non_positive_measurements_are_rejected() -> None:
    with pytest.raises(SpecError, match="seconds"):
        mfu_from_prefill(MODEL_PRESETS["llama-3.1-8b"], GPU_PRESETS["h100-sxm"], 1000, 0.0)


# ---- online calibration: live windows → a robust, trusted fit ----------------------------------------

LLAMA_8B, H100 = MODEL_PRESETS["llama-3.1-8b"], GPU_PRESETS["h100-sxm"]
TRUE = dataclasses.replace(H100, mfu=0.3, mbu=0.6)  # what the live engines "really" achieve


def measured_window(batch: float = 32.0, context: float = 2500.0, tokens: float = 2000.0) -> LiveWindow:
    return LiveWindow(
        prefill_tokens=tokens,
        prefill_seconds=float(prefill_seconds(LLAMA_8B, TRUE, tokens, gpus=2)),
        decode_batch=batch,
        decode_context=context,
        decode_step_seconds=float(decode_step_seconds(LLAMA_8B, TRUE, batch, context, step_overhead=0.002)),
    )


def calibrated(*windows: LiveWindow) -> OnlineCalibration:
    state = OnlineCalibration()
    for window in windows:
        state = state.observe(LLAMA_8B, H100, window, prefill_gpus=2, step_overhead=0.002)
    return state


def test_live_windows_recover_the_true_efficiencies_once_enough_agree() -> None:
    windows = [
        measured_window(batch=b, tokens=t)
        for b, t in zip([8, 16, 32, 48, 64], [1000, 2000, 4000, 3000, 1500], strict=True)
    ]
    state = calibrated(*windows)
    assert state.mfu.value == pytest.approx(0.3) and state.mbu.value == pytest.approx(0.6)
    assert state.mfu.confident and state.mbu.confident and state.mbu.samples == MIN_SAMPLES
    assert not calibrated(*windows[:-1]).mbu.confident  # one window short


@pytest.mark.parametrize(
    ("window", "has_mfu", "has_mbu"),
    [
        (LiveWindow(None, None, None, None, None), False, False),  # no data at all
        (dataclasses.replace(measured_window(), prefill_seconds=None), False, True),  # prefill queued
        (dataclasses.replace(measured_window(), decode_batch=0.0), True, False),  # idle decode
        (dataclasses.replace(measured_window(), decode_step_seconds=0.001), True, False),  # ≤ overhead
        (dataclasses.replace(measured_window(), decode_step_seconds=float("nan")), True, False),
        # batch 4096 at no context: the step is compute-bound, its time says nothing about bandwidth
        (measured_window(batch=4096.0, context=0.0), True, False),
    ],
)
def test_a_window_reads_only_what_it_measured_cleanly(
    window: LiveWindow, has_mfu: bool, has_mbu: bool
) -> None:
    state = calibrated(window)
    assert (state.mfu.samples, state.mbu.samples) == (int(has_mfu), int(has_mbu))


def test_disagreeing_or_impossible_readings_are_not_trusted() -> None:
    noisy = [
        dataclasses.replace(measured_window(), decode_step_seconds=s)
        for s in (0.008, 0.02, 0.012, 0.03, 0.016)
    ]
    assert calibrated(*noisy).mbu.spread > MAX_SPREAD and not calibrated(*noisy).mbu.confident  # type: ignore[operator]
    # faster than the stated peak allows: MBU above 1 says the preset is wrong, so it is not used
    fast = [dataclasses.replace(measured_window(batch=1.0), decode_step_seconds=0.006)] * MIN_SAMPLES
    fit = calibrated(*fast).mbu
    assert fit.value is not None and fit.value > 1 and not fit.confident


def test_only_the_latest_readings_count() -> None:
    old = [dataclasses.replace(measured_window(), decode_step_seconds=0.05)] * MAX_SAMPLES
    state = calibrated(*old, *[measured_window()] * MAX_SAMPLES)
    assert state.mbu.samples == MAX_SAMPLES and state.mbu.value == pytest.approx(0.6)
