"""xPyD sizing: how many prefill and decode instances a workload needs, and which constraint says so.

`size_pools` is vectorised: every `Workload`, `Slo` and `PoolConfig` number may be a numpy array (they
broadcast), so a 10^6-scenario sweep is one call; `Plan.as_dict(i)` and `explain.explain(plan, i)` read
one scenario. With the defaults (no length spread, no quantiles) these are the lecture's xPyD formulas:

- prefill: x = ⌈λ·E[S]⌉, E[S] = 2P(1−h)L_in(1 + L_in/L*)/(G_P·π_eff) (throughput sizing);
- decode: B_cap = min(KV-capacity bound, TPOT bound), y = ⌈C / B_cap⌉ with C = λ·T_sess by Little's
  law, T_sess = TTFT + L_out·t_step when decode reserves KV before the remote prefill (decode-first,
  Dynamo) or T_xfer + L_out·t_step when it allocates KV for the pull after the prefill (prefill-first,
  vLLM's router and disagg proxy), taking the step time at full batch, t_step(B_cap) ≤ TPOT SLO (the SLO
  itself would over-provision); a live pool's measurements (`DecodeMeasurement`: its mean TPOT, the
  requests on it now) replace a prediction they show to be too short;
- transfer: T = L·kv/BW + overhead, kv_max, overlap 2P/π_eff ≥ kv/BW, exposed T/n_layers; the budget
  is judged on the exposed time under layer-wise pipelining (on the serialized T without it), while the
  link's demand λ·L·kv against its capacity stays a hard limit (latency hides, bandwidth does not);
- L_thresh = O_fixed / (2P/(k_P·π_eff) − kv/BW).

Beyond the seeds (opt-in through `Slo`): `ttft_quantile` sizes prefill so the TTFT quantile *with
queueing* meets the SLO (M/G/x, see `queueing`): the smallest pool that meets it, never below the seeds'
throughput floor (`Plan.prefill_throughput_instances`); `context_quantile` sizes the decode batch cap and the
decode pool so that quantile of the resident KV fits (the length spread within a batch, and the
Poisson swings of the number of sessions across the pool).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Literal, NamedTuple, TypeVar, get_args

import numpy as np
import numpy.typing as npt

from xpyd_controller.model.queueing import IntArray, mean_wait, min_servers_for_wait_quantile, wait_quantile
from xpyd_controller.model.roofline import (
    attention_factor,
    decode_step_seconds,
    kv_transfer_seconds,
    prefill_seconds,
)
from xpyd_controller.model.specs import (
    GpuSpec,
    LinkSpec,
    ModelSpec,
    SpecError,
    require,
    require_non_negative,
    require_positive,
)

if TYPE_CHECKING:
    from xpyd_controller.model.roofline import FloatArray, Numeric

BoolArray = npt.NDArray[np.bool_]
LabelArray = npt.NDArray[np.object_]  # Python str per scenario (object arrays: cheap to fill at 10^6)
BINDING_LABELS: LabelArray = np.array(["throughput", "ttft_quantile"], dtype=object)
BOUND_LABELS: LabelArray = np.array(["kv_capacity", "tpot_bandwidth", "tpot_compute"], dtype=object)
DECODE_BINDING_LABELS: LabelArray = np.array(["mean_concurrency", "context_quantile"], dtype=object)
# Which session time sized decode: the roofline's, or one from the live pool's TPOT or its requests now.
SESSION_SOURCES: LabelArray = np.array(["predicted", "measured_tpot", "measured_sessions"], dtype=object)
AnyScalar = TypeVar("AnyScalar", bound=np.generic)
# When the decode side starts holding a request's KV: on arrival, before it asks for a remote prefill
# (Dynamo), or on admission after the prefill and the KV transfer (vLLM's router and disagg proxy).
RequestFlow = Literal["decode_first", "prefill_first"]
REQUEST_FLOWS: tuple[RequestFlow, ...] = get_args(RequestFlow)


# Acklam's rational approximation of the standard normal quantile (relative error < 1.2e-9), made
# exact to double precision by one Halley step on erfc. Here rather than `statistics.NormalDist`,
# whose import (fractions, decimal, random) is a tenth of an `xpyd plan` call's start-up.
_CENTRAL_NUM = (
    -39.69683028665376,
    220.9460984245205,
    -275.9285104469687,
    138.357751867269,
    -30.66479806614716,
    2.506628277459239,
)
_CENTRAL_DEN = (
    -54.47609879822406,
    161.5858368580409,
    -155.6989798598866,
    66.80131188771972,
    -13.28068155288572,
    1.0,
)
_TAIL_NUM = (
    -0.007784894002430293,
    -0.3223964580411365,
    -2.400758277161838,
    -2.549732539343734,
    4.374664141464968,
    2.938163982698783,
)
_TAIL_DEN = (0.007784695709041462, 0.3224671290700398, 2.445134137142996, 3.754408661907416, 1.0)
_TAIL_BELOW = 0.02425


def _polynomial(coefficients: tuple[float, ...], x: float) -> float:
    result = 0.0
    for coefficient in coefficients:
        result = result * x + coefficient
    return result


def normal_quantile(p: float) -> float:
    """z with Φ(z) = p for the standard normal distribution, 0 < p < 1."""
    if not 0.0 < p < 1.0:
        raise SpecError("quantile", p, "must be in (0, 1)")
    if p > 0.5:  # by symmetry; 1 − p is exact for p ≥ 0.5, and erfc keeps the lower tail precise
        return -normal_quantile(1.0 - p)
    if p < _TAIL_BELOW:
        q = math.sqrt(-2.0 * math.log(p))
        z = _polynomial(_TAIL_NUM, q) / _polynomial(_TAIL_DEN, q)
    else:
        q = p - 0.5
        r = q * q
        z = q * _polynomial(_CENTRAL_NUM, r) / _polynomial(_CENTRAL_DEN, r)
    error = 0.5 * math.erfc(-z / math.sqrt(2.0)) - p
    step = error * math.sqrt(2.0 * math.pi) * math.exp(z * z / 2.0)
    return z - step / (1.0 + z * step / 2.0)


# The TTFT quantile `xpyd plan` sizes prefill for unless told otherwise. A TTFT SLO met only on average
# is missed by nearly half the requests of a busy pool, and p90 is the quantile SLOs are most often
# stated at. The controller's xpyd policy and the simulator's oracles size for 0.99 instead: they are
# judged on goodput, the share of requests within the SLO, whose target is 99 %.
DEFAULT_TTFT_QUANTILE = 0.9


def _whole(field: str, value: Numeric) -> FloatArray:
    return require(
        field, value, "must be a whole number >= 1", lambda a: np.isfinite(a) & (a >= 1) & (a == np.round(a))
    )


def _quantile(field: str, value: float | None) -> None:
    if value is not None and not (isinstance(value, int | float) and 0.5 <= value < 1):
        raise SpecError(field, value, "must be in [0.5, 1) (or unset for mean sizing)")


@dataclass(frozen=True)
class Workload:
    """Arrival rate (requests/s), mean input/output lengths (tokens), prefix hit rate, length spread.

    `isl_std`/`osl_std` (standard deviations, tokens) are 0 when only means are known; then every
    formula is the seeds' mean-value one.
    """

    rate: Numeric
    isl: Numeric
    osl: Numeric
    hit_rate: Numeric = 0.0
    isl_std: Numeric = 0.0
    osl_std: Numeric = 0.0

    def __post_init__(self) -> None:
        require_non_negative("rate", self.rate)
        require_positive("isl", self.isl)
        require_positive("osl", self.osl)
        require("hit_rate", self.hit_rate, "must be in [0, 1)", lambda a: (a >= 0) & (a < 1))
        require_non_negative("isl_std", self.isl_std)
        require_non_negative("osl_std", self.osl_std)

    @classmethod
    def from_samples(
        cls, rate: float, input_tokens: Numeric, output_tokens: Numeric, hit_rate: float = 0.0
    ) -> Workload:
        """Means and spreads from observed request lengths."""
        inputs = require_positive("isl", input_tokens)
        outputs = require_positive("osl", output_tokens)
        return cls(
            rate=rate,
            isl=float(inputs.mean()),
            osl=float(outputs.mean()),
            hit_rate=hit_rate,
            isl_std=float(inputs.std()),
            osl_std=float(outputs.std()),
        )


def std_from_quantile(mean: float, value: float, quantile: float) -> float:
    """A standard deviation implied by a mean and one upper quantile (e.g. p90), assuming normality.

    Lets a controller that scrapes a mean and a p90 length feed the distribution-aware sizing.
    """
    _quantile("quantile", quantile)
    return max(0.0, (value - mean) / normal_quantile(quantile))


@dataclass(frozen=True)
class Slo:
    """Latency targets (seconds) and how strictly to size for them.

    `transfer_budget`: the part of TTFT allowed for the serialized KV transfer (None = all of it).
    `ttft_quantile`: None sizes prefill for throughput only (the seeds); q sizes it so that the
    q-quantile TTFT including queueing meets `ttft`. `context_quantile`: None sizes decode on mean
    context and mean concurrency (the seeds); q sizes the batch cap and the pool so the resident KV
    stays within the KV and TPOT bounds with probability q.
    """

    ttft: Numeric
    tpot: Numeric
    transfer_budget: Numeric | None = None
    ttft_quantile: float | None = None
    context_quantile: float | None = None

    def __post_init__(self) -> None:
        require_positive("ttft", self.ttft)
        require_positive("tpot", self.tpot)
        if self.transfer_budget is not None:
            require_positive("transfer_budget", self.transfer_budget)
        _quantile("ttft_quantile", self.ttft_quantile)
        _quantile("context_quantile", self.context_quantile)


@dataclass(frozen=True)
class PoolConfig:
    """GPUs per instance on each side and fixed overheads (seconds): per decode step, per remote prefill.

    `kv_memory_fraction`: the share of a decode instance's HBM the serving engine may fill (vLLM's
    `gpu_memory_utilization`, the simulator's `Realism.kv_memory_fraction`); its KV cache gets that
    share minus the weights. 1 (the seeds) lets the KV fill all HBM left after the weights.
    `request_flow`: how long a decode session holds KV. "decode_first" (the seeds' C = λ(TTFT +
    L_out·TPOT), Dynamo) counts the whole TTFT SLO as residency; "prefill_first" (vLLM's router, the
    disagg proxy, both simulators) only the pull of the prompt's KV and the decode, T_xfer + L_out·t_step.
    `layerwise_transfer`: the engine ships layer i's KV while layer i+1 computes (vLLM's and SGLang's
    connectors, the simulator's `Realism.layerwise_transfer`), so only the exposed part of the
    transfer is on the TTFT path; False puts the whole serialized transfer there.
    """

    prefill_gpus: Numeric = 1
    decode_gpus: Numeric = 1
    step_overhead: Numeric = 0.0
    remote_overhead: Numeric = 0.0
    kv_memory_fraction: Numeric = 1.0
    request_flow: RequestFlow = "decode_first"
    layerwise_transfer: bool = True

    def __post_init__(self) -> None:
        if self.request_flow not in REQUEST_FLOWS:
            raise SpecError("request_flow", self.request_flow, f"must be one of {', '.join(REQUEST_FLOWS)}")
        if not isinstance(self.layerwise_transfer, bool):
            raise SpecError("layerwise_transfer", self.layerwise_transfer, "must be True or False")
        _whole("prefill_gpus", self.prefill_gpus)
        _whole("decode_gpus", self.decode_gpus)
        require_non_negative("step_overhead", self.step_overhead)
        require_non_negative("remote_overhead", self.remote_overhead)
        require(
            "kv_memory_fraction", self.kv_memory_fraction, "must be in (0, 1]", lambda a: (a > 0) & (a <= 1)
        )


@dataclass(frozen=True)
class DecodeMeasurement:
    """What a running decode pool measured; None leaves the model's prediction in place.

    `step_seconds`: its mean time per output token. A step only gets slower as the batch grows, and a
    live batch never exceeds the cap, so the measured step is a lower bound on t_step(B_cap) just as the
    roofline's is (where the roofline is right): sessions are timed with the larger of the two.
    `sessions`: requests on decode now, running or waiting for KV room (or for their KV pull). The pool
    must hold at least these, so they floor C = λ·T_sess; Little's law turns them into the session time
    T_sess = sessions/λ the plan reports. That catches what the roofline leaves out (admission waits
    and preemptions when the KV is full, the output mix of this very window where the sizing smooths
    lengths over minutes) without dividing by a lagging finish rate, which overshoots while a new mix
    ramps up. Neither measurement ever shortens a session: a lightly loaded pool steps faster and holds
    fewer requests than it will at the sized batch.
    """

    step_seconds: float | None = None
    sessions: float | None = None
    # the sessions an instance measured to hold at full KV over the model's KV cap: the KV room the
    # engine really gives (its memory fraction, paging, block rounding) against the roofline's
    kv_scale: float | None = None

    def __post_init__(self) -> None:
        scale = self.kv_scale
        if scale is not None and not (isinstance(scale, int | float) and math.isfinite(scale) and scale > 0):
            raise SpecError("kv_scale", scale, "must be a finite number > 0 (or unset)")
        step, sessions = self.step_seconds, self.sessions
        if step is not None and not (isinstance(step, int | float) and math.isfinite(step) and step > 0):
            raise SpecError("step_seconds", step, "must be a finite number > 0 (or unset)")
        if sessions is not None and not (
            isinstance(sessions, int | float) and math.isfinite(sessions) and sessions >= 0
        ):
            raise SpecError("sessions", sessions, "must be a finite number >= 0 (or unset)")


# Keys of `Plan.as_dict()` that DESIGN.md fixes for `xpyd plan --json`; tests hold the output to them.
JSON_KEYS = (
    "kv_bytes_per_token",
    "prefill_seconds",
    "attention_factor",
    "decode_step_seconds",
    "decode_batch_cap",
    "decode_batch_bound",
    "concurrency",
    "prefill_instances",
    "decode_instances",
    "transfer_seconds",
    "exposed_transfer_seconds",
    "overlap_feasible",
    "kv_max_bytes_per_token",
    "transfer_feasible",
    "link_demand_bytes_per_second",
    "local_prefill_threshold_tokens",
)


@dataclass(frozen=True)
class Plan:
    """Sizes, predictions and feasibility of every scenario (arrays broadcast from the inputs).

    Infinite values mean "never" (a saturated pool's wait, a local-prefill threshold that remote prefill
    never beats); `as_dict` turns them into null. Infeasible scenarios have 0 instances on the side
    that cannot be built, `feasible` False, and their reasons in words from `explain.explain`.
    """

    kv_bytes_per_token: float
    weight_bytes: float  # W, the model's resident weights
    gpu_hbm_bytes: float
    prefill_seconds: FloatArray  # mean prompt on one prefill instance, hit rate applied
    attention_factor: FloatArray
    prefill_load: FloatArray  # λ·E[S]: busy prefill instances needed on average
    prefill_instances: IntArray
    prefill_binding: LabelArray  # "throughput" | "ttft_quantile"
    prefill_utilisation: FloatArray
    predicted_ttft_seconds: FloatArray  # quantile (or mean) TTFT: wait + prefill + exposed transfer + step
    ttft_floor_seconds: FloatArray  # prefill + exposed transfer + one decode step at the cap, no queueing
    ttft_slo_seconds: FloatArray
    tpot_slo_seconds: FloatArray
    concurrency: FloatArray
    decode_session_seconds: FloatArray  # how long one request holds decode KV, as sized
    decode_session_source: (
        LabelArray  # "predicted" | "measured_tpot" | "measured_sessions" (`DecodeMeasurement`)
    )
    decode_context_tokens: FloatArray  # mean resident context per batch slot
    decode_batch_cap: IntArray
    decode_batch_bound: LabelArray  # "kv_capacity" | "tpot_bandwidth" | "tpot_compute"
    decode_kv_capacity_cap: IntArray
    decode_tpot_cap: IntArray
    decode_instances: IntArray
    decode_binding: LabelArray  # "mean_concurrency" (⌈C/B_cap⌉) | "context_quantile" (session swings)
    decode_step_seconds: FloatArray  # at the sized pool's operating batch: the predicted TPOT
    tpot_floor_seconds: FloatArray  # step overhead + weight read W/β: TPOT at batch → 0
    prefill_weights_fit: BoolArray  # weights W < prefill GPUs × HBM
    decode_weights_fit: BoolArray  # weights W < decode GPUs × HBM (the rest holds KV)
    transfer_bytes: FloatArray  # KV of the mean prompt: L_in·kv
    transfer_seconds: FloatArray  # serialized: L_in·kv/BW + link overhead
    transfer_budget_seconds: FloatArray
    exposed_transfer_seconds: FloatArray  # on the TTFT path after prefill (= serialized without layer-wise)
    overlap_feasible: BoolArray
    kv_max_bytes_per_token: FloatArray  # largest kv whose serialized transfer fits the budget
    transfer_feasible: BoolArray  # the exposed transfer (what TTFT pays) fits the budget
    link_demand_bytes_per_second: FloatArray
    link_capacity_bytes_per_second: FloatArray
    local_prefill_threshold_tokens: FloatArray
    decode_prefill_ratio: FloatArray  # the article's D/P = E[N_out]·t_step(c)/(c·E[t_p]) at c = B_cap
    prefill_gpus: FloatArray
    decode_gpus: FloatArray
    request_flow: RequestFlow  # which session time sized decode (see `PoolConfig`)
    layerwise_transfer: bool  # the transfer overlaps the prefill layer by layer (see `PoolConfig`)

    @property
    def ttft_feasible(self) -> BoolArray:
        return np.asarray(self.prefill_weights_fit & (self.predicted_ttft_seconds <= self.ttft_slo_seconds))

    @property
    def decode_feasible(self) -> BoolArray:
        return np.asarray(self.decode_weights_fit & (self.decode_batch_cap >= 1))

    @property
    def link_feasible(self) -> BoolArray:
        return np.asarray(self.link_demand_bytes_per_second <= self.link_capacity_bytes_per_second)

    @property
    def feasible(self) -> BoolArray:
        """Buildable, and meets TTFT, TPOT, the transfer budget and the link capacity."""
        return np.asarray(
            self.ttft_feasible & self.decode_feasible & self.transfer_feasible & self.link_feasible
        )

    @property
    def slo_attainable(self) -> BoolArray:
        """Some prefill pool meets the TTFT SLO (its floor is under it: more instances only cut the wait),
        and the plan is buildable within TPOT, the transfer budget and the link capacity.

        Where `feasible` is False but this is True, the sizing rule chose too few prefill instances for
        the TTFT with queueing (throughput sizing); a TTFT quantile sizing meets it.
        """
        return np.asarray(
            self.prefill_weights_fit
            & (self.ttft_floor_seconds <= self.ttft_slo_seconds)
            & self.decode_feasible
            & self.transfer_feasible
            & self.link_feasible
        )

    @property
    def prefill_throughput_instances(self) -> IntArray:
        """The seeds' throughput floor ⌈λ·E[S]⌉, whatever sized the pool."""
        return np.asarray(np.ceil(self.prefill_load), np.int64)

    @property
    def total_gpus(self) -> FloatArray:
        result: FloatArray = (
            self.prefill_instances * self.prefill_gpus + self.decode_instances * self.decode_gpus
        )
        return result

    def as_dict(self, index: int | tuple[int, ...] = ()) -> dict[str, object]:
        """One scenario as JSON-ready Python values (infinities become None)."""
        out: dict[str, object] = {}
        for spec in fields(self):
            value = getattr(self, spec.name)
            out[spec.name] = _plain(value if np.ndim(value) == 0 else np.asarray(value)[index])
        derived = ("ttft_feasible", "decode_feasible", "link_feasible", "feasible", "slo_attainable")
        for name in (*derived, "total_gpus", "prefill_throughput_instances"):
            out[name] = _plain(np.asarray(getattr(self, name))[index])
        return out


