"""Scenarios drawn from one master seed for `generalisation.py`, their traces, and one measured run.

Why generated: a policy tuned on a few hand-picked days can fit them and nothing else. Here every
scenario comes from fixed rules (arrival shapes, mix dynamics, length tails, real traces, model/GPU/SLO
presets, budgets that bind or not) applied to draws from a master seed, so nobody tunes a scenario to
a policy and a different seed is a fresh test set.

A scenario is a product `Scenario` (fleet, realism, SLO, control loop, limits, starting split) plus a
`Recipe`: streams of requests (a rate curve with length classes whose weights move, or a real trace
sped up and thinned) built into a `Trace` with numpy. The master seed fixes the recipes; the run seed
(1, 2, 3, ...) only redraws the requests. Rates are set against the capacity model (`size_pools`,
as `sim/oracles.py` plans windows) so the peak fleet is moderate and a run stays fast.

Everything an outcome depends on beyond the product's sources (the trace builder, the scheduled
hindsight policy, what a run measures) is in this file: the benchmark's cache keys on its digest.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from xpyd_controller.model.presets import GPU_CALIBRATION, GPU_PRESETS, LINK_PRESETS, MODEL_PRESETS
from xpyd_controller.model.roofline import prefill_seconds
from xpyd_controller.model.sizing import Plan, PoolConfig, Slo, Workload, size_pools
from xpyd_controller.policy.limits import clamp
from xpyd_controller.policy.types import Decision, Limits, Observation, Policy
from xpyd_controller.sim.config import Control, Fleet, GoodputSlo, Hardware, Realism, SimConfig
from xpyd_controller.sim.native import run_events
from xpyd_controller.sim.oracles import ORACLE_TTFT_QUANTILE
from xpyd_controller.sim.results import summarise
from xpyd_controller.sim.scenarios import Scenario, Traffic, trace_dir
from xpyd_controller.sim.traces import PiecewiseLinear, Trace, load_trace

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

DEFAULT_MASTER_SEED = 7
SOURCE_DIGEST = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:16]
MODEL_CONTEXT_TOKENS = 131_072  # Llama 3.1 and DeepSeek-V3 both serve a 128k window
WINDOW_S = 300.0  # hindsight windows, and the windows a run reports its misses in
ESTIMATE_BIN_S = 60.0  # capacity estimate: a flash crowd of a few minutes must show at full height
CONTROL = Control(scrape_interval_s=15.0, window_s=60.0, lag_s=15.0, role_conversion=True)
# A run's size: the busier pool at the estimated peak needs this many instances (drawn per scenario),
# unless the run would then exceed MAX_REQUESTS (fast presets with short prompts get smaller fleets).
TARGET_PEAK_INSTANCES = (6, 14)
MAX_REQUESTS = 50_000
DURATION_MIN = (30, 60)
# Synthetic prompts are stretched so a typical request costs about this much prefill time on every
# preset (the DeepSeek fleets would otherwise need hundreds of thousands of chat requests per run).
REFERENCE_PREFILL_S = 0.15
KEEP_MAX = 0.9  # real traces are always thinned a little, so each run seed draws different requests


# ---- presets -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Preset:
    """A model on a GPU at a tensor-parallel width, with its SLO and lifecycle times."""

    key: str
    model: str
    gpu: str
    gpus: int
    ttft_s: float
    tpot_s: float
    cold_start_s: tuple[float, float]  # drawn per scenario: weights to load grow with the model
    conversion_s: float

    def hardware(self) -> Hardware:
        """Calibrated GPU efficiencies and their fitted step overhead; B200 (no public profile) keeps
        the datasheet efficiencies and the built-in scenarios' 5 ms overhead."""
        calibration = GPU_CALIBRATION.get(self.gpu)
        return Hardware(
            MODEL_PRESETS[self.model],
            GPU_PRESETS[self.gpu],
            LINK_PRESETS["ib-400g"],
            step_overhead_s=calibration.step_overhead_s if calibration else 5e-3,
            gpus_per_instance=self.gpus,
        )

    def served_context(self) -> int:
        """The deployment's max context: the model's window, cut to the longest prompt an idle instance
        prefills within 80 % of the TTFT SLO (no split can serve a longer one in time)."""
        hw = self.hardware()
        lengths = np.arange(1024, MODEL_CONTEXT_TOKENS + 1, 1024, dtype=np.float64)
        seconds = prefill_seconds(hw.model, hw.gpu, lengths, self.gpus)
        fits = lengths[seconds <= 0.8 * self.ttft_s]
        return int(fits[-1]) if len(fits) else 1024

    def prompt_scale(self) -> float:
        """How much to stretch synthetic prompts on this preset (1 to 6)."""
        hw = self.hardware()
        seconds = float(prefill_seconds(hw.model, hw.gpu, 2000.0, self.gpus))
        return float(np.clip(REFERENCE_PREFILL_S / seconds, 1.0, 6.0))


