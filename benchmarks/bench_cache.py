"""Benchmark outcomes cached by the digest of the sources they depend on, and the command line to print.

`XPYD_BENCH_CACHE=DIR` (outside the repository) turns the cache on. A real-Dynamo row is keyed by the
simulator, the roofline, the policy contract, the shared contract (xpyd_api: the resize rule), the
adapter (`real_dynamo.py`) and the stand-in; every other policy's row by the whole xpyd package. A changed source is a different key, never a stale hit.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path

import real_dynamo

BENCHMARKS = Path(__file__).resolve().parent
CONTROLLER = Path(__file__).resolve().parent.parent / "controller" / "src" / "xpyd_controller"
# The shared contract: the simulator resizes its fleet by xpyd_api.resize, as the operator does.
SHARED = Path(__file__).resolve().parent.parent / "operator" / "src" / "xpyd_api"
# What a real-Dynamo run's outcome depends on besides Dynamo itself: the simulator, the traces and
# scenarios, the roofline, the policy contract, this adapter and the stand-in. Not the presets: a job's
# key holds its scenario's repr, every resolved model, GPU and link value included.
OUTCOME_INPUTS = (
    "sim",
    "model/roofline.py",
    "model/specs.py",
    "policy/types.py",
    "policy/limits.py",
)
CACHE_ENV = "XPYD_BENCH_CACHE"


def inputs_digest() -> str:
    """Digest of every source a real-Dynamo outcome depends on (a changed one invalidates the cache)."""
    digest = hashlib.sha256(real_dynamo.DYNAMO_VERSION.encode())
    files = [BENCHMARKS / "real_dynamo.py", *sorted(real_dynamo.STAND_IN.rglob("*.py"))]
    files += sorted(SHARED.rglob("*.py"))
    for item in OUTCOME_INPUTS:
        path = CONTROLLER / item
        files += sorted(path.rglob("*.py")) if path.is_dir() else [path]
    for path in files:
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def controller_digest() -> str:
    """Digest of the whole xpyd package and the shared contract: what any other policy's outcome may
    depend on."""
    digest = hashlib.sha256()
    for package in (CONTROLLER, SHARED):
        for path in sorted(package.rglob("*.py")):
            digest.update(str(path.relative_to(package.parent)).encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def cached_metrics(key: str, compute: Callable[[], dict[str, float]], policy: str) -> dict[str, float]:
    """A run's metrics, from `$XPYD_BENCH_CACHE` when the same inputs ran before.

    Dynamo's ARIMA predictor costs ~1 s of CPU per planner interval, so its rows dominate a benchmark;
    they depend only on the simulator, the roofline and this adapter (`INPUTS_DIGEST`), not on xpyd's
    policy or capacity model, which change far more often. Every other policy's outcome is keyed by
    the digest of the whole package. Off unless the variable names a directory outside the repository.
    """
    root = os.environ.get(CACHE_ENV)
    if not root:
        return compute()
    digest = INPUTS_DIGEST if policy in real_dynamo.NAMES else f"xpyd-{CONTROLLER_DIGEST}"
    path = Path(root) / digest / f"{hashlib.sha256(key.encode()).hexdigest()[:24]}.json"
    if path.exists():
        return {k: float(v) for k, v in json.loads(path.read_text(encoding="utf-8"))["metrics"].items()}
    metrics = compute()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"key": key, "metrics": metrics}), encoding="utf-8")
    return metrics


# Of the sources as imported, not as they may be edited mid-run.
INPUTS_DIGEST = inputs_digest()
CONTROLLER_DIGEST = controller_digest()


def interpreter() -> str:
    """How a benchmark's command line starts: under the Dynamo venv when its planner is importable."""
    prefix = f"{CACHE_ENV}=~/.cache/xpyd/bench-outcomes " if os.environ.get(CACHE_ENV) else ""
    return f'{prefix}"$(hack/dynamo-bench)"' if real_dynamo.available() else ".venv/bin/python"
