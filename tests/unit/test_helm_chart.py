"""The chart's files: the CRD copy, versions, documented values, and a schema that covers them all."""

from __future__ import annotations

import json
import re
import tomllib
from typing import Any

import pytest
import yaml
from prometheus_client.metrics_core import Metric
from tests.helm_chart import CHART_DIR, ROOT, default_values, leaf_values, value_comments

from xpyd_api.engines import VLLM_METRICS as VLLM
from xpyd_controller.adapters.telemetry import PrometheusTelemetry

DOCS_PATH = ROOT / "docs" / "helm.md"
TABLE_ROW = re.compile(r"^\| `([^`]+)` \| `(.*)` \| (.*) \|$")
DASHBOARD_PATH = CHART_DIR / "dashboards" / "xpyd.json"
# A series name is followed by its selector, a range or the closing of a call; grouping labels are cut first.
SERIES_NAME = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)[{\[)]")
GROUPING = re.compile(r"\bby \([^)]*\)")


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
    "path",
    [
        "",
        "image",
        "watch",
        "operator",
        "operator.settings",
        "controller",
        "monitoring",
        "monitoring.dashboard",
    ],
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


def _exposed_names(family: Metric) -> set[str]:
    """The series names a prometheus-client metric family is scraped as."""
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}
    return {family.name + suffix for suffix in suffixes[family.type]}


def _engine_series() -> set[str]:
    names = {name for alternatives in vars(VLLM).values() for name in alternatives}
    return {name + suffix for name in names for suffix in ("", "_bucket", "_sum", "_count")}


def _dashboard_exprs() -> list[str]:
    dashboard = json.loads(DASHBOARD_PATH.read_text())
    return [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]


def test_the_dashboard_queries_only_series_that_exist() -> None:
    """Controller series as its /metrics exposes them, engine series the controller reads, and `up`."""
    controller = {
        name for family in PrometheusTelemetry().registry.collect() for name in _exposed_names(family)
    }
    known = controller | _engine_series() | {"up"}
    queried = {name for expr in _dashboard_exprs() for name in SERIES_NAME.findall(GROUPING.sub("", expr))}
    assert queried, "no series found in the dashboard"
    assert queried - known == set()
    assert {"xpyd_controller_desired_replicas", "xpyd_controller_decisions_total"} <= queried