PRESETS = (
    Preset("8b-h100", "llama-3.1-8b", "h100-sxm", 1, 1.0, 0.05, (60.0, 90.0), 20.0),
    Preset("8b-a100", "llama-3.1-8b", "a100-80g", 1, 1.5, 0.06, (60.0, 90.0), 20.0),
    Preset("70b-h100-tp4", "llama-3.1-70b", "h100-sxm", 4, 2.0, 0.06, (150.0, 240.0), 30.0),
    Preset("70b-b200-tp2", "llama-3.1-70b", "b200", 2, 1.5, 0.05, (150.0, 240.0), 30.0),
    Preset("dsv3-h200-tp8", "deepseek-v3", "h200", 8, 3.0, 0.07, (240.0, 300.0), 40.0),
    Preset("dsv3-b200-tp8", "deepseek-v3", "b200", 8, 2.5, 0.05, (240.0, 300.0), 40.0),
)


# ---- traffic recipes -------------------------------------------------------------------------------


def _round(value: float) -> float:
    """Six significant digits: recipes print (and key the cache) the same on every machine."""
    return float(f"{value:.6g}")


def curve(times_s: Sequence[float] | FloatArray, values: Sequence[float] | FloatArray) -> PiecewiseLinear:
    return PiecewiseLinear(tuple(_round(t) for t in times_s), tuple(_round(max(v, 0.0)) for v in values))


@dataclass(frozen=True)
class Dist:
    """Token lengths: `lognormal` (a = median, b = sigma), `pareto` (a = minimum, b = alpha)."""

    kind: str
    a: float
    b: float

    def sample(self, rng: np.random.Generator, count: int) -> FloatArray:
        if self.kind == "lognormal":
            return rng.lognormal(math.log(self.a), self.b, count)
        if self.kind == "pareto":
            return self.a * (1.0 + rng.pareto(self.b, count))
        raise ValueError(f"unknown length distribution {self.kind!r}")


def _normal_quantile(q: float) -> float:
    """Standard normal quantile by bisection on erf (a few calls per scenario)."""
    lo, hi = -10.0, 10.0
    for _ in range(80):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if 0.5 * (1 + math.erf(mid / math.sqrt(2))) < q else (lo, mid)
    return (lo + hi) / 2


@dataclass(frozen=True)
class LengthClass:
    """A kind of request (chat, RAG, code, ...): its prompt and output length distributions."""

    name: str
    prompt: Dist
    output: Dist


@dataclass(frozen=True)
class SyntheticStream:
    """Arrivals following `rate` (requests/s; inter-arrival CV `cv`, 1 = Poisson), each request of
    class i with probability weights[i](t) / sum of the weights at its arrival time."""

    rate: PiecewiseLinear
    classes: tuple[LengthClass, ...]
    weights: tuple[PiecewiseLinear, ...]
    cv: float = 1.0


@dataclass(frozen=True)
class TraceStream:
    """A real trace file (under $XPYD_TRACE_DIR) read from `offset_s`, wrapping around at its end,
    `speedup` times faster, each request kept with probability `keep`."""

    file: str
    speedup: float
    offset_s: float
    keep: float


Stream = SyntheticStream | TraceStream


@dataclass(frozen=True)
class Recipe:
    """A run's requests: streams superposed over `duration_s`, lengths clipped to `context_tokens`."""

    duration_s: float
    context_tokens: int
    streams: tuple[Stream, ...]

    def scaled(self, factor: float) -> Recipe:
        """Every stream's rate times `factor` (a trace's through its keep probability)."""
        streams: list[Stream] = []
        for stream in self.streams:
            if isinstance(stream, SyntheticStream):
                rate = curve(stream.rate.times_s, [v * factor for v in stream.rate.values])
                streams.append(dataclasses.replace(stream, rate=rate))
            else:
                streams.append(dataclasses.replace(stream, keep=_round(stream.keep * factor)))
        return dataclasses.replace(self, streams=tuple(streams))


def _arrivals(rng: np.random.Generator, rate: PiecewiseLinear, duration_s: float, cv: float) -> FloatArray:
    """Poisson arrivals by thinning a homogeneous process at the curve's peak; a burstier renewal
    process (CV > 1, Gamma gaps) by mapping unit-rate arrivals through the cumulative rate."""
    if cv == 1.0:
        peak = max(rate.values)
        count = int(rng.poisson(peak * duration_s))
        times = np.sort(rng.uniform(0.0, duration_s, count))
        kept: FloatArray = times[rng.random(count) * peak < rate(times)]
        return kept
    grid = np.linspace(0.0, duration_s, int(duration_s) + 1)
    values = rate(grid)
    cumulative = np.concatenate(([0.0], np.cumsum((values[1:] + values[:-1]) / 2 * np.diff(grid))))
    total = float(cumulative[-1])
    shape = 1.0 / (cv * cv)
    operational = np.cumsum(rng.gamma(shape, 1.0 / shape, int(total + 10 * cv * math.sqrt(total + 1)) + 64))
    while operational[-1] < total:
        more = np.cumsum(rng.gamma(shape, 1.0 / shape, len(operational))) + operational[-1]
        operational = np.concatenate((operational, more))
    mapped: FloatArray = np.interp(operational[operational < total], cumulative, grid)
    return mapped


