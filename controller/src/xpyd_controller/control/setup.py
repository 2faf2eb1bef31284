"""A PDDeployment's spec → the policy's `PolicyContext` and `Limits` (pure).

The presets and override rule are `xpyd plan`'s and the scenario files' (model/resolve.py): a preset
fills the numbers, explicit spec numbers override it; without a GPU or link preset h100-sxm and ib-400g. The autoscaling windows and tolerance of the spec become the policy's knobs of the same meaning.
"""

from __future__ import annotations

import dataclasses
import re

from xpyd_api.errors import InputError
from xpyd_api.models import HardwareSpec, PDDeploymentSpec
from xpyd_api.models import ModelSpec as ApiModelSpec
from xpyd_controller.model.calibration import Fitted, OnlineCalibration
from xpyd_controller.model.resolve import resolve_gpu, resolve_link, resolve_model
from xpyd_controller.model.sizing import RequestFlow
from xpyd_controller.model.specs import GpuSpec, LinkSpec, ModelSpec
from xpyd_controller.policy.context import PolicyContext
from xpyd_controller.policy.types import Limits

_MODEL_FIELDS = ("params", "layers", "kv_heads", "head_dim", "hidden_size", "kv_bytes", "weight_bytes")
_MLA_FIELDS = ("kv_latent_dim", "rope_dim")
_GPU_FIELDS = ("peak_flops", "mfu", "hbm_bandwidth", "mbu", "hbm_bytes")


class SetupError(InputError):
    """The spec cannot configure a policy (e.g. its Prometheus URL is refused)."""


def _camel(name: str) -> str:
    return re.sub(r"_([a-z])", lambda m: m[1].upper(), name)


def model_spec(model: ApiModelSpec) -> ModelSpec:
    overrides = {name: getattr(model, name) for name in _MODEL_FIELDS + _MLA_FIELDS}
    return resolve_model(
        model.preset, overrides, "spec.model.preset", lambda name: f"spec.model.{_camel(name)}"
    )


def gpu_spec(hardware: HardwareSpec) -> GpuSpec:
    overrides = {name: getattr(hardware, name) for name in _GPU_FIELDS}
    return resolve_gpu(
        hardware.gpu, overrides, "spec.hardware.gpu", lambda name: f"spec.hardware.{_camel(name)}"
    )


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
    overrides = {"bandwidth": hardware.link_bandwidth, "overhead": hardware.link_overhead_seconds}
    spec_names = {"bandwidth": "spec.hardware.linkBandwidth", "overhead": "spec.hardware.linkOverheadSeconds"}
    return resolve_link(hardware.link, overrides, "spec.hardware.link", spec_names.__getitem__)


def request_flow(spec: PDDeploymentSpec) -> RequestFlow:
    """vllm-router sends a vLLM request to prefill, then to decode with the KV's address (prefill-first);
    sglang-router sends it to both at once and decode pre-allocates its KV (decode-first); otherwise
    the seeds' decode-first, which never under-sizes decode."""
    return "prefill_first" if spec.decode_sent_after_prefill else "decode_first"


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
            "down_period_s": autoscaling.scale_down_period_seconds,
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
