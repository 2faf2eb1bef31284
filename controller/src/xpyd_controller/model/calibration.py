"""Efficiencies from measurements: the roofline inverted, so the controller can calibrate MFU and MBU.

Feed a measured prefill time (e.g. from vLLM's prefill-time histogram) or a measured decode step
(inter-token latency at a known batch and context) and get the efficiency that makes the model
reproduce it; smooth it over time and pass it back as `GpuSpec(mfu=..., mbu=...)`. Results are not
clipped: a value above 1 means the measurement beats the stated peak (a wrong preset, or a
compute-bound step fed to the memory formula), which a caller should log rather than hide.

`OnlineCalibration` is what the controller keeps per PDDeployment: each decision window's live
numbers (`LiveWindow`) give at most one MFU and one MBU reading; the median of the last readings is
used for sizing only once enough of them agree on a value in (0, 1] (`Fitted.confident`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeGuard

import numpy as np

from xpyd_controller.model.roofline import attention_factor
from xpyd_controller.model.specs import GpuSpec, ModelSpec, SpecError, require_positive

if TYPE_CHECKING:
    from xpyd_controller.model.roofline import FloatArray, Numeric


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


# Online calibration: one PDDeployment's windows → a robust MFU and MBU, and whether to trust them.
MIN_SAMPLES = 5  # windows with a reading before an efficiency is trusted
MAX_SAMPLES = 20  # the readings kept (the most recent ones)
MAX_SPREAD = 0.25  # interquartile range ÷ median above which the readings disagree too much to use
MEMORY_BOUND_SHARE = 0.5  # a decode step counts for MBU only while its compute side is at most this share


@dataclass(frozen=True)
class LiveWindow:
    """One decision window's measured numbers, per instance; None where the metrics had no data."""

    prefill_tokens: float | None  # prompt tokens computed per request (after prefix-cache hits)
    prefill_seconds: float | None  # mean prefill time of one request while nothing waited
    decode_batch: float | None  # requests running per decode instance
    decode_context: float | None  # mean tokens in a running request's KV cache
    decode_step_seconds: float | None  # mean time between output tokens


@dataclass(frozen=True)
class Fitted:
    """One efficiency from the kept readings: their median, how many, how far they spread."""

    value: float | None
    samples: int
    spread: float | None  # interquartile range ÷ median

    @property
    def confident(self) -> bool:
        """Enough readings that agree, on a physically possible value (0 < value ≤ 1)."""
        return (
            self.value is not None
            and self.spread is not None
            and self.samples >= MIN_SAMPLES
            and self.spread <= MAX_SPREAD
            and 0 < self.value <= 1
        )


def _fitted(samples: tuple[float, ...]) -> Fitted:
    if not samples:
        return Fitted(None, 0, None)
    low, median, high = (float(q) for q in np.quantile(samples, [0.25, 0.5, 0.75]))
    return Fitted(median, len(samples), (high - low) / median if median > 0 else None)


def _usable(value: float | None) -> TypeGuard[float]:
    """A measured number: present, finite and positive."""
    return value is not None and bool(np.isfinite(value)) and value > 0


@dataclass(frozen=True)
class OnlineCalibration:
    """The last MAX_SAMPLES per-window MFU and MBU readings of one deployment (immutable: `observe`
    returns the next state). The median of agreeing readings resists one noisy window."""

    mfu_samples: tuple[float, ...] = ()
    mbu_samples: tuple[float, ...] = ()

    def observe(
        self,
        model: ModelSpec,
        gpu: GpuSpec,
        window: LiveWindow,
        *,
        prefill_gpus: int = 1,
        decode_gpus: int = 1,
        step_overhead: float = 0.0,
    ) -> OnlineCalibration:
        """The state after one window: a reading for each efficiency the window measured cleanly."""
        mfu, mbu = self.mfu_samples, self.mbu_samples
        if _usable(window.prefill_tokens) and _usable(window.prefill_seconds):
            reading = mfu_from_prefill(
                model, gpu, window.prefill_tokens, window.prefill_seconds, gpus=prefill_gpus
            )
            mfu = (*mfu, float(reading))[-MAX_SAMPLES:]
        step = window.decode_step_seconds
        batch, context = window.decode_batch, window.decode_context
        if _usable(step) and _usable(batch) and context is not None and context >= 0:
            reading_seconds = step - step_overhead
            compute = 2.0 * model.compute_params * batch / (decode_gpus * gpu.effective_flops)
            if reading_seconds > 0 and compute <= MEMORY_BOUND_SHARE * reading_seconds:
                reading = mbu_from_decode_step(
                    model, gpu, batch, context, step, gpus=decode_gpus, step_overhead=step_overhead
                )
                mbu = (*mbu, float(reading))[-MAX_SAMPLES:]
        return OnlineCalibration(mfu, mbu)

    @property
    def mfu(self) -> Fitted:
        return _fitted(self.mfu_samples)

    @property
    def mbu(self) -> Fitted:
        return _fitted(self.mbu_samples)
