"""Compile the simulator's event loop (xpyd_controller/sim/engine.py and its parts, engine_*.py) with
mypyc, as `engine_native`.

One build path for both users: `hack/native` (a checkout, cached by source digest) and the wheel
build (`setup.py`, as black and mypy ship compiled wheels). Each module is compiled as a copy under
its own name beside the source (engine.py as engine_native, engine_PART.py as engine_native_PART, the
imports between them renamed to match), all in one library so that calls between the parts stay
native; `sim/native.py` runs the build only while its stamp matches the sources. Without a C compiler
or mypyc the caller keeps the pure-Python source.

    python build_native.py PACKAGE_PARENT OUT_DIR   # PACKAGE_PARENT holds xpyd_controller/
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

# The compiled modules' library (`engine_native__mypyc`), beside their copies in the package.
NATIVE_GROUP = "xpyd_controller.sim.engine_native"
# `xpyd_controller.sim.engine_PART` in an import: renamed to the compiled copy's name.
_PART_IMPORT = re.compile(r"(\bxpyd_controller\.sim\.)engine_(?=\w)")


def compiled_sources(sim: Path) -> list[Path]:
    """engine.py and its parts, every `engine_*.py` in `sim` (the same rule as sim/native.py's)."""
    parts = sorted(path for path in sim.glob("engine_*.py") if not path.name.startswith("engine_native"))
    return [sim / "engine.py", *parts]


class NativeBuildError(RuntimeError):
    """The compile could not run or failed; the message says which step and why."""


def compile_engine(package_parent: Path, out_dir: Path) -> list[Path]:
    """Build engine_native from `package_parent`/xpyd_controller into `out_dir`; the files written."""
    if shutil.which(os.environ.get("CC", "cc")) is None:
        raise NativeBuildError(f"no C compiler ({os.environ.get('CC', 'cc')}) on PATH")
    try:
        import mypyc  # noqa: F401
    except ImportError as error:
        raise NativeBuildError(f"mypyc is not importable ({error})") from None
    with tempfile.TemporaryDirectory() as folder:
        build = Path(folder)
        # The other xpyd modules stay interpreted; mypyc reads them for their types only.
        shutil.copytree(
            package_parent / "xpyd_controller",
            build / "xpyd_controller",
            ignore=shutil.ignore_patterns("__pycache__", "*.so", "engine_native*"),
        )
        # The engine imports the shared contract (xpyd_api): a wheel build has it beside xpyd_controller,
        # a checkout in operator/src.
        shared = package_parent / "xpyd_api"
        if not shared.is_dir():
            shared = package_parent.parent.parent / "operator" / "src" / "xpyd_api"
        shutil.copytree(shared, build / "xpyd_api", ignore=shutil.ignore_patterns("__pycache__"))
        sim = build / "xpyd_controller" / "sim"
        compiled = []
        for source in compiled_sources(sim):
            target = sim / source.name.replace("engine", "engine_native", 1)
            target.write_text(_PART_IMPORT.sub(r"\1engine_native_", source.read_text()))
            compiled.append(str(target.relative_to(build)))
        (build / "setup_native.py").write_text(
            "from setuptools import setup\n"
            "from mypyc.build import mypycify\n"
            f"setup(name='engine_native', ext_modules=mypycify({compiled!r}, opt_level='3', debug_level='1',"
            f" group_name={NATIVE_GROUP!r}))\n"
        )
        done = subprocess.run(
            [sys.executable, "setup_native.py", "build_ext", "--inplace"],
            cwd=build,
            env={**os.environ, "MYPYPATH": str(build)},
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise NativeBuildError("mypyc failed:\n" + (done.stdout + done.stderr)[-3000:])
        digest = subprocess.run(
            [
                sys.executable,
                "-c",
                "from xpyd_controller.sim.native import source_digest; print(source_digest())",
            ],
            cwd=build,
            env={**os.environ, "PYTHONPATH": str(build)},
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        out_dir.mkdir(parents=True, exist_ok=True)
        written = []
        for library in sorted(sim.glob("engine_native*.so")) + sorted(build.glob("engine_native*.so")):
            target = out_dir / library.name
            shutil.copy(library, target)
            written.append(target)
        if not written:
            raise NativeBuildError("mypyc produced no extension module")
        stamp = out_dir / "engine_native.stamp"
        stamp.write_text(digest + "\n")
        return [*written, stamp]


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    try:
        for path in compile_engine(Path(sys.argv[1]), Path(sys.argv[2])):
            print(path)
    except NativeBuildError as error:
        sys.exit(f"build_native: {error}")
