"""The import-linter contracts catch what they are for: each probe adds one forbidden import to a copy of
the sources and `lint-imports` must then fail on exactly that import (the real tree passes in hack/test)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")

PROBES = [
    # (module file, the import line added, what lint-imports must report)
    (
        "xpyd_controller/model/roofline.py",
        "import xpyd_operator.core.render",
        "not allowed to import xpyd_operator",
    ),
    (
        "xpyd_controller/control/pools.py",
        "import xpyd_operator.core.scaling",
        "not allowed to import xpyd_operator",
    ),
    (
        "xpyd_operator/core/scaling.py",
        "import xpyd_controller.policy",
        "not allowed to import xpyd_controller",
    ),
    ("xpyd_api/names.py", "import xpyd_operator.core.render", "not allowed to import xpyd_operator"),
    (
        "xpyd_controller/policy/static.py",
        "import xpyd_controller.cli.plan",
        "policy is not allowed to import",
    ),
    ("xpyd_controller/controller.py", "import xpyd_controller.cli.controller", "is not allowed to import"),
    ("xpyd_controller/model/sizing.py", "import xpyd_controller.policy", "model is not allowed to import"),
    ("xpyd_controller/sim/runner.py", "import xpyd_controller.control.loop", "not allowed to import"),
    # a circle inside one layer, which no layers contract sees: the acyclic_siblings contract does
    ("xpyd_api/names.py", "import xpyd_api.models", "No cycles are allowed in xpyd_api."),
    (
        "xpyd_controller/control/endpoints.py",
        "import xpyd_controller.control.loop",
        "No cycles are allowed in xpyd_controller.control.",
    ),
    # the operator's layers: entry points > the reconcile shell > adapters > the pure core
    (
        "xpyd_operator/core/render.py",
        "import xpyd_operator.reconcile",
        "xpyd_operator.core is not allowed to import xpyd_operator.reconcile",
    ),
    (
        "xpyd_operator/core/status.py",
        "import xpyd_operator.adapters.engine_client",
        "xpyd_operator.core is not allowed to import xpyd_operator.adapters",
    ),
    (
        "xpyd_operator/core/scaling.py",
        "import xpyd_api.k8s",
        "xpyd_operator.core is not allowed to import xpyd_api.k8s",
    ),
    (
        "xpyd_operator/core/config.py",
        "import urllib.request",
        "xpyd_operator.core is not allowed to import urllib",
    ),
    (
        "xpyd_operator/adapters/engine_client.py",
        "import xpyd_operator.reconcile",
        "xpyd_operator.adapters is not allowed to import xpyd_operator.reconcile",
    ),
    (
        "xpyd_operator/reconcile.py",
        "import xpyd_operator.entry.handlers",
        "xpyd_operator.reconcile is not allowed to import xpyd_operator.entry",
    ),
]


def _source(module: str) -> str:
    package = "operator" if module.startswith(("xpyd_operator", "xpyd_api")) else "controller"
    return f"{package}/src/{module}"


def _lint_copy(root: Path, probe: tuple[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """lint-imports over a copy of the sources in `root`, with the probe's line added to its module."""
    for package in ("operator", "controller"):
        shutil.copytree(
            REPO / package / "src",
            root / package / "src",
            ignore=shutil.ignore_patterns("*.so", "__pycache__"),
        )
    shutil.copy(REPO / "pyproject.toml", root / "pyproject.toml")
    if probe is not None:
        probed = root / _source(probe[0])
        probed.write_text(probed.read_text() + f"\n{probe[1]}  # probe\n")
    env = {**os.environ, "PYTHONPATH": f"{root / 'operator' / 'src'}:{root / 'controller' / 'src'}"}
    return subprocess.run(
        [str(LINT_IMPORTS), "--config", "pyproject.toml", "--no-cache"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )


@pytest.mark.parametrize(("module", "line", "report"), PROBES, ids=[f"{m}: {i}" for m, i, _ in PROBES])
def test_a_forbidden_import_breaks_a_contract(tmp_path: Path, module: str, line: str, report: str) -> None:
    done = _lint_copy(tmp_path, (module, line))
    assert done.returncode == 1, done.stdout[-2000:]
    assert report in done.stdout, done.stdout[-2000:]


def test_the_unprobed_copy_keeps_every_contract(tmp_path: Path) -> None:
    """The control case: the copy itself passes, so a probe's failure is the probe's."""
    done = _lint_copy(tmp_path)
    assert done.returncode == 0, done.stdout[-2000:]
