"""A PDDeployment's spec → the policy's `PolicyContext` and `Limits` (pure).

The same presets and override rule as `xpyd plan`: a preset fills the numbers, explicit spec numbers
override it. Without a GPU or link preset the controller assumes what `xpyd plan` assumes (h100-sxm,
ib-400g). The autoscaling windows and tolerance of the spec become the policy's knobs of the same meaning.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, TypeVar

from xpyd_api.models import EngineType, HardwareSpec, PDDeploymentSpec, RouterType
from xpyd_api.models import ModelSpec as ApiModelSpec
from xpyd_controller.model.calibration import Fitted, OnlineCalibration
from xpyd_controller.model.presets import GPU_PRESETS, LINK_PRESETS, MODEL_PRESETS
from xpyd_controller.model.sizing import RequestFlow
from xpyd_controller.model.specs import GpuSpec, LinkSpec, ModelSpec
from xpyd_controller.policy.context import PolicyContext
from xpyd_controller.policy.types import Limits

DEFAULT_GPU = "h100-sxm"
DEFAULT_LINK = "ib-400g"
_MODEL_FIELDS = ("params", "layers", "kv_heads", "head_dim", "hidden_size", "kv_bytes", "weight_bytes")
_MLA_FIELDS = ("kv_latent_dim", "rope_dim")
_GPU_FIELDS = ("peak_flops", "mfu", "hbm_bandwidth", "mbu", "hbm_bytes")


PresetT = TypeVar("PresetT")


class SetupError(ValueError):
    """The spec cannot configure a policy; the message names the field, value and rule."""


def _preset(table: Mapping[str, PresetT], field: str, name: str) -> PresetT:
    if name not in table:
        raise SetupError(f"{field} = {name!r}: unknown preset; known: {', '.join(sorted(table))}")
    return table[name]


def _given(spec: object, names: tuple[str, ...]) -> dict[str, Any]:
    return {name: getattr(spec, name) for name in names if getattr(spec, name) is not None}


def model_spec(model: ApiModelSpec) -> ModelSpec:
    overrides = _given(model, _MODEL_FIELDS + _MLA_FIELDS)
    if model.preset is not None:
        return dataclasses.replace(_preset(MODEL_PRESETS, "spec.model.preset", model.preset), **overrides)
    mla = "kv_latent_dim" in overrides or "rope_dim" in overrides
    shape = ("params", "layers", *(_MLA_FIELDS if mla else ("kv_heads", "head_dim")))
    missing = [f"spec.model.{name}" for name in shape if name not in overrides]
    if missing:
        raise SetupError(
            f"spec.model.preset is not set, so {', '.join(missing)} must be (the capacity model needs them)"
        )
    return ModelSpec(**overrides)


def gpu_spec(hardware: HardwareSpec) -> GpuSpec:
    preset = _preset(GPU_PRESETS, "spec.hardware.gpu", hardware.gpu or DEFAULT_GPU)
    return dataclasses.replace(preset, **_given(hardware, _GPU_FIELDS))


CALIBRATION_HYSTERESIS = 0.1  # a fit in use is replaced only when the new one differs by more


def _efficiency(given: float | None, preset: float, fit: Fitted, in_use: float) -> float:
    if given is not None:
        return given
    if not fit.confident or fit.value is None:
        return in_use  # the preset, or the last confident fit: readings that disagree change nothing
    if in_use != preset and abs(fit.value - in_use) <= CALIBRATION_HYSTERESIS * in_use:
        return in_use  # the fit in use still holds: no churn in the sizing on every window
    return round(fit.value, 3)


def calibrated_gpu(
    hardware: HardwareSpec, calibration: OnlineCalibration, in_use: GpuSpec | None = None
) -> GpuSpec:
    """The GPU to size with: MFU and MBU as the spec gives them, else the online calibration's once it is
    confident (kept until a confident fit differs by more than CALIBRATION_HYSTERESIS), else the preset's."""
    preset = gpu_spec(hardware)
    current = in_use or preset
    return dataclasses.replace(
        preset,
        mfu=_efficiency(hardware.mfu, preset.mfu, calibration.mfu, current.mfu),
        mbu=_efficiency(hardware.mbu, preset.mbu, calibration.mbu, current.mbu),
    )


def link_spec(hardware: HardwareSpec) -> LinkSpec:
    preset = _preset(LINK_PRESETS, "spec.hardware.link", hardware.link or DEFAULT_LINK)
    overrides = {
        field: value
        for field, value in (
            ("bandwidth", hardware.link_bandwidth),
            ("overhead", hardware.link_overhead_seconds),
        )
        if value is not None
    }
    return dataclasses.replace(preset, **overrides)


def request_flow(spec: PDDeploymentSpec) -> RequestFlow:
    """vllm-router sends a vLLM request to prefill, then to decode with the KV's address (prefill-first);
    sglang-router sends it to both at once and decode pre-allocates its KV (decode-first); otherwise
    the seeds' decode-first, which never under-sizes decode."""
    vllm_pair = spec.engine.type is EngineType.VLLM and spec.router.type is RouterType.VLLM_ROUTER
    return "prefill_first" if vllm_pair else "decode_first"


def policy_context(spec: PDDeploymentSpec) -> PolicyContext:
    """Everything a policy factory needs, from the spec; raises SetupError (or the specs' own errors)."""
    autoscaling = spec.autoscaling
    return PolicyContext(
        model=model_spec(spec.model),
        gpu=gpu_spec(spec.hardware),
        link=link_spec(spec.hardware),
        ttft_slo_s=spec.slo.ttft_seconds,
        tpot_slo_s=spec.slo.tpot_seconds,
        prefill_gpus_per_instance=spec.prefill.gpus_per_instance,
        decode_gpus_per_instance=spec.decode.gpus_per_instance,
        scrape_interval_s=autoscaling.interval_seconds,
        initial_prefill=spec.prefill.replicas,
        initial_decode=spec.decode.replicas,
        request_flow=request_flow(spec),
        knobs={
            "up_window_s": autoscaling.scale_up_window_seconds,
            "down_window_s": autoscaling.scale_down_window_seconds,
            "tolerance": autoscaling.tolerance,
        },
    )


def limits(spec: PDDeploymentSpec) -> Limits:
    return Limits(
        prefill_min=spec.prefill.min_replicas,
        prefill_max=spec.prefill.max_replicas,
        decode_min=spec.decode.min_replicas,
        decode_max=spec.decode.max_replicas,
        gpu_budget=spec.autoscaling.gpu_budget,
    )