def _plain(value: object) -> object:
    """numpy scalar → Python scalar; ±inf and NaN → None (JSON has no infinity)."""
    item = value.item() if isinstance(value, np.generic | np.ndarray) else value
    if isinstance(item, float) and not math.isfinite(item):
        return None
    return item


def _batch_within(token_budget: FloatArray, mean: FloatArray, spread: FloatArray, z: float) -> IntArray:
    """Largest B with B·mean + z·spread·√B ≤ token_budget (0 when the budget is not positive)."""
    budget = np.maximum(token_budget, 0)
    if z == 0:
        batch = budget / mean
    else:
        root = (-z * spread + np.sqrt((z * spread) ** 2 + 4 * mean * budget)) / (2 * mean)
        batch = root * root
    return np.floor(batch * (1 + 1e-12)).astype(np.int64)


def _slot_context_moments(
    isl: FloatArray, osl: FloatArray, isl_std: FloatArray, osl_std: FloatArray
) -> tuple[FloatArray, FloatArray]:
    """Mean and std of the resident context of one decode batch slot.

    A slot holds a request at a uniformly random point of its output, and requests stay in proportion
    to their output length (length-biased): E = L_in + E[L_out²]/(2E[L_out]), which is the seeds'
    L_in + L_out/2 when lengths do not vary. Third moments assume normal lengths.
    """
    # Var = σ_in² + E[L_out³]/(3E[L_out]) − (E[L_out²]/(2E[L_out]))², with E[L³] = μ³ + 3μσ² (normal).
    out_half = (osl * osl + osl_std * osl_std) / (2 * osl)
    variance = isl_std * isl_std + (osl * osl + 3 * osl_std * osl_std) / 3 - out_half * out_half
    return isl + out_half, np.sqrt(np.maximum(variance, 0.0))


