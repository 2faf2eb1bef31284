"""Scenarios: a fleet configuration plus a traffic recipe, built in by name or read from YAML/JSON.

A scenario file mirrors the dataclasses field by field (see `BUILTIN` for complete examples)::

    name: my-day
    hardware: {model: llama-3.1-8b, gpu: h100-sxm, link: ib-400g, step_overhead_s: 0.005}  # calibrated preset
    fleet: {mode: disagg, prefill: 3, decode: 3}
    realism: {kv_capacity: true, cold_start_s: 120, conversion_s: 20}
    slo: {ttft_s: 1.0, tpot_s: 0.05, max_token_gap_s: null}
    control: {scrape_interval_s: 15, role_conversion: true}
    limits: {prefill_max: 16, decode_max: 16}
    policy: xpyd
    traffic: {kind: diurnal, rate: 10, swing: 0.6, duration_s: 86400,
              lengths: {kind: uniform, prompt: [500, 4000], output: [50, 400]}}

Traffic kinds: `seed` (the article's draws: rate, count), `poisson` (rate, duration_s or count),
`gamma` (rate, cv, duration_s), `step` (rate → after at at_s), `diurnal` (rate, swing), `drift`
(rate, a mix moving between `lengths` and `second_lengths` once per `mix_period_s`, a day by default),
`trace` (path of an Azure CSV or Mooncake JSONL file). Lengths: `uniform` (prompt/output ranges) or `file` (path: resample a trace's
pairs). Relative paths resolve against the scenario file; `$XPYD_TRACE_DIR` (default
/work/shared/traces) against nothing else.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from xpyd_controller.model.presets import DATASHEET_GPUS, LINK_PRESETS, MODEL_PRESETS
from xpyd_controller.model.resolve import PresetError, resolve_gpu, resolve_link, resolve_model
from xpyd_controller.model.specs import GpuSpec, LinkSpec, ModelSpec, SpecError
from xpyd_controller.policy.types import Limits
from xpyd_controller.sim.config import (
    Control,
    Fleet,
    GoodputSlo,
    Hardware,
    Realism,
    SimConfig,
    SimConfigError,
)
from xpyd_controller.sim.seed import SEED_ARRIVALS, SEED_HARDWARE, SEED_SLO, seed_requests
from xpyd_controller.sim.traces import Trace, TraceError
from xpyd_controller.sim.traces.records import DAY_S

if TYPE_CHECKING:
    from xpyd_controller.sim.traces import LengthDistribution

TRACE_DIR_ENV = "XPYD_TRACE_DIR"
DEFAULT_TRACE_DIR = "/work/shared/traces"
TRAFFIC_KINDS = ("seed", "poisson", "gamma", "step", "diurnal", "drift", "trace")
RAG_PEAK_FRACTION = 11 / 24  # drift: the mix is most RAG-like at 11:00 of a day, wherever the period


def trace_dir() -> Path:
    """Where built-in scenarios look for third-party trace files (never part of the repository)."""
    return Path(os.environ.get(TRACE_DIR_ENV, DEFAULT_TRACE_DIR))


@dataclass(frozen=True)
class Lengths:
    """A length distribution by kind: uniform ranges, or the (prompt, output) pairs of a trace file."""

    kind: str = "uniform"
    prompt: tuple[int, int] = (500, 8000)
    output: tuple[int, int] = (80, 480)
    path: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in ("uniform", "file"):
            raise SimConfigError("lengths.kind", self.kind, "must be uniform or file")
        if self.kind == "file" and not self.path:
            raise SimConfigError("lengths.path", self.path, "a file length distribution needs a path")

    def build(self) -> LengthDistribution:
        from xpyd_controller.sim.traces import UniformLengths, empirical_lengths  # numpy

        if self.kind == "file":
            assert self.path is not None
            return empirical_lengths(self.path)
        return UniformLengths(self.prompt[0], self.prompt[1], self.output[0], self.output[1])


@dataclass(frozen=True)
class Traffic:
    """How to draw the requests (see the module docstring for the kinds and their fields)."""

    kind: str = "seed"
    rate: float = 8.0
    count: int | None = None
    duration_s: float | None = None
    cv: float = 1.0
    after: float | None = None  # step: the rate after `at_s`
    at_s: float | None = None
    swing: float = 0.5  # diurnal: relative amplitude
    hit_fraction: float = 0.0
    lengths: Lengths = field(default_factory=Lengths)
    second_lengths: Lengths | None = None  # drift: the RAG/code-like end of the mix
    mix_period_s: float = DAY_S  # drift: one full chat → RAG → chat swing of the mix
    path: str | None = None  # trace

    def __post_init__(self) -> None:
        if self.kind not in TRAFFIC_KINDS:
            raise SimConfigError("traffic.kind", self.kind, f"must be one of {', '.join(TRAFFIC_KINDS)}")
        if not self.rate > 0:
            raise SimConfigError("traffic.rate", self.rate, "must be > 0 requests/s")
        if not (math.isfinite(self.mix_period_s) and self.mix_period_s > 0):
            raise SimConfigError("traffic.mix_period_s", self.mix_period_s, "must be a finite number > 0 s")
        if not 0 <= self.hit_fraction < 1:
            raise SimConfigError("traffic.hit_fraction", self.hit_fraction, "must be in [0, 1)")
        needs = {
            "step": ("after", "at_s", "duration_s"),
            "gamma": ("duration_s",),
            "drift": ("second_lengths",),
            "trace": ("path",),
        }.get(self.kind, ())
        for name in needs:
            if getattr(self, name) is None:
                raise SimConfigError(f"traffic.{name}", None, f"required for traffic kind {self.kind!r}")

    def build(self, seed: int, rate: float | None = None) -> Trace:
        """The requests for `seed`; `rate` overrides the scenario's (mean) rate."""
        rate = self.rate if rate is None else rate
        scale = rate / self.rate
        if self.kind == "seed":
            low, high = self.lengths.prompt, self.lengths.output
            return seed_requests(rate, self.count or SEED_ARRIVALS, seed, low, high)
        import numpy as np  # every other kind is drawn (or read) with numpy

        from xpyd_controller.sim.traces import load_trace

        if self.kind == "trace":
            assert self.path is not None
            trace = load_trace(self.path)
            return trace if rate == self.rate else trace.with_time_scale(1 / scale)
        trace = self._synthetic(seed, rate, scale)
        if not self.hit_fraction:
            return trace
        hits = np.floor(trace.prompt_tokens * self.hit_fraction).astype(np.int64)
        return Trace(trace.arrival_s, trace.prompt_tokens, trace.output_tokens, hits, name=trace.name)

    def _synthetic(self, seed: int, rate: float, scale: float) -> Trace:
        from xpyd_controller.sim.traces import Diurnal, diurnal, gamma_bursts, mix_drift_day, step, synthesize

        lengths = self.lengths.build()
        duration = self.duration_s
        if self.kind == "poisson":
            if self.count is None and duration is None:
                duration = 3600.0
            return synthesize(
                seed,
                rate,
                lengths,
                duration_s=duration,
                count=self.count,
                cv=self.cv,
                name=f"poisson-{rate:g}",
            )
        if self.kind == "gamma":
            assert duration is not None  # checked at construction
            return gamma_bursts(seed, rate, self.cv, lengths, duration_s=duration)
        if self.kind == "step":
            assert duration is not None and self.after is not None and self.at_s is not None
            return step(seed, rate, self.after * scale, self.at_s, lengths, duration_s=duration)
        if self.kind == "diurnal":
            return diurnal(seed, rate, self.swing, lengths, duration_s=duration or DAY_S)
        assert self.second_lengths is not None
        curve = Diurnal(rate, self.swing) if self.swing else rate
        return mix_drift_day(
            seed,
            curve,
            lengths,
            self.second_lengths.build(),
            duration_s=duration or DAY_S,
            rag_peak_s=RAG_PEAK_FRACTION * self.mix_period_s,
            period_s=self.mix_period_s,
        )


