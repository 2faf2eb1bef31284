"""Locates (building on first use) the cached cluster binaries made by `hack/testbin`."""

from __future__ import annotations

import functools
import os
import subprocess
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
TESTBIN_SCRIPT = REPO_ROOT / "hack" / "testbin"
# Set by hack/test and hack/demo after they ran hack/testbin, so the harness need not run it again.
TESTBIN_ENV = "XPYD_TESTBIN_DIR"


@functools.cache
def testbin_dir() -> Path:
    """Return the directory holding kube-apiserver, etcd, kwok, kwokctl, kubectl, helm and prometheus.

    Runs `hack/testbin`, which is a no-op when everything is cached and a long build otherwise; its
    progress goes to stderr so a cold first run is visibly alive.
    """
    return prepared_dir(TESTBIN_ENV, "kube-apiserver", TESTBIN_SCRIPT)


def prepared_dir(env: str, marker: str, script: Path) -> Path:
    """The directory `env` names when it holds `marker`, else the one `script` builds and prints last.

    hack/test exports the directories it prepared, so tests do not run the (idempotent) scripts again.
    """
    prepared = os.environ.get(env)
    if prepared and (Path(prepared) / marker).is_file():
        return Path(prepared)
    result = subprocess.run([str(script)], stdout=subprocess.PIPE, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(
            f"hack/{script.name} failed with exit code {result.returncode}; see its output above"
        )
    return Path(result.stdout.strip().splitlines()[-1])
