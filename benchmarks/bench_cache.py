"""Benchmark outcomes cached by the digest of the sources they depend on, and the command line to print.

`XPYD_BENCH_CACHE=DIR` (outside the repository) turns the cache on. A row is keyed by the sources of
the modules its run imports, followed through xpyd_controller and xpyd_api: the simulator's, the
policy's own (Dynamo's adapter and stand-in for a real-Dynamo row), never another policy's. A changed
source is a different key, never a stale hit.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
from collections.abc import Callable, Iterable
from functools import cache
from pathlib import Path

import real_dynamo

BENCHMARKS = Path(__file__).resolve().parent
# Where the packages a run may import live, by top-level package name.
SOURCE_ROOTS = {
    "xpyd_controller": BENCHMARKS.parent / "controller" / "src",
    "xpyd_api": BENCHMARKS.parent / "operator" / "src",
    "aisimulate_core": real_dynamo.STAND_IN,
    "real_dynamo": BENCHMARKS,
}
# What every simulated run imports: the traces and scenarios, the engine (the compiled one is built
# from the same sources), the resize rule through it, the summary.
SIMULATION = (
    "xpyd_controller.sim.runner",
    "xpyd_controller.sim.engine",
    "xpyd_controller.sim.scenarios",
    "xpyd_controller.sim.seed",
    "xpyd_controller.sim.results",
    "xpyd_controller.sim.stats",
)
# Imported by every run but read for one name only: the registry maps names to every policy's
# factory, so following it would key each row by all policies. Its own text is in the key.
NOT_FOLLOWED = frozenset({"xpyd_controller.policy.registry"})
CACHE_ENV = "XPYD_BENCH_CACHE"


def module_file(name: str) -> Path | None:
    """The source of module `name` (a package's __init__.py), or None outside the packages above."""
    root = SOURCE_ROOTS.get(name.split(".", maxsplit=1)[0])
    if root is None:
        return None
    base = root.joinpath(*name.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def _imported(name: str, path: Path) -> set[str]:
    """Modules `path` (module `name`) imports anywhere, lazily or under TYPE_CHECKING included; a
    `from package import submodule` names the submodule, any other name its package."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            parent = package.rsplit(".", node.level - 1)[0] if node.level else ""
            base = ".".join(part for part in (parent, node.module or "") if part)
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if module_file(f"{base}.{alias.name}") else base)
    return found


def import_closure(roots: Iterable[str]) -> dict[str, Path]:
    """Every source file the modules `roots` load: their imports, transitively, each one's parent
    packages' __init__ (and what it imports), and all of a package imported by name (its __init__
    may load submodules lazily)."""
    files: dict[str, Path] = {}
    whole: set[str] = set()
    todo = [(root, True) for root in roots]
    while todo:
        name, by_name = todo.pop()
        path = module_file(name)
        if path is None:
            continue
        if name not in files:
            files[name] = path
            todo += [(name.rsplit(".", depth)[0], False) for depth in range(1, name.count(".") + 1)]
            if name not in NOT_FOLLOWED:
                todo += [(module, True) for module in _imported(name, path)]
        if by_name and path.name == "__init__.py" and name not in whole:
            whole.add(name)
            children = [child.stem for child in path.parent.glob("*.py") if child.stem != "__init__"]
            children += [child.name for child in path.parent.iterdir() if (child / "__init__.py").is_file()]
            todo += [(f"{name}.{child}", True) for child in children]
    return dict(sorted(files.items()))


def policy_modules(policy: str) -> tuple[str, ...]:
    """The modules a row of `policy` imports besides the simulator: its own and what builds it."""
    if policy in real_dynamo.NAMES:
        return ("real_dynamo", "aisimulate_core")
    from xpyd_controller.policy.registry import POLICIES

    factory = POLICIES.get(policy)
    own = factory.__module__ if factory is not None else "xpyd_controller.sim.oracles"
    return ("xpyd_controller.sim.policies", own)


@cache
def row_digest(policy: str) -> str:
    """Digest of every source a row of `policy` depends on, Dynamo's pinned version for its rows."""
    digest = hashlib.sha256(real_dynamo.DYNAMO_VERSION.encode() if policy in real_dynamo.NAMES else b"")
    for module, path in import_closure(SIMULATION + policy_modules(policy)).items():
        digest.update(module.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def cached_metrics(key: str, compute: Callable[[], dict[str, float]], policy: str) -> dict[str, float]:
    """A run's metrics, from `$XPYD_BENCH_CACHE` when the same inputs ran before.

    Dynamo's ARIMA predictor costs ~1 s of CPU per planner interval, so its rows dominate a benchmark;
    keyed by what they import, they survive changes to xpyd's policy, and the baselines' rows survive
    them too. Off unless the variable names a directory outside the repository.
    """
    root = os.environ.get(CACHE_ENV)
    if not root:
        return compute()
    path = Path(root) / f"rows-{row_digest(policy)}" / f"{hashlib.sha256(key.encode()).hexdigest()[:24]}.json"
    if path.exists():
        return {k: float(v) for k, v in json.loads(path.read_text(encoding="utf-8"))["metrics"].items()}
    metrics = compute()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"key": key, "metrics": metrics}), encoding="utf-8")
    return metrics


def _digest_every_row() -> None:
    """Of the sources as imported, not as they may be edited mid-run."""
    from xpyd_controller.policy.registry import POLICIES
    from xpyd_controller.sim.oracles import ORACLES

    for policy in (*POLICIES, *ORACLES, *real_dynamo.NAMES):
        row_digest(policy)


_digest_every_row()


def interpreter() -> str:
    """How a benchmark's command line starts: under the Dynamo venv when its planner is importable."""
    prefix = f"{CACHE_ENV}=~/.cache/xpyd/bench-outcomes " if os.environ.get(CACHE_ENV) else ""
    return f'{prefix}"$(hack/dynamo-bench)"' if real_dynamo.available() else ".venv/bin/python"
