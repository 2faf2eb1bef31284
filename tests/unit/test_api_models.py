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
        "engine": {"image": "vllm:1"},
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


def test_auto_switch_method_restarts_vllm_whose_connector_acts_on_kv_role() -> None:
    spec = parse_pdd(body(engine={"image": "x", "kvConnector": "MooncakeConnector"})).spec
    assert spec.switch_method is SwitchMethod.RESTART
    assert not spec.serves_both_roles


@pytest.mark.parametrize(
    ("engine", "method"),
    [("vllm", SwitchMethod.ROUTING), ("sglang", SwitchMethod.HTTP), ("custom", SwitchMethod.RESTART)],
)
def test_auto_switch_method_follows_the_engine(engine: str, method: SwitchMethod) -> None:
    spec = parse_pdd(body(engine={"image": "x", "type": engine, "command": ["run"]})).spec
    assert spec.engine.type is EngineType(engine)
    assert spec.switch_method is method


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
