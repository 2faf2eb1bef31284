"""The `aisimulate_core.sdk` stand-in Dynamo's planner plans from: xpyd's roofline, forward pass by forward pass."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from xpyd_controller.model.presets import GPU_PRESETS, MODEL_PRESETS
from xpyd_controller.model.roofline import decode_step_seconds, prefill_seconds

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "peers"))
from aisimulate_core.sdk import (
    ForwardPassPerfModelConfig,
    RooflineDeployment,
    RustForwardPassPerfModel,
    use_roofline,
)

MODEL, GPU = MODEL_PRESETS["llama-3.1-8b"], GPU_PRESETS["h100-sxm"]


def pass_of(**scheduled: int) -> list[dict[str, Any]]:
    counts = dict.fromkeys(
        ("num_prefill_requests", "sum_prefill_tokens", "num_decode_requests", "sum_decode_kv_tokens"), 0
    )
    return [{"scheduled_requests": counts | scheduled}]


@pytest.fixture
def engines() -> tuple[RustForwardPassPerfModel, RustForwardPassPerfModel]:
    use_roofline(
        prefill=RooflineDeployment(MODEL, GPU, gpus=2, step_overhead_s=0.004),
        decode=RooflineDeployment(MODEL, GPU, gpus=1, step_overhead_s=0.004),
    )
    prefill = RustForwardPassPerfModel.best_available({"worker_type": "prefill"})
    decode = RustForwardPassPerfModel.best_available({"worker_type": "decode"})
    return prefill, decode


def test_prefill_pass_is_the_roofline_prefill_of_each_prompt(
    engines: tuple[RustForwardPassPerfModel, RustForwardPassPerfModel],
) -> None:
    prefill, _ = engines
    ms = prefill.estimate_forward_pass_time_ms(pass_of(num_prefill_requests=2, sum_prefill_tokens=6000))
    assert ms == pytest.approx((2 * float(prefill_seconds(MODEL, GPU, 3000, 2)) + 0.004) * 1e3)


def test_decode_pass_is_one_roofline_step_of_the_batch(
    engines: tuple[RustForwardPassPerfModel, RustForwardPassPerfModel],
) -> None:
    _, decode = engines
    ms = decode.estimate_forward_pass_time_ms(pass_of(num_decode_requests=16, sum_decode_kv_tokens=16 * 2000))
    assert ms == pytest.approx(float(decode_step_seconds(MODEL, GPU, 16, 2000, step_overhead=0.004)) * 1e3)
    assert decode.estimate_forward_pass_time_ms(pass_of()) == 0.0
    assert decode.diagnostics()["readiness"] == "ready"


def test_kv_reads_off_matches_a_simulator_that_does_not_read_kv() -> None:
    use_roofline(*(RooflineDeployment(MODEL, GPU, 1, 0.0, decode_kv_reads=False),) * 2)
    decode = RustForwardPassPerfModel.best_available({"worker_type": "decode"})
    ms = decode.estimate_forward_pass_time_ms(pass_of(num_decode_requests=8, sum_decode_kv_tokens=8 * 50_000))
    assert ms == pytest.approx(float(decode_step_seconds(MODEL, GPU, 8, 0.0)) * 1e3)


def test_config_record_round_trips_what_dynamo_reads() -> None:
    migrated = ForwardPassPerfModelConfig.from_legacy_engine_config(
        {"tp_size": 1}, "decode", {"max_num_tokens": 8192}
    )
    assert migrated.estimator_config["fpm_regression"]["sampling"] == {"max_num_tokens": 8192}
    assert ForwardPassPerfModelConfig(worker_type="prefill").tp == 1


def test_unset_role_fails_naming_it() -> None:
    from aisimulate_core import sdk

    sdk._DEPLOYMENT.clear()
    with pytest.raises(RuntimeError, match="'decode'"):
        RustForwardPassPerfModel.best_available({"worker_type": "decode"})