def _class_weights(stream: SyntheticStream, times: FloatArray) -> FloatArray:
    """Each class's share at each time, rows summing to 1."""
    weights = np.stack([np.asarray(w(times), dtype=np.float64) for w in stream.weights], axis=-1)
    result: FloatArray = weights / np.maximum(weights.sum(axis=-1, keepdims=True), 1e-12)
    return result


def _synthetic(stream: SyntheticStream, recipe: Recipe, rng: np.random.Generator) -> tuple[FloatArray, ...]:
    arrival = _arrivals(rng, stream.rate, recipe.duration_s, stream.cv)
    count = len(arrival)
    shares = np.cumsum(_class_weights(stream, arrival), axis=1)
    picked = (rng.random(count)[:, None] > shares[:, :-1]).sum(axis=1)
    prompt, output = np.empty(count), np.empty(count)
    for index, klass in enumerate(stream.classes):
        chosen = picked == index
        prompt[chosen] = klass.prompt.sample(rng, int(chosen.sum()))
        output[chosen] = klass.output.sample(rng, int(chosen.sum()))
    return arrival, prompt, output, np.zeros(count)


@functools.cache
def source_trace(file: str) -> Trace:
    """A trace file, read once per process (never copied into the repository)."""
    return load_trace(trace_dir() / file)