@dataclass(frozen=True)
class Scenario:
    """A named, reproducible experiment: the fleet, its traffic, the policy and its limits."""

    name: str
    description: str
    config: SimConfig
    traffic: Traffic
    policy: str | None = None
    limits: Limits = field(default_factory=Limits)
    step_at_s: float | None = None  # for time-to-recover


# ---- built-ins -------------------------------------------------------------------------------------

_CHAT = Lengths("uniform", (100, 2000), (50, 500))
_RAG = Lengths("uniform", (2000, 8000), (10, 100))
# The built-ins run the datasheet H100 at the seeds' efficiencies (MFU 0.4, MBU 1), not the calibrated
# preset: every benchmark table was measured on these fleets, and they stay comparable with the seeds.
_H100 = DATASHEET_GPUS["h100-sxm"]
_H100_8B = Hardware(MODEL_PRESETS["llama-3.1-8b"], _H100, LINK_PRESETS["ib-400g"], step_overhead_s=5e-3)
_REALISTIC = Realism(kv_capacity=True, layerwise_transfer=True, cold_start_s=120.0, conversion_s=20.0)
_DAY_SLO = GoodputSlo(ttft_s=1.0, tpot_s=0.05, max_token_gap_s=None)
_DAY_CONTROL = Control(scrape_interval_s=15.0, window_s=60.0, lag_s=15.0, role_conversion=True)
_DAY_LIMITS = Limits(prefill_min=1, prefill_max=32, decode_min=1, decode_max=32)


