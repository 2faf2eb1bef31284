"""Parsing a PDDeployment at the boundary: camelCase in, typed values out, clear errors for bad input."""

from __future__ import annotations

from typing import Any

import pytest

from xpyd_api.engines import EngineType
from xpyd_api.models import PDDSpecError, SwitchMethod, parse_pdd
from xpyd_api.names import Role


def body(**spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "model": {"name": "m"},
        "engine": {"image": "vllm:0.32.0"},
        "router": {"image": "router:1"},
    }
    base.update(spec)
    return {"metadata": {"name": "p", "namespace": "ns", "uid": "u1", "generation": 3}, "spec": base}


def test_minimal_spec_gets_defaults() -> None:
    pdd = parse_pdd(body())
    assert (pdd.name, pdd.namespace, pdd.uid, pdd.generation) == ("p", "ns", "u1", 3)
    assert pdd.spec.prefill.replicas == 1 and pdd.spec.decode.replicas == 1
    assert pdd.spec.conversion.drain_timeout_seconds == 60
    assert pdd.spec.switch_method is SwitchMethod.ROUTING
    assert pdd.spec.pool(Role.DECODE) is pdd.spec.decode


def test_camel_case_aliases_are_read() -> None:
    prefill = {"replicas": 3, "maxReplicas": 5, "gpusPerInstance": 2, "nodeSelector": {"a": "b"}}
    pdd = parse_pdd(body(prefill=prefill, conversion={"enabled": False}))
    assert pdd.spec.prefill.max_replicas == 5
    assert pdd.spec.prefill.gpus_per_instance == 2
    assert pdd.spec.prefill.node_selector == {"a": "b"}


def test_auto_switch_method_restarts_vllm_in_place_whose_connector_acts_on_kv_role() -> None:
    spec = parse_pdd(body(engine={"image": "vllm:0.32.0", "kvConnector": "MooncakeConnector"})).spec
    assert spec.switch_method is SwitchMethod.IN_PLACE
    assert not spec.serves_both_roles


@pytest.mark.parametrize(
    ("engine", "method"),
    [
        ("vllm", SwitchMethod.IN_PLACE),  # the image names no version: kv_both is never rendered
        ("sglang", SwitchMethod.HTTP),
        ("custom", SwitchMethod.RESTART),
    ],
)
def test_auto_switch_method_follows_the_engine(engine: str, method: SwitchMethod) -> None:
    spec = parse_pdd(body(engine={"image": "x", "type": engine, "command": ["run"]})).spec
    assert spec.engine.type is EngineType(engine)
    assert spec.switch_method is method


@pytest.mark.parametrize(
    ("engine", "method"),
    [
        ({"image": "vllm/vllm-openai:v0.32.0"}, SwitchMethod.ROUTING),
        ({"image": "vllm/vllm-openai:v0.22.1"}, SwitchMethod.ROUTING),
        ({"image": "vllm/vllm-openai:v0.34.2"}, SwitchMethod.ROUTING),
        ({"image": "registry.local:5000/ml/vllm-cpu:0.32.0-avx2"}, SwitchMethod.ROUTING),
        ({"image": "vllm/vllm-openai:v0.35.0"}, SwitchMethod.IN_PLACE),
        ({"image": "vllm/vllm-openai:v1.0.0"}, SwitchMethod.IN_PLACE),
        ({"image": "vllm/vllm-openai:latest"}, SwitchMethod.IN_PLACE),
        ({"image": "vllm/vllm-openai"}, SwitchMethod.IN_PLACE),
        ({"image": "vllm/vllm-openai@sha256:0123abcd"}, SwitchMethod.IN_PLACE),
        ({"image": "registry.local:5000/vllm"}, SwitchMethod.IN_PLACE),  # a port is no tag
        ({"image": "myorg/engine:0.32.0"}, SwitchMethod.IN_PLACE),  # not a vLLM repository
        ({"image": "myorg/engine:0.32.0", "version": "0.32.0"}, SwitchMethod.ROUTING),
        ({"image": "myorg/engine", "version": "v0.34"}, SwitchMethod.ROUTING),
        ({"image": "vllm/vllm-openai:v0.32.0", "version": "0.35.1"}, SwitchMethod.IN_PLACE),  # the field wins
        ({"image": "vllm/vllm-openai:v0.32.0", "kvConnector": "MooncakeConnector"}, SwitchMethod.IN_PLACE),
    ],
)
def test_auto_switch_method_for_vllm_follows_the_version(
    engine: dict[str, str], method: SwitchMethod
) -> None:
    assert parse_pdd(body(engine=engine)).spec.switch_method is method


@pytest.mark.parametrize(
    ("engine", "field"),
    [
        ({"image": "vllm/vllm-openai:v0.35.0"}, "spec.engine.image='v0.35.0'"),
        ({"image": "vllm/vllm-openai:v0.32.0", "version": "1.2"}, "spec.engine.version='1.2'"),
    ],
)
def test_an_explicit_routing_switch_on_a_version_needing_explicit_roles_is_refused(
    engine: dict[str, str], field: str
) -> None:
    with pytest.raises(PDDSpecError) as caught:
        parse_pdd(body(engine=engine, conversion={"switchMethod": "Routing"}))
    assert field in str(caught.value) and "use InPlace" in str(caught.value)


def test_an_explicit_routing_switch_on_an_unknown_version_is_the_users_choice() -> None:
    spec = parse_pdd(body(engine={"image": "x"}, conversion={"switchMethod": "Routing"})).spec
    assert spec.switch_method is SwitchMethod.ROUTING


def test_an_engine_version_that_is_no_version_is_refused() -> None:
    with pytest.raises(PDDSpecError) as caught:
        parse_pdd(body(engine={"image": "x", "version": "latest"}))
    assert "spec.engine.version" in str(caught.value)


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ({"prefill": {"replicas": 9, "maxReplicas": 4}}, "spec.prefill.replicas=9"),
        ({"decode": {"replicas": 0, "minReplicas": 1}}, "spec.decode.replicas=0"),
        ({"slo": {"ttftSeconds": 0}}, "spec.slo.ttftSeconds"),
        ({"slo": {"attainment": 1.5}}, "spec.slo.attainment"),
        ({"prefill": {"gpusPerInstance": 2}}, "gpusPerInstance"),
        ({"conversion": {"switchMethod": "Routing"}, "engine": {"image": "x", "type": "sglang"}}, "Routing"),
        (
            {
                "conversion": {"switchMethod": "Routing"},
                "engine": {"image": "x", "kvConnector": "MooncakeConnector"},
            },
            "kvConnector NixlConnector",
        ),
        ({"engine": {"image": "x", "kvConnector": "LMCacheConnectorV1"}}, "vllm-router speaks only"),
        ({"router": {"type": "vllm-router"}}, "spec.router.image"),
        ({"rollout": {"maxSurge": 0, "maxUnavailable": 0}}, "spec.rollout.maxSurge"),
        ({"engine": {"image": ""}}, "spec.engine.image"),
        ({"conversion": {"drainTimeoutSeconds": -1}}, "spec.conversion.drainTimeoutSeconds"),
    ],
)
def test_invalid_specs_name_the_field(spec: dict[str, Any], fragment: str) -> None:
    with pytest.raises(PDDSpecError) as error:
        parse_pdd(body(**spec))
    assert fragment in str(error.value)


def test_incompatible_roles_are_fine_without_conversion() -> None:
    spec = parse_pdd(body(prefill={"gpusPerInstance": 2}, conversion={"enabled": False})).spec
    assert not spec.roles_compatible