def _prefill_service_moments(
    model: ModelSpec, gpu: GpuSpec, workload_arrays: dict[str, FloatArray], gpus: FloatArray
) -> tuple[FloatArray, FloatArray]:
    """Mean and squared coefficient of variation of one request's prefill time on one instance.

    S = κ(1−h)(L + L²/L*) for a normal prompt length L (mean μ, std σ); without L*, S = κ(1−h)L.
    """
    mu, sigma = workload_arrays["isl"], workload_arrays["isl_std"]
    kappa = 2 * model.compute_params * (1 - workload_arrays["hit_rate"]) / (gpus * gpu.effective_flops)
    crossover = model.attention_crossover_tokens
    if crossover is None:
        return kappa * mu, (sigma / mu) ** 2
    # E[W] = μ + (μ² + σ²)/L*;  Var[W] = σ²((1 + 2μ/L*)² + 2σ²/L*²) for W = L + L²/L*, L normal.
    mean_work = mu + (mu * mu + sigma * sigma) / crossover
    slope = 1 + 2 * mu / crossover
    variance = sigma * sigma * (slope * slope + 2 * (sigma / crossover) ** 2)
    return kappa * mean_work, variance / (mean_work * mean_work)


def _decode_operating_batch(
    model: ModelSpec,
    gpu: GpuSpec,
    *,
    reserved_rate: FloatArray,
    token_rate: FloatArray,
    instances: IntArray,
    context: FloatArray,
    gpus: FloatArray,
    step_overhead: FloatArray,
) -> FloatArray:
    """Mean batch per decode instance: the fixed point of B = (λ·T_held + λ·L_out·t_step(B)) / y.

    T_held is what a session holds KV for beyond its decode steps (the TTFT when decode-first, the KV
    pull when prefill-first, plus what a live pool measured on top of the roofline).
    t_step(B) = ovh + max(m₀ + m₁B, c₁B) (the roofline of `decode_step_seconds`) is the max of two
    increasing lines, so the fixed point is the larger of the two lines' fixed points. Sizing y from
    the batch cap keeps both slopes λ·L_out·m/y below 1, so both exist; y = 0 means no batch.
    """
    per_instance = 1.0 / np.maximum(instances, 1)
    reserved, flowing = reserved_rate * per_instance, token_rate * per_instance
    memory_slope = context * model.kv_bytes_per_token / (gpus * gpu.effective_bandwidth)
    memory_intercept = step_overhead + model.weight_footprint_bytes / (gpus * gpu.effective_bandwidth)
    compute_slope = 2 * model.compute_params / (gpus * gpu.effective_flops)
    with np.errstate(divide="ignore", invalid="ignore"):
        on_memory = (reserved + flowing * memory_intercept) / (1 - flowing * memory_slope)
        on_compute = (reserved + flowing * step_overhead) / (1 - flowing * compute_slope)
    result: FloatArray = np.where(instances > 0, np.maximum(on_memory, on_compute), 0.0)
    return result


