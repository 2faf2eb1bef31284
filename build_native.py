"""Compile the simulator's event loop (xpyd_controller/sim/engine.py) with mypyc, as `engine_native`.

One build path for both users: `hack/native` (a checkout, cached by source digest) and the wheel
build (`setup.py`, as black and mypy ship compiled wheels). The compiled copy gets its own module
name beside the source with a stamp of the sources it was built from; `sim/native.py` runs it only
while the stamp matches. Without a C compiler or mypyc the caller keeps the pure-Python source.

    python build_native.py PACKAGE_PARENT OUT_DIR   # PACKAGE_PARENT holds xpyd_controller/
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path


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
        shutil.copy(sim / "engine.py", sim / "engine_native.py")
        done = subprocess.run(
            [sys.executable, "-m", "mypyc", "xpyd_controller/sim/engine_native.py"],
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
