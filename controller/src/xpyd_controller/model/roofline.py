"""Roofline timing of the two phases and of the KV handoff, vectorised over numpy arrays.

Every numeric argument may be a Python number or a numpy array; arrays broadcast against each other,
so a sweep over 10^6 scenarios is one call. Scalar inputs give numpy float64 scalars (a `float`
subclass). Specs are validated at construction; these functions do not re-check array contents, the
sizing layer does. The `*_times` functions are the same formulas over Python lists, without numpy:
the event loop times each request with them, so `xpyd simulate` never imports numpy for a trace
drawn in Python (the seed table's).

Reproducing the seed article's simulator exactly: it uses
`t_p(m) = 2·P·m/π_eff` and `t_step(c) = ovh + max(W/β, 2·P·c/π_eff)`, i.e. no attention correction
and no KV-read term. Build the model with `hidden_size=None` (attention factor 1) and call
`decode_step_seconds(model, gpu, batch=c, context_tokens=0, step_overhead=ovh)`; with `mbu=1` and
`weight_bytes=2` the result is the article's step time to the last bit of arithmetic.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from xpyd_controller.model.specs import GpuSpec, LinkSpec, ModelSpec

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    FloatArray = npt.NDArray[np.float64]
    Numeric = float | FloatArray | npt.NDArray[np.int64]


def kv_bytes_per_token(model: ModelSpec) -> float:
    """KV-cache bytes one token occupies (GQA: 2·layers·kv_heads·head_dim·b; MLA: layers·(latent+rope)·b)."""
    return model.kv_bytes_per_token


def _floats(value: Numeric) -> FloatArray:
    import numpy as np

    return np.asarray(value, dtype=np.float64)


def attention_factor(model: ModelSpec, tokens: Numeric) -> FloatArray:
    """1 + L/L*: prefill FLOPs/token grow with context as attention catches up with the linear layers.

    The factor is 1 when the hidden size is unknown (then L* is unknown too).
    """
    import numpy as np

    crossover = model.attention_crossover_tokens
    length = _floats(tokens)
    if crossover is None:
        return np.ones_like(length)
    return 1.0 + length / crossover


def prefill_seconds(
    model: ModelSpec, gpu: GpuSpec, tokens: Numeric, gpus: Numeric = 1, *, hit_rate: Numeric = 0.0
) -> FloatArray:
    """Compute-bound prefill of a `tokens`-long prompt on `gpus` GPUs: 2·P·(1−h)·L/(G·π_eff) × (1 + L/L*).

    A prefix-cache hit rate `h` skips that fraction of the prompt's tokens; the uncached ones still
    attend over the whole prompt, so the attention factor keeps the full length L.
    """
    length = _floats(tokens)
    computed = (1.0 - _floats(hit_rate)) * length
    linear = 2.0 * model.compute_params * computed / (_floats(gpus) * gpu.effective_flops)
    return linear * attention_factor(model, length)


def decode_step_seconds(
    model: ModelSpec,
    gpu: GpuSpec,
    batch: Numeric,
    context_tokens: Numeric,
    *,
    gpus: Numeric = 1,
    step_overhead: Numeric = 0.0,
) -> FloatArray:
    """One decode step of `batch` requests with mean resident context L̄ on `gpus` GPUs.

    ovh + max((W + B·L̄·kv)/(G·β_eff), 2·P·B/(G·π_eff)): every step re-reads all weights and every
    active request's KV cache (memory side) and does 2·P FLOPs per generated token (compute side).
    """
    import numpy as np

    width = _floats(gpus)
    requests = _floats(batch)
    resident = _floats(context_tokens)
    memory = (model.weight_footprint_bytes + requests * resident * model.kv_bytes_per_token) / (
        width * gpu.effective_bandwidth
    )
    compute = 2.0 * model.compute_params * requests / (width * gpu.effective_flops)
    result: FloatArray = _floats(step_overhead) + np.maximum(memory, compute)
    return result


def kv_transfer_seconds(model: ModelSpec, link: LinkSpec, tokens: Numeric) -> FloatArray:
    """Serialized handoff of `tokens` tokens' KV over the link: L·kv/BW + setup overhead."""
    length = _floats(tokens)
    result: FloatArray = length * model.kv_bytes_per_token / link.bandwidth + link.overhead
    return result


# ---- the same formulas over Python lists ------------------------------------------------------------
# The event loop times every request of a trace with these (one call per column, no numpy): the
# arithmetic is the vectorised functions' in the same order, so every value is the same to the bit
# (tests/unit/test_model_roofline.py holds them to it).


def prefill_times(model: ModelSpec, gpu: GpuSpec, tokens: Iterable[float], gpus: float = 1) -> list[float]:
    """`prefill_seconds` of each prompt (no prefix hits)."""
    flops, width = 2.0 * model.compute_params, float(gpus) * gpu.effective_flops
    crossover = model.attention_crossover_tokens
    if crossover is None:
        return [flops * length / width for length in tokens]
    return [flops * length / width * (1.0 + length / crossover) for length in tokens]


def decode_step_times(
    model: ModelSpec,
    gpu: GpuSpec,
    batches: Iterable[float],
    context_tokens: float,
    *,
    gpus: float,
    step_overhead: float,
) -> list[float]:
    """`decode_step_seconds` of each batch size."""
    weights, kv_bytes = model.weight_footprint_bytes, model.kv_bytes_per_token
    memory_width, compute_width = float(gpus) * gpu.effective_bandwidth, float(gpus) * gpu.effective_flops
    flops, resident = 2.0 * model.compute_params, float(context_tokens)
    return [
        step_overhead + max((weights + b * resident * kv_bytes) / memory_width, flops * b / compute_width)
        for b in map(float, batches)
    ]


def kv_transfer_times(model: ModelSpec, link: LinkSpec, tokens: Iterable[float]) -> list[float]:
    """`kv_transfer_seconds` of each prompt."""
    kv_bytes, bandwidth, overhead = model.kv_bytes_per_token, link.bandwidth, link.overhead
    return [length * kv_bytes / bandwidth + overhead for length in tokens]