def dp_ratio(
    output_tokens: Numeric, step_seconds: Numeric, batch: Numeric, prefill_seconds: Numeric
) -> FloatArray:
    """The article's decode/prefill GPU ratio D/P = E[N_out]·t_step(c) / (c·E[t_p])."""
    result: FloatArray = (
        np.asarray(output_tokens, np.float64)
        * np.asarray(step_seconds, np.float64)
        / (np.asarray(batch, np.float64) * np.asarray(prefill_seconds, np.float64))
    )
    return result


class _Handoff(NamedTuple):
    """The KV handoff of the mean prompt and the local-prefill threshold."""

    prompt_prefill: FloatArray  # mean prompt on one prefill instance, hit rate applied
    transfer: FloatArray
    exposed: FloatArray
    overlap: BoolArray
    threshold: FloatArray


def _handoff(
    model: ModelSpec, gpu: GpuSpec, link: LinkSpec, w: dict[str, FloatArray], pools: PoolConfig
) -> _Handoff:
    g_p = np.asarray(pools.prefill_gpus, np.float64)
    prompt_prefill = prefill_seconds(model, gpu, w["isl"], g_p, hit_rate=w["hit_rate"])
    # The decode side needs the whole prompt's KV, the cached part included.
    transfer = kv_transfer_seconds(model, link, w["isl"])
    wire = transfer - link.overhead
    if pools.layerwise_transfer:
        # The last layer's KV leaves T_wire/n after the prefill ends, or later when the link is slower
        # than the compute (overlap fails): then the wire time the prefill did not cover stays exposed.
        exposed = link.overhead + np.maximum(
            wire / model.layers, wire - (model.layers - 1) / model.layers * prompt_prefill
        )
    else:
        exposed = transfer
    per_token_compute = 2 * model.compute_params / (g_p * gpu.effective_flops)
    per_token_wire = model.kv_bytes_per_token / link.bandwidth
    with np.errstate(divide="ignore"):
        threshold = np.where(
            per_token_compute > per_token_wire,
            np.asarray(pools.remote_overhead, np.float64) / (per_token_compute - per_token_wire),
            np.inf,
        )
    return _Handoff(
        prompt_prefill, transfer, exposed, np.asarray(per_token_compute >= per_token_wire), threshold
    )


