"""One rule from (preset, overrides) to specs for the PDDeployment, `xpyd plan` and scenario files, and one
error root carrying field, value and rule."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any

import pytest

from xpyd_api.errors import InputError
from xpyd_api.models import PDDSpecError, parse_pdd
from xpyd_controller.cli.plan import register
from xpyd_controller.cli.plan.arguments import PlanInputError, build_model
from xpyd_controller.control.setup import SetupError, gpu_spec, link_spec, model_spec
from xpyd_controller.model.presets import GPU_PRESETS, LINK_PRESETS, MODEL_PRESETS
from xpyd_controller.model.resolve import PresetError, resolve_gpu, resolve_link, resolve_model
from xpyd_controller.model.specs import GpuSpec, LinkSpec, ModelSpec, SpecError
from xpyd_controller.policy.context import PolicyConfigError
from xpyd_controller.policy.limits import LimitsError
from xpyd_controller.sim.config import SimConfigError
from xpyd_controller.sim.instance import InstanceError
from xpyd_controller.sim.live import LiveFleetError
from xpyd_controller.sim.scenarios import scenario_from_mapping
from xpyd_controller.sim.traces.records import TraceError
from xpyd_controller.standin.server import RequestError

LLAMA = MODEL_PRESETS["llama-3.1-8b"]

# (preset, overrides) -> the ModelSpec all three front ends must produce.
MODEL_CASES: list[tuple[str | None, dict[str, Any], ModelSpec]] = [
    ("llama-3.1-8b", {}, LLAMA),
    ("llama-3.1-8b", {"layers": 40, "kv_bytes": 1.0}, dataclasses.replace(LLAMA, layers=40, kv_bytes=1.0)),
    (None, {"params": 7e9, "layers": 28, "kv_heads": 4, "head_dim": 128}, ModelSpec(7e9, 28, 4, 128)),
    (
        None,
        {"params": 6e11, "layers": 61, "kv_latent_dim": 512, "rope_dim": 64},
        ModelSpec(6e11, 61, kv_latent_dim=512, rope_dim=64),
    ),
]
CAMEL = {"kv_heads": "kvHeads", "head_dim": "headDim", "kv_bytes": "kvBytes", "kv_latent_dim": "kvLatentDim"}
CAMEL |= {"rope_dim": "ropeDim"}


def _pdd(spec: dict[str, Any]) -> Any:
    body = {
        "metadata": {"name": "x", "namespace": "n", "uid": "u"},
        "spec": {"engine": {"image": "e"}, "router": {"image": "r"}, **spec},
    }
    return parse_pdd(body).spec


def _plan_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"), "plan")
    return parser.parse_args(["plan", "--rate", "1", "--isl", "1000", "--osl", "100", *argv])


def _flags(preset: str | None, overrides: dict[str, Any]) -> list[str]:
    argv = ["--model", preset] if preset else []
    for key, value in overrides.items():
        argv += [f"--{key.replace('_', '-')}", str(value)]
    return argv


@pytest.mark.parametrize(("preset", "overrides", "expected"), MODEL_CASES)
def test_the_cr_the_cli_and_a_scenario_resolve_a_model_the_same_way(
    preset: str | None, overrides: dict[str, Any], expected: ModelSpec
) -> None:
    assert resolve_model(preset, overrides, "model") == expected
    cr = {"preset": preset, **{CAMEL.get(k, k): v for k, v in overrides.items()}}
    assert model_spec(_pdd({"model": {"name": "m", **cr}}).model) == expected
    assert build_model(_plan_args(*_flags(preset, overrides))) == expected
    hardware = {"model": {"preset": preset, **overrides} if preset else overrides, "gpu": "h100-sxm"}
    scenario = scenario_from_mapping(
        {
            "hardware": {**hardware, "link": "ib-400g"},
            "fleet": {"mode": "disagg", "prefill": 1, "decode": 1},
            "traffic": {"kind": "poisson", "rate": 1, "count": 10},
        },
        Path(),
    )
    assert scenario.config.hardware.model == expected


@pytest.mark.parametrize(
    ("resolve", "preset", "overrides", "expected"),
    [
        (resolve_gpu, None, {}, GPU_PRESETS["h100-sxm"]),
        (resolve_gpu, "h100-sxm", {"mfu": 0.4}, dataclasses.replace(GPU_PRESETS["h100-sxm"], mfu=0.4)),
        (resolve_link, None, {}, LINK_PRESETS["ib-400g"]),
        (resolve_link, "ib-400g", {"overhead": 0.002, "bandwidth": None}, LinkSpec(50e9, 0.002)),
    ],
)
def test_gpu_and_link_default_to_the_cli_presets_and_take_overrides(
    resolve: Any, preset: str | None, overrides: dict[str, Any], expected: GpuSpec | LinkSpec
) -> None:
    resolved = resolve(preset, overrides, "x")
    assert resolved == expected


def test_the_cr_gpu_and_link_use_the_resolver() -> None:
    hardware = _pdd({"model": {"name": "m", "preset": "llama-3.1-8b"}, "hardware": {"mfu": 0.3}}).hardware
    assert gpu_spec(hardware) == resolve_gpu(None, {"mfu": 0.3}, "x")
    assert link_spec(hardware) == LINK_PRESETS["ib-400g"]


@pytest.mark.parametrize(
    ("call", "field", "value", "words"),
    [
        (
            lambda: resolve_model("gpt-9", {}, "spec.model.preset"),
            "spec.model.preset",
            "gpt-9",
            "unknown preset",
        ),
        (
            lambda: resolve_model(None, {"params": 1e9}, "--model", lambda n: "--" + n.replace("_", "-")),
            "--model",
            None,
            "--model: not given, so --layers, --kv-heads, --head-dim are required (MLA: --kv-latent-dim",
        ),
        (lambda: resolve_gpu("h100-sxm", {"flops": 1}, "gpu"), "flops", 1, "unknown field"),
        (lambda: resolve_link("carrier-pigeon", {}, "link"), "link", "carrier-pigeon", "unknown preset"),
    ],
)
def test_a_bad_preset_or_override_names_field_value_and_rule(
    call: Any, field: str, value: object, words: str
) -> None:
    with pytest.raises(PresetError) as caught:
        call()
    assert (caught.value.field, caught.value.value) == (field, value)
    assert words in str(caught.value) and caught.value.rule in str(caught.value)


def test_a_scenario_names_its_override_and_the_cli_its_flag() -> None:
    with pytest.raises(SimConfigError) as caught:
        scenario_from_mapping(
            {
                "hardware": {
                    "model": {"preset": "llama-3.1-8b", "layerz": 3},
                    "gpu": "h100-sxm",
                    "link": "ib-400g",
                },
                "fleet": {"mode": "disagg", "prefill": 1, "decode": 1},
                "traffic": {"kind": "poisson", "rate": 1, "count": 10},
            }
        )
    assert caught.value.field == "hardware.model.layerz"
    with pytest.raises(PlanInputError) as flagged:
        build_model(_plan_args("--rope-dim", "64", "--params", "1e9", "--layers", "2"))
    assert str(flagged.value) == "--model: not given, so --kv-latent-dim is required"


@pytest.mark.parametrize(
    "error",
    [
        PDDSpecError("spec.x", 1, "r"),
        SpecError("x", 1, "r"),
        PresetError("x", 1, "r"),
        SetupError("x", 1, "r"),
        PlanInputError("--x", 1, "r"),
        LimitsError("x", 1, "r"),
        PolicyConfigError("p", "x", 1, "r"),
        SimConfigError("x", 1, "r"),
        TraceError("x", 1, "r", source="f", line=2),
        InstanceError("x", 1, "r"),
        LiveFleetError("x", 1, "r"),
        RequestError("x", 1, "r"),
    ],
    ids=lambda error: type(error).__name__,
)
def test_every_input_error_has_the_one_root_and_carries_field_value_rule(error: InputError) -> None:
    assert isinstance(error, InputError) and isinstance(error, ValueError)
    assert (error.value, error.rule) == (1, "r") and error.field.endswith("x")
    assert "1" in str(error) and str(error).endswith("r")


def test_a_refused_pdd_spec_carries_its_first_problem() -> None:
    with pytest.raises(PDDSpecError) as caught:
        _pdd({"model": {"name": "m"}, "prefill": {"replicas": -1}})
    assert caught.value.field == "spec.prefill.replicas" and caught.value.value == -1
    assert "spec.prefill.replicas" in str(caught.value)
