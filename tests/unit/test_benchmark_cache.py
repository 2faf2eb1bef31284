"""The bench cache keys a row by the sources its run imports: a real-Dynamo row and the baselines'
rows survive a change to xpyd's policy, and any change to what they do import is a new key."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_cache

REPO = Path(__file__).resolve().parents[2]
CONTROLLER = "controller/src/xpyd_controller/"


def sources(policy: str) -> set[str]:
    files = bench_cache.import_closure(bench_cache.SIMULATION + bench_cache.policy_modules(policy))
    return {str(path.relative_to(REPO)) for path in files.values()}


def test_a_real_dynamo_row_depends_on_the_simulator_and_the_adapter_not_on_xpyds_policy() -> None:
    found = sources("dynamo-1.6.1-arima")
    assert {
        "benchmarks/real_dynamo.py",
        "benchmarks/peers/aisimulate_core/sdk.py",
        CONTROLLER + "sim/engine.py",
        CONTROLLER + "model/roofline.py",
        "operator/src/xpyd_api/resize.py",
    } <= found
    assert (
        not {
            CONTROLLER + "policy/xpyd/policy.py",
            CONTROLLER + "policy/registry.py",
            "operator/src/xpyd_api/models.py",
        }
        & found
    )


def test_a_baselines_row_reads_the_registry_but_not_the_other_policies() -> None:
    static, xpyd = sources("static"), sources("xpyd")
    assert {CONTROLLER + "policy/static.py", CONTROLLER + "policy/registry.py"} <= static
    assert CONTROLLER + "policy/xpyd/policy.py" not in static
    assert {CONTROLLER + "policy/xpyd/policy.py", CONTROLLER + "policy/forecast.py"} <= xpyd
    assert CONTROLLER + "sim/oracles.py" in sources("oracle-window")


def test_the_closure_follows_imports_parents_and_packages_imported_by_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def write(relative: str, text: str = "") -> None:
        path = tmp_path / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")

    write("pkg/__init__.py", "import pkg.top\n")
    write("pkg/top.py")
    write("pkg/a.py", "from pkg import b\ndef lazy():\n    from pkg.lazy import load\n")
    write("pkg/b.py")
    write("pkg/unused.py")
    write("pkg/lazy/__init__.py", "_LAZY = {'load': 'impl'}\n")
    write("pkg/lazy/impl.py")
    monkeypatch.setattr(bench_cache, "SOURCE_ROOTS", {"pkg": tmp_path})
    found = {str(path.relative_to(tmp_path)) for path in bench_cache.import_closure(["pkg.a"]).values()}
    assert found == {
        "pkg/__init__.py",
        "pkg/top.py",
        "pkg/a.py",
        "pkg/b.py",
        "pkg/lazy/__init__.py",
        "pkg/lazy/impl.py",
    }


def test_a_changed_source_is_a_new_key_only_for_the_rows_importing_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    static, dynamo = bench_cache.row_digest("static"), bench_cache.row_digest("dynamo-1.6.1-arima")
    shutil.copytree(
        bench_cache.SOURCE_ROOTS["xpyd_controller"] / "xpyd_controller", tmp_path / "xpyd_controller"
    )
    edited = tmp_path / "xpyd_controller/policy/static.py"
    edited.write_text(edited.read_text(encoding="utf-8") + "\n# edited\n", encoding="utf-8")
    monkeypatch.setitem(bench_cache.SOURCE_ROOTS, "xpyd_controller", tmp_path)
    bench_cache.row_digest.cache_clear()
    try:
        assert bench_cache.row_digest("static") != static
        assert bench_cache.row_digest("dynamo-1.6.1-arima") == dynamo
    finally:
        bench_cache.row_digest.cache_clear()