class _Decode(NamedTuple):
    context: FloatArray  # mean resident context per batch slot
    kv_cap: IntArray
    tpot_cap: IntArray
    batch_cap: IntArray
    bound: LabelArray
    weights_fit: BoolArray
    feasible: BoolArray
    step_at_cap: FloatArray
    instances: IntArray
    binding: LabelArray
    step: FloatArray  # at the operating batch: the predicted TPOT
    concurrency: FloatArray
    session: FloatArray  # seconds one request holds decode KV, as sized
    source: LabelArray  # which session time that is (SESSION_SOURCES)
    tpot_floor: FloatArray


def _decode_pool(
    model: ModelSpec,
    gpu: GpuSpec,
    w: dict[str, FloatArray],
    slo: Slo,
    pools: PoolConfig,
    *,
    transfer: FloatArray,
    measured: DecodeMeasurement,
) -> _Decode:
    """Batch cap from KV capacity and the TPOT roofline, then instances by Little's law.

    `transfer` is the serialized KV transfer of the mean prompt: prefill-first, decode allocates the
    prompt's KV when it starts pulling it, so the pull is part of the session.
    """
    rate, osl = w["rate"], w["osl"]
    # KV held before the first decode step: the whole TTFT when decode reserves it on arrival, the pull
    # of the prompt's KV when it allocates it after the prefill.
    held_before_decode = (
        np.asarray(slo.ttft, np.float64) if pools.request_flow == "decode_first" else transfer
    )
    g_d = np.asarray(pools.decode_gpus, np.float64)
    step_overhead = np.asarray(pools.step_overhead, np.float64)
    kv, weights = model.kv_bytes_per_token, model.weight_footprint_bytes
    context, spread = _slot_context_moments(w["isl"], osl, w["isl_std"], w["osl_std"])
    z = 0.0 if slo.context_quantile is None else normal_quantile(slo.context_quantile)
    step_budget = np.asarray(slo.tpot, np.float64) - step_overhead
    usable_hbm = np.asarray(pools.kv_memory_fraction, np.float64) * g_d * gpu.hbm_bytes
    kv_tokens = (usable_hbm - weights) / kv * (measured.kv_scale or 1.0)  # resident tokens per instance
    bandwidth_tokens = (step_budget * g_d * gpu.effective_bandwidth - weights) / kv  # ... read per step
    kv_cap = _batch_within(kv_tokens, context, spread, z)
    bandwidth_cap = _batch_within(bandwidth_tokens, context, spread, z)
    compute_cap = np.floor(
        np.maximum(step_budget, 0) * g_d * gpu.effective_flops / (2 * model.compute_params) * (1 + 1e-12)
    ).astype(np.int64)
    tpot_cap = np.minimum(bandwidth_cap, compute_cap)
    batch_cap = np.minimum(kv_cap, tpot_cap)
    bound = BOUND_LABELS[np.where(kv_cap <= tpot_cap, 0, np.where(bandwidth_cap <= compute_cap, 1, 2))]
    weights_fit = np.asarray(weights < g_d * gpu.hbm_bytes)
    feasible = weights_fit & (batch_cap >= 1)
    step_at_cap = decode_step_seconds(
        model, gpu, np.maximum(batch_cap, 1), context, gpus=g_d, step_overhead=step_overhead
    )
    # Sessions last T_held + L_out·t_step; at full batch t_step = t_step(B_cap) ≤ TPOT SLO, so
    # y·B_cap ≥ λ(T_held + L_out·t_step(B_cap)) is enough (the SLO itself would over-provision). A live
    # pool's slower step or its requests on decode now (`DecodeMeasurement`) replace a prediction they
    # show to be too short.
    predicted_session = held_before_decode + osl * step_at_cap
    timed_session = predicted_session
    if measured.step_seconds is not None:
        timed_session = held_before_decode + osl * np.maximum(step_at_cap, measured.step_seconds)
    session, sessions = timed_session, rate * timed_session
    if measured.sessions is not None:
        # The measured count itself, not rate × (count / rate): a vanishing rate would make that inf × 0.
        sessions = np.where(rate > 0, np.maximum(sessions, measured.sessions), sessions)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            session = np.where(rate > 0, np.maximum(timed_session, measured.sessions / rate), timed_session)
    source = SESSION_SOURCES[
        np.where(session > timed_session, 2, np.where(timed_session > predicted_session, 1, 0))
    ]
    mean_needed = np.ceil(sessions / np.maximum(batch_cap, 1))
    needed = mean_needed
    if z > 0:
        # Sessions in the system are Poisson (M/G/∞), so the pool's resident tokens are compound
        # Poisson: mean C·m, variance C·(m² + s²). Size the pool (balanced routing) for its q-quantile.
        tokens = sessions * context + z * np.sqrt(sessions * (context**2 + spread**2))
        token_budget = np.maximum(np.minimum(kv_tokens, bandwidth_tokens), 1.0)
        count = sessions + z * np.sqrt(sessions)
        needed = np.maximum(
            needed, np.maximum(np.ceil(tokens / token_budget), np.ceil(count / np.maximum(compute_cap, 1)))
        )
    instances = np.where(feasible, needed, 0).astype(np.int64)
    # Whatever the session holds beyond the roofline's decode counts as held KV at the operating batch.
    held = session - osl * step_at_cap
    batch = _decode_operating_batch(
        model,
        gpu,
        reserved_rate=rate * held,
        token_rate=rate * osl,
        instances=instances,
        context=context,
        gpus=g_d,
        step_overhead=step_overhead,
    )
    step = decode_step_seconds(model, gpu, batch, context, gpus=g_d, step_overhead=step_overhead)
    return _Decode(
        context=context,
        kv_cap=np.maximum(kv_cap, 0),
        tpot_cap=np.maximum(tpot_cap, 0),
        batch_cap=np.maximum(batch_cap, 0),
        bound=bound,
        weights_fit=weights_fit,
        feasible=feasible,
        step_at_cap=step_at_cap,
        instances=instances,
        binding=DECODE_BINDING_LABELS[(needed > mean_needed).astype(np.int8)],
        step=step,
        concurrency=rate * (held + osl * step),
        session=np.asarray(session, np.float64),
        source=source,
        tpot_floor=step_overhead + weights / (g_d * gpu.effective_bandwidth),
    )


