"""One rule from (preset, overrides) to the capacity model's specs, for the PDDeployment (control/setup.py),
`xpyd plan`'s flags (cli/plan.py) and scenario files (sim/scenarios.py): a preset fills every number and
each override given replaces one; without a model preset the model's shape must be given; a GPU or link
without a preset takes the caller's default (the CR's and the CLI's: h100-sxm, ib-400g).

A GPU preset's calibration (`GPU_CALIBRATION`, fitted against its datasheet peaks) describes that GPU
only: it fills the MFU while the peak FLOP/s is the preset's, and the MBU and the step overhead while the
HBM bandwidth is the preset's. A number given always wins; one neither given nor calibrated takes the
seeds' default (MFU 0.4, MBU 1, no step overhead). `resolve_gpu_assumptions` says which applied.

Errors name fields in the caller's terms (`name_of`: `spec.model.kvHeads`, `--kv-heads` or
`hardware.model.kv_heads`), so every message says what the user wrote.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from xpyd_controller.model.presets import (
    DATASHEET_GPUS,
    GPU_CALIBRATION,
    LINK_PRESETS,
    MODEL_PRESETS,
    Calibration,
)
from xpyd_controller.model.specs import GpuSpec, LinkSpec, ModelSpec, SpecError

if TYPE_CHECKING:
    from xpyd_controller.model.roofline import Numeric

DEFAULT_GPU = "h100-sxm"
DEFAULT_LINK = "ib-400g"
MODEL_FIELDS = tuple(f.name for f in dataclasses.fields(ModelSpec))
GPU_FIELDS = tuple(f.name for f in dataclasses.fields(GpuSpec))
LINK_FIELDS = tuple(f.name for f in dataclasses.fields(LinkSpec))
_SHAPE = ("params", "layers", "kv_heads", "head_dim")
_MLA_SHAPE = ("params", "layers", "kv_latent_dim", "rope_dim")

SpecT = TypeVar("SpecT", ModelSpec, GpuSpec, LinkSpec)
NameOf = Callable[[str], str]


class PresetError(SpecError):
    """An unknown preset, an unknown override, or a model without a preset and without its shape."""


def _same(name: str) -> str:
    return name


def _pick(table: Mapping[str, SpecT], field: str, name: str) -> SpecT:
    if name not in table:
        raise PresetError(field, name, f"unknown preset; known: {', '.join(sorted(table))}")
    return table[name]


def _checked(overrides: Mapping[str, Any], known: tuple[str, ...], name_of: NameOf) -> dict[str, Any]:
    """The overrides that are set (None means not given); an unknown name is an error."""
    for key, value in overrides.items():
        if key not in known:
            known_names = ", ".join(name_of(k) for k in known)
            raise PresetError(name_of(key), value, f"unknown field; known: {known_names}")
    return {key: value for key, value in overrides.items() if value is not None}


def resolve_model(
    preset: str | None, overrides: Mapping[str, Any], preset_field: str, name_of: NameOf = _same
) -> ModelSpec:
    given = _checked(overrides, MODEL_FIELDS, name_of)
    if preset is not None:
        return dataclasses.replace(_pick(MODEL_PRESETS, preset_field, preset), **given)
    mla = "kv_latent_dim" in given or "rope_dim" in given
    missing = [name_of(name) for name in (_MLA_SHAPE if mla else _SHAPE) if name not in given]
    if missing:
        alternative = (
            ""
            if mla
            else (
                f" (MLA: {name_of('kv_latent_dim')} and {name_of('rope_dim')} instead of "
                f"{name_of('kv_heads')}, {name_of('head_dim')})"
            )
        )
        verb = "is" if len(missing) == 1 else "are"
        rule = f"not given, so {', '.join(missing)} {verb} required{alternative}"
        raise PresetError(preset_field, None, rule, message=f"{preset_field}: {rule}")
    return ModelSpec(**given)


# Where an efficiency in use came from: given by the caller, the preset's calibration, or the default.
AssumptionSource = Literal["given", "calibration", "default"]


@dataclasses.dataclass(frozen=True)
class GpuAssumptions:
    """The GPU to size with, the decode step overhead, and where MFU, MBU and the overhead came from."""

    gpu: GpuSpec
    step_overhead: Numeric  # seconds per decode step
    mfu_source: AssumptionSource
    mbu_source: AssumptionSource
    step_overhead_source: AssumptionSource
    calibration: Calibration | None  # the preset's fit, when any number came from it


def resolve_gpu_assumptions(
    preset: str | None,
    overrides: Mapping[str, Any],
    preset_field: str,
    name_of: NameOf = _same,
    *,
    step_overhead: Numeric | None = None,
) -> GpuAssumptions:
    """The GPU spec and step overhead by the rule in the module docstring, with their sources."""
    given = _checked(overrides, GPU_FIELDS, name_of)
    name = preset or DEFAULT_GPU
    datasheet = _pick(DATASHEET_GPUS, preset_field, name)
    fit = GPU_CALIBRATION.get(name)
    compute_fit = fit if fit is not None and "peak_flops" not in given else None
    memory_fit = fit if fit is not None and "hbm_bandwidth" not in given else None

    def source(field: str, fitted: Calibration | None) -> AssumptionSource:
        return "given" if field in given else "calibration" if fitted is not None else "default"

    calibrated = {
        **({"mfu": compute_fit.mfu} if compute_fit else {}),
        **({"mbu": memory_fit.mbu} if memory_fit else {}),
    }
    overhead_source: AssumptionSource = (
        "given" if step_overhead is not None else "calibration" if memory_fit else "default"
    )
    overhead: Numeric = (
        step_overhead if step_overhead is not None else memory_fit.step_overhead_s if memory_fit else 0.0
    )
    sources = (source("mfu", compute_fit), source("mbu", memory_fit), overhead_source)
    return GpuAssumptions(
        gpu=dataclasses.replace(datasheet, **{**calibrated, **given}),
        step_overhead=overhead,
        mfu_source=sources[0],
        mbu_source=sources[1],
        step_overhead_source=sources[2],
        calibration=fit if "calibration" in sources else None,
    )


def resolve_gpu(
    preset: str | None, overrides: Mapping[str, Any], preset_field: str, name_of: NameOf = _same
) -> GpuSpec:
    return resolve_gpu_assumptions(preset, overrides, preset_field, name_of).gpu


def resolve_link(
    preset: str | None, overrides: Mapping[str, Any], preset_field: str, name_of: NameOf = _same
) -> LinkSpec:
    given = _checked(overrides, LINK_FIELDS, name_of)
    return dataclasses.replace(_pick(LINK_PRESETS, preset_field, preset or DEFAULT_LINK), **given)
