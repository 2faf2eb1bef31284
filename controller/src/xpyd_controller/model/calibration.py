"""Efficiencies from measurements: the roofline inverted, so the controller can calibrate MFU and MBU.

Feed a measured prefill time (e.g. from vLLM's prefill-time histogram) or a measured decode step
(inter-token latency at a known batch and context) and get the efficiency that makes the model
reproduce it; smooth it over time and pass it back as `GpuSpec(mfu=..., mbu=...)`. Results are not
clipped: a value above 1 means the measurement beats the stated peak (a wrong preset, or a
compute-bound step fed to the memory formula), which a caller should log rather than hide.
"""

from __future__ import annotations

import numpy as np

from xpyd_controller.model.roofline import FloatArray, Numeric, attention_factor
from xpyd_controller.model.specs import GpuSpec, ModelSpec, SpecError, require_positive


def mfu_from_prefill(
    model: ModelSpec, gpu: GpuSpec, tokens: Numeric, seconds: Numeric, gpus: Numeric = 1
) -> FloatArray:
    """MFU such that `prefill_seconds(model, gpu, tokens, gpus)` equals the measured `seconds`."""
    length = require_positive("tokens", tokens)
    measured = require_positive("seconds", seconds)
    flops = 2.0 * model.compute_params * length * attention_factor(model, length)
    result: FloatArray = flops / (np.asarray(gpus, np.float64) * gpu.peak_flops * measured)
    return result


def mbu_from_decode_step(
    model: ModelSpec,
    gpu: GpuSpec,
    batch: Numeric,
    context_tokens: Numeric,
    seconds: Numeric,
    *,
    gpus: Numeric = 1,
    step_overhead: float = 0.0,
) -> FloatArray:
    """MBU such that the memory side of `decode_step_seconds` equals a measured, memory-bound step.

    Only meaningful while the step is memory-bound, i.e. its compute time 2·P·B/π_eff is the smaller side.
    """
    measured = require_positive("seconds", seconds)
    reading = measured - step_overhead
    if np.any(reading <= 0):
        raise SpecError(
            "seconds", float(np.min(measured)), f"must exceed the step overhead {step_overhead:g} s"
        )
    bytes_read = (
        model.weight_footprint_bytes
        + np.asarray(batch, np.float64) * np.asarray(context_tokens, np.float64) * model.kv_bytes_per_token
    )
    result: FloatArray = bytes_read / (np.asarray(gpus, np.float64) * gpu.hbm_bandwidth * reading)
    return result