class _Prefill(NamedTuple):
    load: FloatArray  # λ·E[S]: busy prefill instances needed on average
    instances: IntArray
    binding: LabelArray
    utilisation: FloatArray
    predicted_ttft: FloatArray
    ttft_floor: FloatArray


def _prefill_pool(
    model: ModelSpec,
    gpu: GpuSpec,
    w: dict[str, FloatArray],
    slo: Slo,
    *,
    pools: PoolConfig,
    fixed_latency: FloatArray,
) -> _Prefill:
    """Throughput sizing, or the smallest pool whose TTFT quantile with queueing meets the SLO.

    `fixed_latency` is what every first token pays after its prefill: exposed transfer + one step.
    """
    g_p = np.asarray(pools.prefill_gpus, np.float64)
    mean_service, service_cv2 = _prefill_service_moments(model, gpu, w, g_p)
    load = w["rate"] * mean_service
    throughput_instances = np.ceil(load).astype(np.int64)
    if slo.ttft_quantile is None:
        instances = throughput_instances
        binding = BINDING_LABELS[np.zeros(np.shape(instances), np.int8)]
        service_part = mean_service
        wait = mean_wait(instances, load, mean_service, service_cv2)
    else:
        long_prompt = w["isl"] + normal_quantile(slo.ttft_quantile) * w["isl_std"]
        service_part = prefill_seconds(model, gpu, long_prompt, g_p, hit_rate=w["hit_rate"])
        # An SLO below the no-queue floor cannot be met (reported as such); size it as if no wait at
        # the quantile were allowed, the best queueing can do, so more work never means fewer instances.
        wait_budget = np.maximum(np.asarray(slo.ttft, np.float64) - service_part - fixed_latency, 0.0)
        # Never below ⌈λ·E[S]⌉: the queueing size starts at the first stable pool ⌊a⌋ + 1.
        instances, wait = min_servers_for_wait_quantile(
            load, mean_service, service_cv2, slo.ttft_quantile, wait_budget
        )
        binding = BINDING_LABELS[(instances > throughput_instances).astype(np.int8)]
    ttft_floor = service_part + fixed_latency
    utilisation = np.where(instances > 0, load / np.maximum(instances, 1), 0.0)
    return _Prefill(load, instances, binding, utilisation, wait + ttft_floor, ttft_floor)


