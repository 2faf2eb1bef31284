"""Calibration inverts the roofline: efficiencies in → times → the same efficiencies out."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from xpyd_controller.model.calibration import mbu_from_decode_step, mfu_from_prefill
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