# Role conversion: 70B on 4×H100 instances (weights take most of the HBM, so KV room is scarce and
# long chat answers need several decode instances) swinging every 2 h at a flat rate between long-output
# chat (decode-heavy) and long-prompt RAG (prefill-heavy). Cold start 5 min (141 GB of weights), a
# conversion 30 s.
_LONG_CHAT = Lengths("uniform", (1000, 3000), (1000, 3000))
_LONG_RAG = Lengths("uniform", (4000, 12000), (20, 150))
_H100_70B_TP4 = Hardware(
    MODEL_PRESETS["llama-3.1-70b"],
    _H100,
    LINK_PRESETS["ib-400g"],
    step_overhead_s=5e-3,
    gpus_per_instance=4,
)
_SWING_REALISM = Realism(
    kv_capacity=True, layerwise_transfer=True, decode_kv_reads=True, cold_start_s=300.0, conversion_s=30.0
)
_SWING_SLO = GoodputSlo(ttft_s=2.0, tpot_s=0.06, max_token_gap_s=None)
_SWING_LIMITS = Limits(prefill_min=1, prefill_max=16, decode_min=1, decode_max=16)


def mix_swing(hours: float = 4.0, rate: float = 6.0, name: str = "mix-swing") -> Scenario:
    """The role-conversion scenario (`mix-swing`), `hours` long (the mix swings every 2 h).

    At 8 req/s (`mix-swing-heavy-chat`) the chat phase runs the decode KV cache full, so requests
    wait for decode admission after their prefill: the case where a TTFT miss is decode's.
    """
    return Scenario(
        name=name,
        description=(
            f"{hours:g} h at a flat {rate:g} req/s, 70B on 4-GPU H100 instances, the mix swinging every 2 h "
            "between long-output chat and long-prompt RAG (prefill and decode needs move oppositely)"
        ),
        config=SimConfig(_H100_70B_TP4, Fleet("disagg", 2, 3), _SWING_REALISM, _SWING_SLO, _DAY_CONTROL),
        traffic=Traffic(
            "drift",
            rate=rate,
            swing=0.0,
            duration_s=hours * 3600.0,
            mix_period_s=2 * 3600.0,
            lengths=_LONG_CHAT,
            second_lengths=_LONG_RAG,
        ),
        policy="xpyd",
        limits=_SWING_LIMITS,
    )


