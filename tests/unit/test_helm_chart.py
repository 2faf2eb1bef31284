"""The chart's files: the CRD copy, versions, documented values, and a schema that covers them all."""

from __future__ import annotations

import json
import re
import tomllib
from typing import Any

import pytest
import yaml
from tests.helm_chart import CHART_DIR, ROOT, default_values, leaf_values, value_comments

DOCS_PATH = ROOT / "docs" / "helm.md"
TABLE_ROW = re.compile(r"^\| `([^`]+)` \| `(.*)` \| (.*) \|$")


def _schema() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((CHART_DIR / "values.schema.json").read_text())
    return loaded


def _schema_leaves(schema: dict[str, Any], prefix: str = "") -> set[str]:
    """Dotted keys the schema names down to where it stops describing properties."""
    leaves: set[str] = set()
    for key, child in (schema.get("properties") or {}).items():
        if child.get("properties"):
            leaves |= _schema_leaves(child, f"{prefix}{key}.")
        else:
            leaves.add(f"{prefix}{key}")
    return leaves


def _documented_rows() -> dict[str, tuple[str, str]]:
    rows = (TABLE_ROW.match(line) for line in DOCS_PATH.read_text().splitlines())
    return {row.group(1): (row.group(2), row.group(3)) for row in rows if row}


def test_the_chart_crd_is_a_byte_identical_copy_of_the_repository_crd() -> None:
    assert (CHART_DIR / "crds" / "pddeployments.xpyd.dev.yaml").read_bytes() == (
        ROOT / "crds" / "pddeployments.xpyd.dev.yaml"
    ).read_bytes()


def test_app_version_is_the_package_version() -> None:
    chart = yaml.safe_load((CHART_DIR / "Chart.yaml").read_text())
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert chart["apiVersion"] == "v2"
    assert chart["appVersion"] == project["version"]


def test_every_value_has_a_comment() -> None:
    undocumented = [key for key, comment in value_comments().items() if not comment]
    assert undocumented == []


def _under(key: str, prefix: str) -> bool:
    return key == prefix or key.startswith(f"{prefix}.")


def test_the_schema_describes_exactly_the_values() -> None:
    """Every value is typed by the schema, and the schema names no value that values.yaml lacks.

    The schema may stop at an object that the values walk into (free-form maps such as resources).
    """
    value_keys = {key for key, _ in leaf_values(default_values())}
    schema_keys = _schema_leaves(_schema())
    assert {key for key in value_keys if not any(_under(key, s) for s in schema_keys)} == set()
    assert {s for s in schema_keys if not any(_under(key, s) for key in value_keys)} == set()


@pytest.mark.parametrize(
    "path", ["", "image", "watch", "operator", "operator.settings", "controller", "monitoring"]
)
def test_schema_objects_reject_unknown_keys(path: str) -> None:
    node = _schema()
    for key in filter(None, path.split(".")):
        node = node["properties"][key]
    assert node["additionalProperties"] is False


def test_docs_table_lists_every_value_with_its_default_and_comment() -> None:
    comments = value_comments()
    expected = {key: (json.dumps(value), comments[key]) for key, value in leaf_values(default_values())}
    assert _documented_rows() == expected
