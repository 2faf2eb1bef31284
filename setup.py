"""Wheel builds compile the simulator's event loop with mypyc (build_native.py), as black and mypy ship.

Where that cannot run (no C compiler) the wheel carries the pure-Python source only and says so;
editable installs never compile (a stale build must not shadow the code being edited: hack/native).
Everything else about the package is in pyproject.toml.
"""

from __future__ import annotations

import sys
from pathlib import Path

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

sys.path.insert(0, str(Path(__file__).resolve().parent))
from build_native import NativeBuildError, compile_engine

try:
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # setuptools < 70.1
    from wheel.bdist_wheel import bdist_wheel


class BuildPyWithNativeEngine(build_py):
    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return
        build_lib = Path(self.build_lib)
        try:
            written = compile_engine(build_lib, build_lib / "xpyd_controller" / "sim")
        except NativeBuildError as error:
            print(f"xpyd: simulator engine not compiled, the wheel runs the source: {error}", file=sys.stderr)
            return
        self.distribution.compiled_engine = True  # type: ignore[attr-defined]
        print(f"xpyd: compiled simulator engine: {', '.join(p.name for p in written)}", file=sys.stderr)


class WheelTaggedByEngine(bdist_wheel):  # type: ignore[misc]
    """Tagged for this platform when it holds the compiled engine; py3-none-any when it does not."""

    def get_tag(self) -> tuple[str, str, str]:
        self.root_is_pure = not self.distribution.compiled_engine
        tag: tuple[str, str, str] = super().get_tag()
        return tag


class XpydDistribution(Distribution):
    """A platform wheel when the engine was compiled (it holds an extension module), else pure."""

    compiled_engine = False

    def has_ext_modules(self) -> bool:
        return self.compiled_engine


setup(
    distclass=XpydDistribution,
    cmdclass={"build_py": BuildPyWithNativeEngine, "bdist_wheel": WheelTaggedByEngine},
)