def _azure(name: str) -> Lengths:
    return Lengths("file", path=str(trace_dir() / f"azure2023_{name}.csv"))


def _day(name: str, description: str, traffic: Traffic, split: tuple[int, int]) -> Scenario:
    return Scenario(
        name=name,
        description=description,
        config=SimConfig(_H100_8B, Fleet("disagg", *split), _REALISTIC, _DAY_SLO, _DAY_CONTROL),
        traffic=traffic,
        policy="static",
        limits=_DAY_LIMITS,
        step_at_s=traffic.at_s,
    )


def builtin_scenarios() -> dict[str, Scenario]:
    """Built-in scenarios by name (built on demand: the Azure ones name files under XPYD_TRACE_DIR)."""
    seed = Scenario(
        name="seed-8gpu",
        description="the seed article: 8B fp16, H100-class, 8 GPUs, U[500,8000]/U[80,480], 6000 arrivals",
        config=SimConfig(SEED_HARDWARE, Fleet("colocated", 0, 8), slo=SEED_SLO),
        traffic=Traffic("seed", rate=8.0, count=SEED_ARRIVALS),
    )
    return {
        seed.name: seed,
        "drift-day": _day(
            "drift-day",
            "24 h at a diurnal 30 req/s whose mix drifts between chat-like and RAG-like lengths",
            Traffic("drift", rate=30.0, swing=0.5, lengths=_CHAT, second_lengths=_RAG),
            (4, 4),
        ),
        "azure-drift-day": _day(
            "azure-drift-day",
            "24 h at a diurnal 40 req/s drifting between the Azure 2023 conversation and code lengths",
            Traffic("drift", rate=40.0, swing=0.5, lengths=_azure("conv"), second_lengths=_azure("code")),
            (4, 4),
        ),
        "step-10-20": _day(
            "step-10-20",
            "Poisson 10 req/s stepping to 20 req/s after 30 min (chat-like lengths), 1 h",
            Traffic("step", rate=10.0, after=20.0, at_s=1800.0, duration_s=3600.0, lengths=_CHAT),
            (2, 4),
        ),
        "diurnal-day": _day(
            "diurnal-day",
            "24 h diurnal Poisson around 40 req/s (swing 0.8), chat-like lengths",
            Traffic("diurnal", rate=40.0, swing=0.8, duration_s=DAY_S, lengths=_CHAT),
            (2, 4),
        ),
        "mix-swing": mix_swing(),
        "mix-swing-heavy-chat": mix_swing(rate=8.0, name="mix-swing-heavy-chat"),
    }


# ---- files -----------------------------------------------------------------------------------------


def _from_mapping(cls: type[Any], data: object, where: str, nested: Mapping[str, Any] | None = None) -> Any:
    """Build dataclass `cls` from a mapping, rejecting unknown keys and wrong shapes by field name."""
    if not isinstance(data, Mapping):
        raise SimConfigError(where, data, "must be a mapping")
    known = {f.name for f in dataclasses.fields(cls)}
    values: dict[str, Any] = {}
    for key, value in data.items():
        if key not in known:
            raise SimConfigError(f"{where}.{key}", value, f"unknown field; known: {', '.join(sorted(known))}")
        build = (nested or {}).get(key)
        values[key] = build(value, f"{where}.{key}") if build and value is not None else value
        if isinstance(values[key], list):
            values[key] = tuple(values[key])
    try:
        return cls(**values)
    except (SimConfigError, SpecError, TraceError):
        raise
    except (TypeError, ValueError) as err:
        raise SimConfigError(where, dict(data), f"invalid: {err}") from err


Resolver = Callable[[str | None, Mapping[str, Any], str, Callable[[str], str]], Any]