def _source_times(stream: TraceStream, duration_s: float) -> tuple[FloatArray, IntArray]:
    """Every request of the file that falls in the run (before thinning): run times and source rows."""
    source = source_trace(stream.file)
    times = source.arrival_s
    period = float(times[-1]) + float(times[-1]) / max(len(times) - 1, 1)  # one mean gap past the end
    span = duration_s * stream.speedup
    tiles = int((stream.offset_s + span) // period) + 2
    shifted = np.concatenate([times + k * period for k in range(tiles)]) - stream.offset_s
    rows = np.tile(np.arange(len(times)), tiles)
    inside = (shifted >= 0) & (shifted < span)
    return shifted[inside] / stream.speedup, rows[inside]


def _replayed(stream: TraceStream, recipe: Recipe, rng: np.random.Generator) -> tuple[FloatArray, ...]:
    arrival, rows = _source_times(stream, recipe.duration_s)
    kept = rng.random(len(arrival)) < stream.keep
    source = source_trace(stream.file)
    return tuple(
        np.asarray(column, dtype=np.float64)
        for column in (
            arrival[kept],
            source.prompt_tokens[rows[kept]],
            source.output_tokens[rows[kept]],
            source.prefix_hit_tokens[rows[kept]],
        )
    )


def _stream_requests(stream: Stream, recipe: Recipe, rng: np.random.Generator) -> tuple[FloatArray, ...]:
    if isinstance(stream, SyntheticStream):
        return _synthetic(stream, recipe, rng)
    return _replayed(stream, recipe, rng)


def build_trace(recipe: Recipe, seed: int) -> Trace:
    """The run's requests for `seed`: each stream drawn from its own generator, merged by arrival."""
    parts = [
        _stream_requests(stream, recipe, np.random.default_rng([seed, index]))
        for index, stream in enumerate(recipe.streams)
    ]
    arrival, prompt, output, hits = (np.concatenate([part[i] for part in parts]) for i in range(4))
    order = np.argsort(arrival, kind="stable")
    context = recipe.context_tokens
    prompt_tokens = np.clip(np.rint(prompt[order]), 1, context - 1).astype(np.int64)
    output_tokens = np.clip(np.rint(output[order]), 1, context - prompt_tokens).astype(np.int64)
    hit_tokens = np.minimum(hits[order].astype(np.int64), prompt_tokens - 1)
    return Trace(arrival[order], prompt_tokens, output_tokens, hit_tokens)


@functools.lru_cache(maxsize=4)
def cached_trace(recipe: Recipe, seed: int) -> Trace:
    """One trace per (recipe, seed) per process: a fixed-split search simulates it ~15 times."""
    return build_trace(recipe, seed)


# ---- the capacity estimate -------------------------------------------------------------------------


@dataclass(frozen=True)
class Moments:
    """Per estimate bin: expected requests, and sums of prompt, prompt², output, output², hit tokens."""

    count: FloatArray
    prompt: FloatArray
    prompt_sq: FloatArray
    output: FloatArray
    output_sq: FloatArray
    hits: FloatArray

    def __add__(self, other: Moments) -> Moments:
        return Moments(*(getattr(self, f.name) + getattr(other, f.name) for f in dataclasses.fields(self)))

    def scaled(self, factor: float) -> Moments:
        return Moments(*(getattr(self, f.name) * factor for f in dataclasses.fields(self)))


@functools.cache
def _class_moments(klass: LengthClass, context: int) -> tuple[float, float, float, float]:
    """Mean and mean square of a class's clipped prompt and output lengths (a fixed sample)."""
    rng = np.random.default_rng(0)
    prompt = np.clip(klass.prompt.sample(rng, 20_000), 1, context - 1)
    output = np.clip(klass.output.sample(rng, 20_000), 1, context - prompt)
    return float(prompt.mean()), float((prompt**2).mean()), float(output.mean()), float((output**2).mean())


def _stream_moments(stream: Stream, recipe: Recipe, bins: int) -> Moments:
    edges = np.arange(bins + 1) * ESTIMATE_BIN_S
    if isinstance(stream, SyntheticStream):
        fine = np.linspace(0.0, bins * ESTIMATE_BIN_S, bins * 60 + 1)
        per_second = stream.rate((fine[1:] + fine[:-1]) / 2)
        count = per_second.reshape(bins, 60).sum(axis=1) * (ESTIMATE_BIN_S / 60)
        shares = _class_weights(stream, (edges[1:] + edges[:-1]) / 2)
        moments = np.array([_class_moments(k, recipe.context_tokens) for k in stream.classes])
        mixed = shares @ moments  # per bin: E[p], E[p²], E[o], E[o²]
        return Moments(
            count,
            count * mixed[:, 0],
            count * mixed[:, 1],
            count * mixed[:, 2],
            count * mixed[:, 3],
            0 * count,
        )
    arrival, rows = _source_times(stream, recipe.duration_s)
    source = source_trace(stream.file)
    index = np.minimum((arrival // ESTIMATE_BIN_S).astype(np.int64), bins - 1)
    prompt = np.minimum(source.prompt_tokens[rows], recipe.context_tokens - 1).astype(np.float64)
    output = source.output_tokens[rows].astype(np.float64)
    hits = np.minimum(source.prefix_hit_tokens[rows], prompt - 1).astype(np.float64)

    def binned(values: FloatArray | None) -> FloatArray:
        result: FloatArray = np.bincount(index, weights=values, minlength=bins).astype(np.float64)
        return result * stream.keep

    return Moments(
        binned(None), binned(prompt), binned(prompt**2), binned(output), binned(output**2), binned(hits)
    )


def recipe_moments(recipe: Recipe) -> Moments:
    bins = math.ceil(recipe.duration_s / ESTIMATE_BIN_S)
    total = _stream_moments(recipe.streams[0], recipe, bins)
    for stream in recipe.streams[1:]:
        total = total + _stream_moments(stream, recipe, bins)
    return total


def plan_bins(moments: Moments, preset: Preset, scales: FloatArray) -> Plan:
    """Prefill and decode instances per (scale, bin): the capacity model fed each bin's expected rate
    and length moments, sized as `sim/oracles.py` plans a window."""
    present = np.maximum(moments.count, 1e-9)
    isl = np.maximum(moments.prompt / present, 1.0)
    osl = np.maximum(moments.output / present, 1.0)
    isl_std = np.sqrt(np.maximum(moments.prompt_sq / present - isl**2, 0.0))
    osl_std = np.sqrt(np.maximum(moments.output_sq / present - osl**2, 0.0))
    hits = np.minimum(moments.hits / np.maximum(moments.prompt, 1.0), 0.99)
    hw = preset.hardware()
    plan = size_pools(
        hw.model,
        hw.gpu,
        hw.link,
        Workload(
            rate=scales[:, None] * moments.count / ESTIMATE_BIN_S,
            isl=isl,
            osl=osl,
            hit_rate=hits,
            isl_std=isl_std,
            osl_std=osl_std,
        ),
        Slo(ttft=preset.ttft_s, tpot=preset.tpot_s, ttft_quantile=ORACLE_TTFT_QUANTILE),
        pools=PoolConfig(
            prefill_gpus=preset.gpus,
            decode_gpus=preset.gpus,
            step_overhead=hw.step_overhead_s,
            request_flow="prefill_first",
        ),
    )
    return plan


def choose_scale(
    recipe: Recipe, preset: Preset, target: int, max_requests: int | None = MAX_REQUESTS
) -> float:
    """The largest rate factor whose estimated peak (the busier pool) is at most `target` instances and
    whose run stays within `max_requests`; real traces cap it at KEEP_MAX / their largest keep."""
    moments = recipe_moments(recipe)
    scales = np.geomspace(1e-3, 1e4, 281)
    plan = plan_bins(moments, preset, scales)
    prefill, decode = np.asarray(plan.prefill_instances), np.asarray(plan.decode_instances)
    peak = np.maximum(prefill, decode).max(axis=1)
    fits = peak <= target
    if max_requests is not None:
        fits &= scales * moments.count.sum() <= max_requests
    keeps = [s.keep for s in recipe.streams if isinstance(s, TraceStream)]
    if keeps:
        fits &= scales * max(keeps) <= KEEP_MAX
    return float(scales[fits][-1]) if fits.any() else float(scales[0])


# ---- the generator ---------------------------------------------------------------------------------

CLASSES = (
    "flat-poisson",
    "bursty",
    "flash-crowd",
    "on-off",
    "drop",
    "week",
    "ramp",
    "drift",
    "mix-swing",
    "three-class",
    "tails",
    "real-traces",
)
DRAWS_PER_CLASS = 3
BUDGETS = ("none", "loose", "binding")


@dataclass(frozen=True)
class GenScenario:
    """One generated scenario: the product scenario, how its requests are drawn, what was estimated."""

    name: str
    kind: str  # one of CLASSES
    preset: str
    budget: str  # none, loose (above the estimated peak) or binding (below it)
    scenario: Scenario
    recipe: Recipe
    estimated_peak: tuple[int, int]  # (prefill, decode) instances at the busiest estimate bin

    def trace(self, seed: int) -> Trace:
        return cached_trace(self.recipe, seed)

    @property
    def description(self) -> str:
        return self.scenario.description


@dataclass(frozen=True)
class Draw:
    """What one scenario's rules draw from: its generator, and the preset's prompt stretch and context."""

    rng: np.random.Generator
    duration_s: float
    prompt_scale: float
    context: int

    def uniform(self, low: float, high: float) -> float:
        return _round(float(self.rng.uniform(low, high)))


# Per request kind: prompt (median range at prompt scale 1, sigma) and output (median range, sigma),
# both lognormal.
FAMILY_SHAPES = {
    "chat": ((600.0, 1500.0, 0.8), (150.0, 400.0, 0.8)),
    "rag": ((3000.0, 8000.0, 0.5), (40.0, 150.0, 0.7)),
    "code": ((1500.0, 3000.0, 0.9), (10.0, 40.0, 1.2)),
    "reasoning": ((300.0, 1000.0, 0.8), (800.0, 2000.0, 0.6)),
}
FAMILIES = tuple(FAMILY_SHAPES)
CLIPPED_AT_MOST = 0.01  # share of a kind's prompts that may reach the served context


def length_family(name: str, draw: Draw) -> LengthClass:
    """A request kind: medians drawn, prompts stretched by the preset's scale, and cut so that at most
    1 % of its prompts reach the served context."""
    (low, high, sigma), (out_low, out_high, out_sigma) = FAMILY_SHAPES[name]
    longest = draw.context / math.exp(sigma * _normal_quantile(1 - CLIPPED_AT_MOST))
    median = min(draw.uniform(low * draw.prompt_scale, high * draw.prompt_scale), longest)
    output = Dist("lognormal", draw.uniform(out_low, out_high), out_sigma)
    return LengthClass(name, Dist("lognormal", _round(median), sigma), output)


def _flat(draw: Draw) -> PiecewiseLinear:
    return curve((0.0, draw.duration_s), (1.0, 1.0))


def _steady_mix(draw: Draw) -> tuple[tuple[LengthClass, ...], tuple[PiecewiseLinear, ...]]:
    """Two or three request kinds in fixed proportions (the lengths of the arrival-shape classes)."""
    names = draw.rng.choice(FAMILIES, size=int(draw.rng.integers(2, 4)), replace=False)
    shares = draw.rng.dirichlet(np.ones(len(names)))
    classes = tuple(length_family(str(n), draw) for n in names)
    return classes, tuple(curve((0.0, draw.duration_s), (w, w)) for w in shares)


def _shape(kind: str, draw: Draw) -> tuple[PiecewiseLinear, float, str]:
    """An arrival-shape class: the relative rate curve, the inter-arrival CV and the name's tag."""
    d, u = draw.duration_s, draw.uniform
    if kind == "flat-poisson":
        return _flat(draw), 1.0, "flat-poisson"
    if kind == "bursty":
        cv = u(2.0, 4.0)
        return _flat(draw), cv, f"bursty-cv{cv:.1f}"
    if kind == "flash-crowd":
        k, hold = u(3.0, 6.0), u(120.0, 300.0)
        start, rise, fall = u(0.35, 0.6) * d, u(20.0, 60.0), u(60.0, 120.0)
        crowd = (0.0, start, start + rise, start + rise + hold, start + rise + hold + fall, d)
        return curve(crowd, (1, 1, k, k, 1, 1)), 1.0, f"flash-crowd-{k:.1f}x-{hold / 60:.0f}min"
    if kind == "on-off":
        period, duty, low, edge = u(240.0, 600.0), u(0.4, 0.6), u(0.05, 0.15), 10.0
        switches: list[float] = []
        levels: list[float] = []
        for begin in np.arange(0.0, d, period):
            switches += [begin, begin + duty * period - edge, begin + duty * period, begin + period - edge]
            levels += [1.0, 1.0, low, low]
        return curve(switches, levels), 1.0, f"on-off-{period / 60:.0f}min"
    if kind == "drop":
        level, start, length, back = u(0.01, 0.05), u(0.3, 0.5) * d, u(300.0, 600.0), u(60.0, 120.0)
        dip = (0.0, start, start + 60.0, start + 60.0 + length, start + 60.0 + length + back, d)
        return curve(dip, (1, 1, level, level, 1, 1)), 1.0, f"drop-to-{level * 100:.0f}pct"
    if kind == "week":
        days, swing, weekend = int(draw.rng.integers(3, 8)), u(0.5, 0.8), u(0.5, 0.7)
        day = d / days
        grid = np.linspace(0.0, d, days * 24 + 1)
        weekday = np.where((grid // day).astype(np.int64) % 7 >= 5, weekend, 1.0)
        cycle = weekday * (1 + swing * np.cos(2 * np.pi * (grid / day - 14 / 24)))  # peaks at 14:00
        return curve(grid, cycle), 1.0, f"week-{days}d"
    if kind == "ramp":
        direction, factor = str(draw.rng.choice(["up", "down", "up-down"])), u(2.0, 4.0)
        lo, hi = u(0.1, 0.3) * d, u(0.7, 0.9) * d
        tag = f"ramp-{direction}-{factor:.1f}x"
        if direction == "up-down":
            return curve((0.0, lo, (lo + hi) / 2, hi, d), (1, 1, factor, 1, 1)), 1.0, tag
        a, b = (1.0, factor) if direction == "up" else (factor, 1.0)
        return curve((0.0, lo, hi, d), (a, a, b, b)), 1.0, tag
    raise ValueError(kind)


def _mix(kind: str, draw: Draw) -> tuple[SyntheticStream, str]:
    """A mix-dynamics class: a flat Poisson rate whose request kinds change in proportion."""
    d, u = draw.duration_s, draw.uniform
    classes: tuple[LengthClass, ...]
    weights: tuple[PiecewiseLinear, ...]
    if kind == "drift":
        first, second = (str(n) for n in draw.rng.choice(FAMILIES, size=2, replace=False))
        w0, w1 = u(0.0, 0.2), u(0.8, 1.0)
        times = np.linspace(0.0, d, 13)
        share = w0 + (w1 - w0) * (1 - np.cos(np.pi * times / d)) / 2
        classes = (length_family(first, draw), length_family(second, draw))
        weights = (curve(times, 1 - share), curve(times, share))
        return SyntheticStream(_flat(draw), classes, weights), f"drift-{first}-to-{second}"
    if kind == "mix-swing":
        period, depth = u(60.0, 300.0), u(0.35, 0.5)
        times = np.arange(0.0, d + period / 8, period / 8)
        share = 0.5 + depth * np.sin(2 * np.pi * times / period)
        classes = (length_family("reasoning", draw), length_family("rag", draw))
        weights = (curve(times, 1 - share), curve(times, share))
        return SyntheticStream(_flat(draw), classes, weights), f"mix-swing-{period / 60:.1f}min"
    if kind == "three-class":
        knots = int(draw.rng.integers(4, 7))
        times = np.linspace(0.0, d, knots)
        shares = draw.rng.dirichlet(np.full(3, 0.7), size=knots)
        classes = tuple(length_family(n, draw) for n in ("chat", "rag", "code"))
        weights = tuple(curve(times, shares[:, i]) for i in range(3))
        return SyntheticStream(_flat(draw), classes, weights), "three-class-chat-rag-code"
    raise ValueError(kind)


def _tails(draw: Draw) -> tuple[SyntheticStream, str]:
    """One request kind with heavy-tailed prompts and outputs; at most 1 % of the prompts reach the
    served context (clipped there: longer ones no split could serve in time)."""
    u, most = draw.uniform, 1 - CLIPPED_AT_MOST
    if draw.rng.random() < 0.5:
        sigma, out_sigma = u(1.0, 1.4), u(1.0, 1.4)
        median = min(
            u(500.0, 1200.0) * draw.prompt_scale, draw.context / math.exp(sigma * _normal_quantile(most))
        )
        prompt, output = (
            Dist("lognormal", _round(median), sigma),
            Dist("lognormal", u(80.0, 250.0), out_sigma),
        )
        tag = f"tail-lognormal-s{sigma:.1f}"
    else:
        alpha, out_alpha = u(1.6, 2.2), u(1.5, 2.0)
        least = min(u(300.0, 800.0) * draw.prompt_scale, draw.context * CLIPPED_AT_MOST ** (1 / alpha))
        prompt, output = Dist("pareto", _round(least), alpha), Dist("pareto", u(30.0, 100.0), out_alpha)
        tag = f"tail-pareto-a{alpha:.1f}"
    klass = LengthClass(tag.removeprefix("tail-"), prompt, output)
    return SyntheticStream(_flat(draw), (klass,), (_flat(draw),)), tag


TRACE_FILES = {
    "conv": "azure2023_conv.csv",
    "code": "azure2023_code.csv",
    "mooncake": "mooncake_conversation.jsonl",
}
TRACE_MIXES = (("conv", "code"), ("conv", "code", "mooncake"), ("code", "mooncake"))


def _replay(draw: Draw, index: int) -> tuple[tuple[TraceStream, ...], str]:
    """Real traces sped up 2-8x, each from its own offset at its own weight, superposed."""
    names = TRACE_MIXES[index % len(TRACE_MIXES)]
    u = draw.uniform
    streams = tuple(TraceStream(TRACE_FILES[n], u(2.0, 8.0), u(0.0, 3600.0), u(0.3, 1.0)) for n in names)
    speeds = "-".join(f"{s.speedup:.0f}" for s in streams)
    return streams, f"traces-{'+'.join(names)}-{speeds}x"


def _unit_recipe(kind: str, index: int, draw: Draw) -> tuple[Recipe, str]:
    """The scenario's streams at a relative rate (scaled to the capacity estimate afterwards)."""
    streams: tuple[Stream, ...]
    if kind in ("drift", "mix-swing", "three-class"):
        stream, tag = _mix(kind, draw)
        streams = (stream,)
    elif kind == "tails":
        stream, tag = _tails(draw)
        streams = (stream,)
    elif kind == "real-traces":
        streams, tag = _replay(draw, index)
    else:
        rate, cv, tag = _shape(kind, draw)
        classes, weights = _steady_mix(draw)
        streams = (SyntheticStream(rate, classes, weights, cv),)
    return Recipe(draw.duration_s, draw.context, streams), tag


def draw_scenario(kind: str, index: int, key: tuple[int, ...], preset: Preset, budget: str) -> GenScenario:
    """One scenario. Its traffic is drawn from its own generator, so that a run too long for
    MAX_REQUESTS at the target fleet is redrawn identically over fewer minutes (down to 30)."""
    rng = np.random.default_rng(key)
    drawn_s = 60.0 * int(rng.integers(DURATION_MIN[0], DURATION_MIN[1] + 1))
    target = int(rng.integers(TARGET_PEAK_INSTANCES[0], TARGET_PEAK_INSTANCES[1] + 1))

    def unit_recipe(duration_s: float) -> tuple[Recipe, str]:
        traffic_rng = np.random.default_rng((*key, 1))
        return _unit_recipe(
            kind, index, Draw(traffic_rng, duration_s, preset.prompt_scale(), preset.served_context())
        )

    unit, tag = unit_recipe(drawn_s)
    wanted = choose_scale(unit, preset, target, max_requests=None) * float(recipe_moments(unit).count.sum())
    if wanted > MAX_REQUESTS:
        shorter = 60.0 * max(DURATION_MIN[0], math.floor(drawn_s * MAX_REQUESTS / wanted / 60.0))
        if shorter < drawn_s:
            unit, tag = unit_recipe(shorter)
    recipe = unit.scaled(choose_scale(unit, preset, target))
    duration = recipe.duration_s
    moments = recipe_moments(recipe)
    plan = plan_bins(moments, preset, np.ones(1))
    prefill, decode = (
        np.maximum(np.asarray(a)[0], 1) for a in (plan.prefill_instances, plan.decode_instances)
    )
    peak_prefill, peak_decode = int(prefill.max()), int(decode.max())
    peak_instances = int((prefill + decode).max())
    # Binding: below the plan's peak (which keeps TTFT-quantile headroom), but not below what the
    # peak's prefill work and the planned decode pool need to keep queues finite (prefill at 90 %
    # busy), where every policy would collapse alike.
    busy = int(np.ceil(np.asarray(plan.prefill_load)[0] / 0.9 + decode).max())
    g = preset.gpus
    gpu_budget = {
        "none": None,
        "loose": g * math.ceil(1.5 * peak_instances),
        "binding": g * max(2, min(peak_instances - 1, busy)),
    }[budget]
    limits = Limits(
        prefill_min=1,
        prefill_max=min(64, max(12, 3 * peak_prefill)),
        decode_min=1,
        decode_max=min(64, max(12, 3 * peak_decode)),
        gpu_budget=gpu_budget,
    )
    realism = Realism(
        kv_capacity=True,
        layerwise_transfer=True,
        decode_kv_reads=True,  # a decode step reads its batch's KV as well as the weights, as on a GPU
        cold_start_s=_round(rng.uniform(*preset.cold_start_s)),
        conversion_s=preset.conversion_s,
    )
    # The fleet an operator brings up for the first minutes: no policy could have a larger one ready
    # before a cold start and a scrape have passed (a fixed split is ready from the start).
    first = math.ceil((realism.cold_start_s + CONTROL.scrape_interval_s) / ESTIMATE_BIN_S)
    start = clamp(int(prefill[:first].max()), int(decode[:first].max()), limits, g, g)
    slo = GoodputSlo(ttft_s=preset.ttft_s, tpot_s=preset.tpot_s, max_token_gap_s=None)
    config = SimConfig(preset.hardware(), Fleet("disagg", start.prefill, start.decode), realism, slo, CONTROL)
    mean_rate = float(moments.count.sum()) / duration
    name = f"{tag}-{preset.key}" + ("-budget" if budget == "binding" else "")
    budget_text = "no GPU budget" if gpu_budget is None else f"{budget} GPU budget {gpu_budget}"
    description = (
        f"{duration / 60:.0f} min at a mean {mean_rate:.1f} req/s, {preset.model} on {g}x {preset.gpu} "
        f"instances, estimated peak {peak_prefill}P/{peak_decode}D, {budget_text}, "
        f"start {start.prefill}P+{start.decode}D, cold start {realism.cold_start_s:.0f} s"
    )
    scenario = Scenario(
        name=name,
        description=description,
        config=config,
        # For readers only (no product traffic kind says this): the requests come from the recipe.
        traffic=Traffic("poisson", rate=_round(max(mean_rate, 1e-3)), duration_s=duration),
        limits=limits,
    )
    return GenScenario(name, kind, preset.key, budget, scenario, recipe, (peak_prefill, peak_decode))


def generate(master_seed: int = DEFAULT_MASTER_SEED) -> list[GenScenario]:
    """Every class DRAWS_PER_CLASS times, presets and budgets rotated so each class sees three presets
    and each budget kind; the same master seed always gives the same scenarios."""
    order = np.random.default_rng([master_seed, 0]).permutation(len(PRESETS))
    scenarios: list[GenScenario] = []
    for c, kind in enumerate(CLASSES):
        for draw in range(DRAWS_PER_CLASS):
            preset = PRESETS[int(order[(c + 2 * draw) % len(PRESETS)])]
            budget = BUDGETS[(c + draw) % len(BUDGETS)]
            scenarios.append(draw_scenario(kind, draw, (master_seed, 1, c, draw), preset, budget))
    seen: dict[str, int] = {}
    unique = []
    for gen in scenarios:
        seen[gen.name] = seen.get(gen.name, 0) + 1
        name = gen.name if seen[gen.name] == 1 else f"{gen.name}-{seen[gen.name]}"
        unique.append(
            dataclasses.replace(gen, name=name, scenario=dataclasses.replace(gen.scenario, name=name))
        )
    return unique


# ---- one measured run ------------------------------------------------------------------------------


class ScheduledPolicy:
    """Per window, the sizes of a schedule, asked for a lead time early (as `HindsightWindowOracle`
    asks for the model's plan), clamped to the limits and the GPU budget."""

    name = "hindsight"

    def __init__(self, prefill: Sequence[int], decode: Sequence[int], lead_s: float, gpus: int) -> None:
        self.prefill, self.decode = [int(p) for p in prefill], [int(d) for d in decode]
        self.lead_s = lead_s
        self.gpus = gpus

    def decide(self, observation: Observation, limits: Limits) -> Decision:
        last = len(self.prefill) - 1
        first = min(int(observation.time_s // WINDOW_S), last)
        until = min(int((observation.time_s + self.lead_s) // WINDOW_S), last)
        bounded = clamp(
            max(self.prefill[first : until + 1]),
            max(self.decode[first : until + 1]),
            limits,
            self.gpus,
            self.gpus,
        )
        return Decision(
            bounded.prefill, bounded.decode, bounded.binding or "schedule", ("Hindsight", *bounded.reasons)
        )


def measure(
    gen: GenScenario,
    seed: int,
    make_policy: Callable[[SimConfig, Trace], Policy] | None = None,
    fleet: tuple[int, int] | None = None,
) -> dict[str, float]:
    """Simulate one run (a policy in the loop, or a fixed `fleet` with none) and summarise it.

    Besides the headline metrics: per 5-minute window of arrivals, its requests (`n{w}`), TTFT misses
    (`ttft{w}`), TPOT-only misses (`tpot{w}`) and the mean prefill queue (`pq{w}`) and decode wait
    (`dw{w}`) over its scrapes, from which the hindsight reference blames a pool.
    """
    trace = gen.trace(seed)
    config = gen.scenario.config
    if fleet is not None:
        config = dataclasses.replace(config, fleet=Fleet("disagg", *fleet))
    policy = make_policy(config, trace) if make_policy is not None else None
    raw = run_events(config, trace, policy, gen.scenario.limits)
    result = summarise(trace, raw, config.slo)
    metrics = {
        "goodput": result.goodput,
        "gpu_hours": result.gpu_hours,
        "ttft_p99": result.ttft_p99,
        "tpot_p99": result.tpot_p99 * 1e3,
        "scale_ups": float(result.scale_ups),
        "conversions": float(result.conversions),
        "requests": float(result.requests),
    }
    arrival, outputs = trace.arrival_s, trace.output_tokens
    first, finish = np.asarray(raw.first_token_s), np.asarray(raw.finish_s)
    ttft_miss = first - arrival > config.slo.ttft_s
    tpot = np.where(outputs > 1, (finish - first) / np.maximum(outputs - 1, 1), 0.0)
    assert config.slo.tpot_s is not None
    tpot_miss = ~ttft_miss & (tpot > config.slo.tpot_s)
    window = (arrival // WINDOW_S).astype(np.int64)
    size = int(window.max()) + 1
    # The pools' queues, sampled each scrape: requests waiting for prefill, and requests waiting on
    # decode (for KV room or the pull) after theirs, which a TTFT miss can be just as well.
    sampled = np.array([(s.time_s, s.prefill_queue, s.decode_waiting) for s in raw.samples])
    at = (sampled[:, 0] // WINDOW_S).astype(np.int64)
    scrapes = np.maximum(np.bincount(at, minlength=size)[:size], 1)
    for label, column in (("pq", 1), ("dw", 2)):
        mean = np.bincount(at, weights=sampled[:, column], minlength=size)[:size] / scrapes
        metrics.update({f"{label}{w}": float(m) for w, m in enumerate(mean)})
    for label, weights in (("n", None), ("ttft", ttft_miss), ("tpot", tpot_miss)):
        counts = np.bincount(
            window, weights=None if weights is None else weights.astype(np.float64), minlength=size
        )
        metrics.update({f"{label}{w}": float(c) for w, c in enumerate(counts)})
    return metrics


def windows(metrics: dict[str, float]) -> int:
    """How many 5-minute windows a run's metrics report."""
    return sum(1 for key in metrics if key.startswith("n") and key[1:].isdigit())