def _handoff_and_decode(
    model: ModelSpec,
    gpu: GpuSpec,
    link: LinkSpec,
    workload: Workload,
    slo: Slo,
    *,
    pools: PoolConfig,
    measured: DecodeMeasurement | None,
) -> tuple[dict[str, FloatArray], _Handoff, _Decode]:
    """The workload as arrays, the KV handoff and the decode pool: what prefill's TTFT depends on."""
    w = {
        name: np.asarray(getattr(workload, name), np.float64)
        for name in ("rate", "isl", "osl", "hit_rate", "isl_std", "osl_std")
    }
    handoff = _handoff(model, gpu, link, w, pools)
    decode = _decode_pool(
        model, gpu, w, slo, pools, transfer=handoff.transfer, measured=measured or DecodeMeasurement()
    )
    return w, handoff, decode


def prefill_ttft_quantile(
    model: ModelSpec,
    gpu: GpuSpec,
    link: LinkSpec,
    workload: Workload,
    slo: Slo,
    *,
    instances: Numeric,
    quantile: float,
    pools: PoolConfig | None = None,
    measured: DecodeMeasurement | None = None,
) -> FloatArray:
    """The model's q-quantile TTFT (seconds) on a prefill pool of `instances`, as `size_pools` sizes it.

    The same terms as the TTFT-percentile sizing: the prefill of the q-quantile prompt (mean + z_q·σ),
    the q-quantile queueing wait on that pool, and what every first token pays after its prefill
    (exposed transfer + one decode step at the batch cap). +inf when the pool is saturated. A policy
    compares it with a measured quantile to see how pessimistic the model is at today's pool.
    """
    _quantile("quantile", quantile)
    pools = pools or PoolConfig()
    w, handoff, decode = _handoff_and_decode(model, gpu, link, workload, slo, pools=pools, measured=measured)
    g_p = np.asarray(pools.prefill_gpus, np.float64)
    mean_service, service_cv2 = _prefill_service_moments(model, gpu, w, g_p)
    prompt = w["isl"] + normal_quantile(quantile) * w["isl_std"]
    service = prefill_seconds(model, gpu, prompt, g_p, hit_rate=w["hit_rate"])
    wait = wait_quantile(instances, w["rate"] * mean_service, mean_service, service_cv2, quantile)
    result: FloatArray = service + wait + handoff.exposed + decode.step_at_cap
    return result


