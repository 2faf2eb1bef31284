"""The repository layout keeps the stdlib importable and the console script working."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def test_import_operator_is_the_standard_library() -> None:
    import operator

    stdlib = Path(sysconfig.get_paths()["stdlib"]).resolve()
    # `operator` is a pure-Python stdlib module (backed by _operator); it must not be our folder.
    assert Path(operator.__file__).resolve().parent == stdlib
    assert operator.add(2, 3) == 5


@pytest.mark.parametrize("folder", ["operator", "controller"])
def test_top_level_folders_are_not_packages(folder: str) -> None:
    assert (REPO / folder).is_dir()
    assert not (REPO / folder / "__init__.py").exists()


def test_packages_import_from_their_src_folders() -> None:
    import xpyd_api
    import xpyd_controller
    import xpyd_operator

    assert Path(xpyd_api.__file__).parent == REPO / "operator" / "src" / "xpyd_api"
    assert Path(xpyd_operator.__file__).parent == REPO / "operator" / "src" / "xpyd_operator"
    assert Path(xpyd_controller.__file__).parent == REPO / "controller" / "src" / "xpyd_controller"


def _xpyd(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "xpyd_controller.cli", *args], capture_output=True, text=True, check=False
    )


def test_version_prints_the_package_version_and_the_simulator_build() -> None:
    import xpyd_controller
    from xpyd_controller.sim.native import compiled_status

    result = _xpyd("version")
    assert result.returncode == 0, result.stderr
    version, engine = result.stdout.strip().splitlines()
    assert version == f"xpyd {xpyd_controller.__version__}"
    expected = "compiled (mypyc)" if compiled_status() == "current" else "source (pure Python"
    assert engine.startswith(f"simulator engine: {expected}")
    assert _xpyd("--version").stdout.strip() == version


@pytest.mark.parametrize(
    ("argv", "loaded", "not_loaded"),
    [
        (["--help"], set(), {"numpy", "rich", "yaml", "kubernetes", "kopf", "matplotlib"}),
        (["version"], set(), {"numpy", "rich", "yaml", "kubernetes", "kopf", "matplotlib"}),
        (
            [
                *("plan", "--model", "llama-3.1-8b", "--rate", "1", "--isl", "100", "--osl", "10"),
                *("--ttft-quantile", "0.9", "--isl-std", "20", "--json"),
            ],
            {"numpy", "xpyd_controller.model.sizing"},
            # statistics (NormalDist) pulls in fractions, decimal and random: the model has its own Φ⁻¹
            {"rich", "yaml", "kubernetes", "kopf", "matplotlib", "xpyd_controller.sim.engine", "statistics"},
        ),
        # A seed-table row: importing numpy would be half its CPU time (BENCHMARKS: seed table through the CLI).
        *(
            (
                ["simulate", *split, "--rate", "28", "--json"],
                {"xpyd_controller.sim.engine_native"},
                {"numpy", "rich", "yaml", "kubernetes", "kopf", "matplotlib", "xpyd_controller.policy.xpyd"},
            )
            for split in (["--split", "6:2"], ["--mode", "colocated", "--split", "8"])
        ),
    ],
)
def test_a_command_imports_only_what_it_uses(argv: list[str], loaded: set[str], not_loaded: set[str]) -> None:
    """Start-up is most of a short call: help, the version and a plan load no simulator or cluster client,
    and a seed-table simulation no numpy."""
    probe = (
        "import sys, runpy; sys.argv = ['xpyd', *sys.argv[1:]]\n"
        "try:\n    runpy.run_module('xpyd_controller.cli', run_name='__main__')\n"
        "except SystemExit:\n    pass\n"
        "print(' '.join(sorted(sys.modules)), file=sys.stderr)"
    )
    done = subprocess.run([sys.executable, "-c", probe, *argv], capture_output=True, text=True, check=False)
    modules = set(done.stderr.strip().splitlines()[-1].split())
    assert done.stdout.strip(), done.stderr  # the command ran (the probe swallows its exit)
    from xpyd_controller.sim.native import compiled_status

    if "xpyd_controller.sim.engine_native" in loaded and compiled_status() != "current":
        loaded = (loaded - {"xpyd_controller.sim.engine_native"}) | {"xpyd_controller.sim.engine"}
    assert loaded <= modules
    assert not (not_loaded & modules)


def test_help_lists_the_subcommands() -> None:
    result = _xpyd("--help")
    assert result.returncode == 0, result.stderr
    for command in ("plan", "simulate", "version"):
        assert command in result.stdout


def test_no_command_prints_help_and_fails() -> None:
    result = _xpyd()
    assert result.returncode == 2
    assert "usage: xpyd" in result.stdout


def test_a_closed_pipe_ends_quietly() -> None:
    pipeline = subprocess.run(
        f"{sys.executable} -m xpyd_controller.cli plan --model llama-3.1-8b --gpu h100-sxm --rate 1 "
        "--isl 1000 --osl 100 --sweep rate=1:3000 | head -1",
        shell=True,
        capture_output=True,
        text=True,
        check=False,
    )
    assert pipeline.stdout.startswith("model")
    assert "Traceback" not in pipeline.stderr and "BrokenPipeError" not in pipeline.stderr