def _preset(resolve: Resolver, cls: type[Any], value: object, where: str) -> Any:
    """A preset name, a mapping with `preset` and overrides (the rule of model/resolve.py, as for a
    PDDeployment and `xpyd plan`), or a mapping of every field."""
    if not isinstance(value, str | Mapping) or (isinstance(value, Mapping) and "preset" not in value):
        return _from_mapping(cls, value, where)
    preset, overrides, field = value, {}, where
    if isinstance(value, Mapping):
        preset, field = value["preset"], f"{where}.preset"
        overrides = {key: item for key, item in value.items() if key != "preset"}
    if not isinstance(preset, str):
        raise SimConfigError(field, preset, "must be a preset name")
    try:
        return resolve(preset, overrides, field, lambda name: f"{where}.{name}")
    except PresetError as error:  # a scenario file's mistakes are SimConfigErrors, as everywhere else
        raise SimConfigError(error.field, error.value, error.rule) from None


def _resolve(base: Path, value: object, where: str) -> str:
    if not isinstance(value, str):
        raise SimConfigError(where, value, "must be a path string")
    path = Path(os.path.expandvars(value))
    return str(path if path.is_absolute() else base / path)


def scenario_from_mapping(data: object, base: Path = Path()) -> Scenario:
    """Validate and build a scenario from parsed YAML/JSON; relative paths resolve against `base`."""

    def lengths(value: object, where: str) -> Lengths:
        extra = {"path": lambda v, w: _resolve(base, v, w)}
        return _from_mapping(Lengths, value, where, extra)  # type: ignore[no-any-return]

    def hardware(value: object, where: str) -> Hardware:
        parts = {
            "model": lambda v, w: _preset(resolve_model, ModelSpec, v, w),
            "gpu": lambda v, w: _preset(resolve_gpu, GpuSpec, v, w),
            "link": lambda v, w: _preset(resolve_link, LinkSpec, v, w),
        }
        return _from_mapping(Hardware, value, where, parts)  # type: ignore[no-any-return]

    if not isinstance(data, Mapping):
        raise SimConfigError("scenario", data, "must be a mapping at the top level")
    allowed = {"name", "description", "hardware", "fleet", "realism", "slo", "control", "limits"}
    allowed |= {"policy", "traffic", "step_at_s"}
    for key in data:
        if key not in allowed:
            raise SimConfigError(key, data[key], f"unknown field; known: {', '.join(sorted(allowed))}")
    for key in ("hardware", "fleet", "traffic"):
        if key not in data:
            raise SimConfigError(key, None, "required")
    config = SimConfig(
        hardware=hardware(data["hardware"], "hardware"),
        fleet=_from_mapping(Fleet, data["fleet"], "fleet"),
        realism=_from_mapping(Realism, data.get("realism", {}), "realism"),
        slo=_from_mapping(GoodputSlo, data.get("slo", {}), "slo"),
        control=_from_mapping(Control, data.get("control", {}), "control"),
    )
    traffic_parts = {
        "lengths": lengths,
        "second_lengths": lengths,
        "path": lambda v, w: _resolve(base, v, w),
    }
    traffic = _from_mapping(Traffic, data["traffic"], "traffic", traffic_parts)
    policy = data.get("policy")
    if policy is not None and not isinstance(policy, str):
        raise SimConfigError("policy", policy, "must be a policy name")
    return Scenario(
        name=str(data.get("name", "custom")),
        description=str(data.get("description", "")),
        config=config,
        traffic=traffic,
        policy=policy,
        limits=_from_mapping(Limits, data.get("limits", {}), "limits"),
        step_at_s=data.get("step_at_s", traffic.at_s),
    )


def load_scenario(name_or_path: str) -> Scenario:
    """A built-in scenario by name, or a YAML/JSON scenario file."""
    builtins = builtin_scenarios()
    if name_or_path in builtins:
        return builtins[name_or_path]
    path = Path(name_or_path)
    if not path.is_file():
        raise SimConfigError(
            "scenario", name_or_path, f"neither a built-in ({', '.join(builtins)}) nor a readable file"
        )
    import yaml  # only scenario files need it

    text = path.read_text(encoding="utf-8")
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as err:
        raise SimConfigError("scenario", str(path), f"not valid {path.suffix[1:] or 'YAML'}: {err}") from err
    return scenario_from_mapping(data, path.parent)
