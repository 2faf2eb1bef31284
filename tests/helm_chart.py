"""The Helm chart under test: runs the real helm binary (built by hack/testbin) and reads its files."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml
from e2e.harness.testbin import testbin_dir

ROOT = Path(__file__).resolve().parents[1]
CHART_DIR = ROOT / "charts" / "xpyd"
VALUES_PATH = CHART_DIR / "values.yaml"
STANDARD_LABELS = (
    "helm.sh/chart",
    "app.kubernetes.io/name",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
    "app.kubernetes.io/managed-by",
)


def helm(
    *args: str, values: Mapping[str, Any] | None = None, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the cached helm binary, `values` passed on stdin (`-f -`); the caller checks the return code."""
    if values is not None:
        args = (*args, "-f", "-")
    return subprocess.run(
        [str(testbin_dir() / "helm"), *args],
        input=json.dumps(values) if values is not None else None,
        capture_output=True,
        text=True,
        env=dict(env) if env is not None else None,
        timeout=180,
        check=False,
    )


def template(
    values: Mapping[str, Any], *extra: str, namespace: str = "xpyd-system"
) -> subprocess.CompletedProcess[str]:
    """`helm template` of the chart as release `rel` with the given values (return code not checked)."""
    return helm("template", "rel", str(CHART_DIR), "-n", namespace, *extra, values=values)


def render(values: Mapping[str, Any], *extra: str, namespace: str = "xpyd-system") -> list[dict[str, Any]]:
    """The objects `helm template` renders; fails with helm's stderr if it rejects the values."""
    result = template(values, *extra, namespace=namespace)
    if result.returncode != 0:
        raise AssertionError(f"helm template failed: {result.stderr}")
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def leaf_values(values: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted key, default) of every value a user can set: non-empty mappings are walked into."""
    for key, value in values.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            yield from leaf_values(value, f"{path}.")
        else:
            yield path, value


def default_values() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(VALUES_PATH.read_text())
    return loaded


def value_comments() -> dict[str, str]:
    """The `# -- ` comment written above every key of values.yaml, by dotted key ('' if none)."""
    comments: dict[str, str] = {}
    path: list[str] = []
    pending: list[str] = []
    for line in VALUES_PATH.read_text().splitlines():
        text = line.strip()
        if text.startswith("#"):
            body = text.lstrip("#").strip()
            if body.startswith("-- "):
                pending = [body[3:]]
            elif pending:
                pending.append(body)
            continue
        key = re.match(r"^( *)([A-Za-z]\w*):", line)
        if key is None:
            pending = []
            continue
        path = [*path[: len(key.group(1)) // 2], key.group(2)]
        comments[".".join(path)] = " ".join(pending)
        pending = []
    return comments