def size_pools(
    model: ModelSpec,
    gpu: GpuSpec,
    link: LinkSpec,
    workload: Workload,
    slo: Slo,
    *,
    pools: PoolConfig | None = None,
    measured: DecodeMeasurement | None = None,
) -> Plan:
    """Size both pools for every scenario in the (broadcast) inputs; see the module docstring.

    `measured`: what a live decode pool measured (the controller's); a plan from specs alone has none.
    """
    pools = pools or PoolConfig()
    w, handoff, decode = _handoff_and_decode(model, gpu, link, workload, slo, pools=pools, measured=measured)
    # The first token waits for one decode step; take it at the batch cap (the slowest step the plan
    # allows) so the prefill size never shrinks when more traffic lowers the operating batch.
    prefill = _prefill_pool(
        model, gpu, w, slo, pools=pools, fixed_latency=handoff.exposed + decode.step_at_cap
    )

    budget = np.asarray(slo.ttft if slo.transfer_budget is None else slo.transfer_budget, np.float64)
    g_p = np.asarray(pools.prefill_gpus, np.float64)
    g_d = np.asarray(pools.decode_gpus, np.float64)
    scenario_inputs = [
        *w.values(),
        np.asarray(slo.ttft),
        np.asarray(slo.tpot),
        budget,
        g_p,
        g_d,
        np.asarray(pools.step_overhead),
        np.asarray(pools.remote_overhead),
        np.asarray(pools.kv_memory_fraction),
    ]
    shape = np.broadcast_shapes(*(np.shape(a) for a in scenario_inputs))

    def full(array: npt.NDArray[AnyScalar]) -> npt.NDArray[AnyScalar]:
        return np.broadcast_to(array, shape)

    return Plan(
        kv_bytes_per_token=model.kv_bytes_per_token,
        weight_bytes=model.weight_footprint_bytes,
        gpu_hbm_bytes=gpu.hbm_bytes,
        prefill_seconds=full(handoff.prompt_prefill),
        attention_factor=full(attention_factor(model, w["isl"])),
        prefill_load=full(prefill.load),
        prefill_instances=full(prefill.instances),
        prefill_binding=full(prefill.binding),
        prefill_utilisation=full(prefill.utilisation),
        predicted_ttft_seconds=full(prefill.predicted_ttft),
        ttft_floor_seconds=full(prefill.ttft_floor),
        ttft_slo_seconds=full(np.asarray(slo.ttft, np.float64)),
        tpot_slo_seconds=full(np.asarray(slo.tpot, np.float64)),
        concurrency=full(decode.concurrency),
        decode_session_seconds=full(decode.session),
        decode_session_source=full(decode.source),
        decode_context_tokens=full(decode.context),
        decode_batch_cap=full(decode.batch_cap),
        decode_batch_bound=full(decode.bound),
        decode_kv_capacity_cap=full(decode.kv_cap),
        decode_tpot_cap=full(decode.tpot_cap),
        decode_instances=full(decode.instances),
        decode_binding=full(decode.binding),
        decode_step_seconds=full(decode.step),
        tpot_floor_seconds=full(decode.tpot_floor),
        prefill_weights_fit=full(np.asarray(model.weight_footprint_bytes < g_p * gpu.hbm_bytes)),
        decode_weights_fit=full(decode.weights_fit),
        transfer_bytes=full(w["isl"] * model.kv_bytes_per_token),
        transfer_seconds=full(handoff.transfer),
        transfer_budget_seconds=full(budget),
        exposed_transfer_seconds=full(handoff.exposed),
        overlap_feasible=full(handoff.overlap),
        kv_max_bytes_per_token=full((budget - link.overhead) * link.bandwidth / w["isl"]),
        transfer_feasible=full(handoff.exposed <= budget),
        link_demand_bytes_per_second=full(w["rate"] * w["isl"] * model.kv_bytes_per_token),
        link_capacity_bytes_per_second=full(
            link.bandwidth * np.minimum(prefill.instances * g_p, decode.instances * g_d)
        ),
        local_prefill_threshold_tokens=full(handoff.threshold),
        decode_prefill_ratio=full(
            np.where(
                decode.feasible,
                dp_ratio(
                    w["osl"], decode.step_at_cap, np.maximum(decode.batch_cap, 1), handoff.prompt_prefill
                ),
                0.0,
            )
        ),
        prefill_gpus=full(g_p),
        decode_gpus=full(g_d),
        request_flow=pools.request_flow,
        layerwise_transfer=pools.layerwise_transfer,
    )
