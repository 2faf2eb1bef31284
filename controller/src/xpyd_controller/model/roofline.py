"""Roofline timing of the two phases and of the KV handoff, vectorised over numpy arrays.

Every numeric argument may be a Python number or a numpy array; arrays broadcast against each other,
so a sweep over 10^6 scenarios is one call. Scalar inputs give numpy float64 scalars (a `float`
subclass). Specs are validated at construction; these functions do not re-check array contents, the
sizing layer does.

Reproducing the seed article's simulator exactly: it uses
`t_p(m) = 2·P·m/π_eff` and `t_step(c) = ovh + max(W/β, 2·P·c/π_eff)`, i.e. no attention correction
and no KV-read term. Build the model with `hidden_size=None` (attention factor 1) and call
`decode_step_seconds(model, gpu, batch=c, context_tokens=0, step_overhead=ovh)`; with `mbu=1` and
`weight_bytes=2` the result is the article's step time to the last bit of arithmetic.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from xpyd_controller.model.specs import GpuSpec, LinkSpec, ModelSpec

FloatArray = npt.NDArray[np.float64]
Numeric = float | FloatArray | npt.NDArray[np.int64]


def kv_bytes_per_token(model: ModelSpec) -> float:
    """KV-cache bytes one token occupies (GQA: 2·layers·kv_heads·head_dim·b; MLA: layers·(latent+rope)·b)."""
    return model.kv_bytes_per_token


def attention_factor(model: ModelSpec, tokens: Numeric) -> FloatArray:
    """1 + L/L*: prefill FLOPs/token grow with context as attention catches up with the linear layers.

    The factor is 1 when the hidden size is unknown (then L* is unknown too).
    """
    crossover = model.attention_crossover_tokens
    length = np.asarray(tokens, dtype=np.float64)
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
    length = np.asarray(tokens, dtype=np.float64)
    computed = (1.0 - np.asarray(hit_rate, dtype=np.float64)) * length
    linear = (
        2.0 * model.compute_params * computed / (np.asarray(gpus, dtype=np.float64) * gpu.effective_flops)
    )
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
    width = np.asarray(gpus, dtype=np.float64)
    requests = np.asarray(batch, dtype=np.float64)
    resident = np.asarray(context_tokens, dtype=np.float64)
    memory = (model.weight_footprint_bytes + requests * resident * model.kv_bytes_per_token) / (
        width * gpu.effective_bandwidth
    )
    compute = 2.0 * model.compute_params * requests / (width * gpu.effective_flops)
    result: FloatArray = np.asarray(step_overhead, dtype=np.float64) + np.maximum(memory, compute)
    return result


def kv_transfer_seconds(model: ModelSpec, link: LinkSpec, tokens: Numeric) -> FloatArray:
    """Serialized handoff of `tokens` tokens' KV over the link: L·kv/BW + setup overhead."""
    length = np.asarray(tokens, dtype=np.float64)
    result: FloatArray = length * model.kv_bytes_per_token / link.bandwidth + link.overhead
    return result
