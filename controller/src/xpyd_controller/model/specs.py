"""Typed hardware and model descriptions the capacity model computes with.

All quantities are SI: bytes, bytes/s, FLOP/s, seconds. Specs are frozen and validated once at
construction, so the vectorised formulas downstream never re-check them. A spec's fields are plain
numbers, checked without numpy (`xpyd simulate` on the seed's trace never imports it); the `require*`
functions also take arrays (the sizing layer's sweeps) and return them as float arrays.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from xpyd_api.errors import InputError

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt


class SpecError(InputError):
    """A rejected value of the capacity model's inputs (model, GPU, link, workload, pool).

    The CLI maps `field` to its flag name, so a message always names what the user typed.
    """


def require(
    field: str, value: object, rule: str, ok: Callable[[npt.NDArray[np.float64]], npt.NDArray[np.bool_]]
) -> npt.NDArray[np.float64]:
    """`value` (a number or an array) as a float array, or a SpecError naming the first bad element."""
    import numpy as np

    try:
        array = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise SpecError(field, value, "must be a number") from None
    with np.errstate(invalid="ignore"):
        bad = ~ok(array)
    if bad.any():
        raise SpecError(field, float(array[bad].flat[0]), rule)
    return array


def require_positive(field: str, value: object) -> npt.NDArray[np.float64]:
    """Reject NaN, infinities, zero and negatives."""
    import numpy as np

    return require(field, value, "must be a finite number > 0", lambda a: np.isfinite(a) & (a > 0))


def require_non_negative(field: str, value: object) -> npt.NDArray[np.float64]:
    """Reject NaN, infinities and negatives (zero allowed)."""
    import numpy as np

    return require(field, value, "must be a finite number >= 0", lambda a: np.isfinite(a) & (a >= 0))


def require_fraction(field: str, value: object) -> npt.NDArray[np.float64]:
    """Efficiencies are fractions of a peak: 0 < value <= 1."""
    return require(field, value, "must be in (0, 1]", lambda a: (a > 0) & (a <= 1))


# A spec's fields are plain numbers: checked without numpy (a good one never reaches `require`),
# anything else (or a bad value) by `require_*`, so the rule and the message are the same.
def check_positive(field: str, value: object) -> None:
    if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
        require_positive(field, value)


def check_non_negative(field: str, value: object) -> None:
    if not (isinstance(value, int | float) and math.isfinite(value) and value >= 0):
        require_non_negative(field, value)


def check_fraction(field: str, value: object) -> None:
    if not (isinstance(value, int | float) and 0 < value <= 1):
        require_fraction(field, value)


def _check_whole(field: str, value: object, rule: str = "must be an integer > 0") -> None:
    if not (isinstance(value, int) and value > 0):
        raise SpecError(field, value, rule)


@dataclass(frozen=True)
class ModelSpec:
    """A transformer as the roofline sees it.

    `params` is the total parameter count (what the weights occupy and what a decode step re-reads);
    `active_params` is the per-token compute count for mixture-of-experts models (None = dense, equal
    to `params`). `hidden_size` None means "unknown": the prefill attention correction is then 1.
    Set `kv_latent_dim` and `rope_dim` together for MLA (DeepSeek): one compressed latent plus the
    decoupled RoPE key per layer replaces the per-head K and V, so `kv_heads` and `head_dim` (which
    GQA/MHA models need) may then be left unset.
    """

    params: float
    layers: int
    kv_heads: int | None = None
    head_dim: int | None = None
    hidden_size: int | None = None
    kv_bytes: float = 2.0  # bytes per KV-cache element (2 = bf16, 1 = fp8)
    weight_bytes: float = 2.0  # bytes per parameter (2 = bf16, 1 = fp8)
    kv_latent_dim: int | None = None
    rope_dim: int | None = None
    active_params: float | None = None

    def __post_init__(self) -> None:
        check_positive("params", self.params)
        _check_whole("layers", self.layers)
        self._check_attention_shape()
        if self.hidden_size is not None:
            _check_whole("hidden_size", self.hidden_size, "must be an integer > 0 or unknown (None)")
        check_positive("kv_bytes", self.kv_bytes)
        check_positive("weight_bytes", self.weight_bytes)
        if self.active_params is not None:
            check_positive("active_params", self.active_params)
            if self.active_params > self.params:
                raise SpecError("active_params", self.active_params, f"must be <= params ({self.params:g})")

    def _check_attention_shape(self) -> None:
        """GQA/MHA needs kv_heads and head_dim; MLA needs kv_latent_dim and rope_dim, both or neither."""
        if (self.kv_latent_dim is None) != (self.rope_dim is None):
            raise SpecError(
                "kv_latent_dim" if self.kv_latent_dim is None else "rope_dim",
                None,
                "MLA needs both kv_latent_dim and rope_dim (or neither, for GQA/MHA)",
            )
        for name in ("kv_heads", "head_dim", "kv_latent_dim", "rope_dim"):
            value = getattr(self, name)
            if value is not None:
                _check_whole(name, value)
            elif self.kv_latent_dim is None and name in ("kv_heads", "head_dim"):
                raise SpecError(
                    name, value, "required for a GQA/MHA model (MLA: kv_latent_dim and rope_dim instead)"
                )

    @property
    def is_mla(self) -> bool:
        return self.kv_latent_dim is not None

    @property
    def kv_bytes_per_token(self) -> float:
        """GQA: 2·layers·kv_heads·head_dim·bytes (K and V); MLA: layers·(latent+rope)·bytes."""
        if self.kv_latent_dim is not None and self.rope_dim is not None:
            return float(self.layers * (self.kv_latent_dim + self.rope_dim) * self.kv_bytes)
        assert self.kv_heads is not None and self.head_dim is not None  # checked in __post_init__
        return float(2 * self.layers * self.kv_heads * self.head_dim * self.kv_bytes)

    @property
    def weight_footprint_bytes(self) -> float:
        """W: bytes of weights resident in HBM and re-read by every decode step."""
        return self.params * self.weight_bytes

    @property
    def compute_params(self) -> float:
        """Parameters touched per token (FLOPs/token ≈ 2 × this)."""
        return self.params if self.active_params is None else self.active_params

    @property
    def attention_crossover_tokens(self) -> float | None:
        """L* = 2P/(4·d_model·layers): the length where attention FLOPs equal the linear ones."""
        if self.hidden_size is None:
            return None
        return 2 * self.compute_params / (4 * self.hidden_size * self.layers)


@dataclass(frozen=True)
class GpuSpec:
    """One GPU: dense peak FLOP/s, HBM bandwidth and capacity, and the achieved efficiencies.

    `mfu` (model FLOPs utilisation) and `mbu` (memory-bandwidth utilisation) are parameters, not
    constants: the controller calibrates them online from measured step and prefill times.
    """

    peak_flops: float
    hbm_bandwidth: float
    hbm_bytes: float
    mfu: float = 0.4
    mbu: float = 1.0

    def __post_init__(self) -> None:
        check_positive("peak_flops", self.peak_flops)
        check_positive("hbm_bandwidth", self.hbm_bandwidth)
        check_positive("hbm_bytes", self.hbm_bytes)
        check_fraction("mfu", self.mfu)
        check_fraction("mbu", self.mbu)

    @property
    def effective_flops(self) -> float:
        """π_eff = peak × MFU."""
        return self.peak_flops * self.mfu

    @property
    def effective_bandwidth(self) -> float:
        """β_eff = HBM bandwidth × MBU."""
        return self.hbm_bandwidth * self.mbu


@dataclass(frozen=True)
class LinkSpec:
    """The KV-transfer path one request gets (bytes/s payload) and a fixed per-transfer setup cost."""

    bandwidth: float
    overhead: float = 0.0

    def __post_init__(self) -> None:
        check_positive("bandwidth", self.bandwidth)
        check_non_negative("overhead", self.overhead)
