"""One rule from (preset, overrides) to the capacity model's specs, for the PDDeployment (control/setup.py),
`xpyd plan`'s flags (cli/plan.py) and scenario files (sim/scenarios.py): a preset fills every number and
each override given replaces one; without a model preset the model's shape must be given; a GPU or link
without a preset takes the caller's default (the CR's and the CLI's: h100-sxm, ib-400g).

Errors name fields in the caller's terms (`name_of`: `spec.model.kvHeads`, `--kv-heads` or
`hardware.model.kv_heads`), so every message says what the user wrote.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from xpyd_controller.model.presets import GPU_PRESETS, LINK_PRESETS, MODEL_PRESETS
from xpyd_controller.model.specs import GpuSpec, LinkSpec, ModelSpec, SpecError

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


def resolve_gpu(
    preset: str | None, overrides: Mapping[str, Any], preset_field: str, name_of: NameOf = _same
) -> GpuSpec:
    given = _checked(overrides, GPU_FIELDS, name_of)
    return dataclasses.replace(_pick(GPU_PRESETS, preset_field, preset or DEFAULT_GPU), **given)


def resolve_link(
    preset: str | None, overrides: Mapping[str, Any], preset_field: str, name_of: NameOf = _same
) -> LinkSpec:
    given = _checked(overrides, LINK_FIELDS, name_of)
    return dataclasses.replace(_pick(LINK_PRESETS, preset_field, preset or DEFAULT_LINK), **given)
