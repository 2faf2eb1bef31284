"""The CRD file itself: structural, documented, with defaults that agree with the Python models."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from xpyd_api.models import PDDeploymentSpec, parse_pdd
from xpyd_api.names import GROUP, KIND, PLURAL, VERSION

ROOT = Path(__file__).resolve().parents[2]
CRD_PATH = ROOT / "crds" / "pddeployments.xpyd.dev.yaml"
SAMPLES = sorted((ROOT / "crds" / "samples").glob("*.yaml"))


def _crd() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(CRD_PATH.read_text())
    return loaded


def _schema() -> dict[str, Any]:
    schema: dict[str, Any] = _crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def _walk(schema: dict[str, Any], path: str) -> list[tuple[str, dict[str, Any]]]:
    found = [(path, schema)]
    for name, child in (schema.get("properties") or {}).items():
        found += _walk(child, f"{path}.{name}")
    if "items" in schema and schema["items"].get("type") == "object":  # scalar items: the list is described
        found += _walk(schema["items"], f"{path}[]")
    return found


def _apply_defaults(schema: dict[str, Any], value: Any) -> Any:
    """What the API server's defaulting does, enough for this schema (objects and their properties)."""
    if not isinstance(value, dict) or "properties" not in schema:
        return value
    result = dict(value)
    for name, child in schema["properties"].items():
        if name not in result and "default" in child:
            result[name] = child["default"]
        if name in result:
            result[name] = _apply_defaults(child, result[name])
    return result


def test_names_match_the_python_constants() -> None:
    crd = _crd()
    assert crd["metadata"]["name"] == f"{PLURAL}.{GROUP}"
    assert crd["spec"]["names"]["kind"] == KIND
    assert crd["spec"]["names"]["shortNames"] == ["pdd"]
    version = crd["spec"]["versions"][0]
    assert version["name"] == VERSION
    assert version["subresources"] == {"status": {}}


def test_printer_columns() -> None:
    columns = [c["name"] for c in _crd()["spec"]["versions"][0]["additionalPrinterColumns"]]
    assert columns == ["Prefill", "Decode", "Mode", "Converting", "Age"]


SPEC_FIELDS = _walk(_schema()["properties"]["spec"], "spec")
STATUS_FIELDS = _walk(_schema()["properties"]["status"], "status")


@pytest.mark.parametrize(("path", "node"), SPEC_FIELDS, ids=[path for path, _ in SPEC_FIELDS])
def test_every_spec_field_is_typed_and_described(path: str, node: dict[str, Any]) -> None:
    assert node.get("type"), f"{path} has no type (not structural)"
    assert node.get("description"), f"{path} has no description"


@pytest.mark.parametrize(("path", "node"), STATUS_FIELDS, ids=[path for path, _ in STATUS_FIELDS])
def test_every_status_field_is_typed_and_described(path: str, node: dict[str, Any]) -> None:
    assert node.get("type") and node.get("description"), f"{path} lacks a type or a description"


@pytest.mark.parametrize("sample", SAMPLES, ids=lambda p: p.name)
def test_samples_parse_and_crd_defaults_agree_with_model_defaults(sample: Path) -> None:
    body = yaml.safe_load(sample.read_text())
    body["metadata"].update(namespace="default", uid="u")
    defaulted = {**body, "spec": _apply_defaults(_schema()["properties"]["spec"], body["spec"])}
    assert parse_pdd(defaulted).spec == parse_pdd(body).spec


def test_four_samples_cover_minimal_vllm_sglang_and_autoscaling() -> None:
    assert {p.stem for p in SAMPLES} == {"minimal", "vllm", "sglang", "autoscaling"}
    engines = {
        PDDeploymentSpec.model_validate(yaml.safe_load(p.read_text())["spec"]).engine.type for p in SAMPLES
    }
    assert {"vllm", "sglang"} <= {str(e) for e in engines}


@pytest.mark.parametrize("sample", SAMPLES, ids=[p.stem for p in SAMPLES])
def test_sample_router_images_are_pinned_to_the_measured_versions(sample: Path) -> None:
    """The router decides whether a relabel is a switch, and versions differ (docs/operator.md)."""
    router = PDDeploymentSpec.model_validate(yaml.safe_load(sample.read_text())["spec"]).router
    measured = {
        "vllm-router": "ghcr.io/xpyd/vllm-router:0.1.17",
        "sglang-router": "lmsysorg/sglang-router:v0.3.2",
    }
    assert router.image == measured[str(router.type)]


def test_docs_reference_lists_every_field() -> None:
    docs = (ROOT / "docs" / "operator.md").read_text()
    # list items are described by their list's row; the roots by the section headings; the core/v1
    # Affinity subset by its `affinity` row
    missing = [
        p
        for p, _ in SPEC_FIELDS + STATUS_FIELDS
        if p not in ("spec", "status") and not p.endswith("[]") and ".affinity." not in p
    ]
    missing = [path for path in missing if f"`{path}`" not in docs]
    assert not missing, f"docs/operator.md lacks: {missing}"
