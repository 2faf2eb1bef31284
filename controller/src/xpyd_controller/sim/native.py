"""Which build of the event loop runs: `engine.py` as compiled by mypyc, or as source.

The compiled module, `engine_native`, is built from `engine.py` and its parts (`engine_*.py`)
unchanged (same code, checked types, about twice as fast) by `build_native.py` — in a checkout through `hack/native`, and when a wheel is
built (`pip install .`, `python -m build`), as black and mypy ship theirs — and lives beside it, out of
git. Without a C compiler the wheel carries the source only. It is used only when the digest it was built
from matches the sources now: an edited engine (or a module it imports) falls back to the source
with one warning, so a stale build can never run in place of the code being read.

`XPYD_SIM_ENGINE` chooses: `auto` (default: compiled when current), `python`, or `compiled` (an error
when no current build exists; CI sets it so that the compiled engine is what the tests exercise).
"""

from __future__ import annotations

import importlib
import os
import re
import warnings
import zlib
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # `xpyd version` reads the build's state without loading the simulator
    from xpyd_controller.policy.types import Limits, Policy
    from xpyd_controller.sim import engine
    from xpyd_controller.sim.config import SimConfig
    from xpyd_controller.sim.traces import Trace

ENGINE_SOURCE = Path(__file__).with_name("engine.py")
NATIVE_MODULE = "xpyd_controller.sim.engine_native"
STAMP = ENGINE_SOURCE.with_name("engine_native.stamp")
CHOICE_VARIABLE = "XPYD_SIM_ENGINE"
CHOICES = ("auto", "python", "compiled")


class RunEvents(Protocol):
    def __call__(
        self,
        config: SimConfig,
        requests: Trace,
        policy: Policy | None = None,
        limits: Limits | None = None,
        progress: engine.ProgressFn | None = None,
    ) -> engine.RawRun: ...


class NativeEngineError(RuntimeError):
    """No current compiled build (`status` says why), or a bad `XPYD_SIM_ENGINE`."""

    def __init__(self, message: str, status: str = "") -> None:
        super().__init__(message)
        self.status = status


# `from xpyd_... import` lines of the engine's modules, at any indentation (a regular expression, not the `ast`
# module: parsing the engine cost each `xpyd simulate` ~30 ms, a tenth of a seed-table row).
_XPYD_IMPORT = re.compile(
    r"^[ \t]*from[ \t]+((?:xpyd_controller|xpyd_api)\.[\w.]+)[ \t]+import\b", re.MULTILINE
)


def compiled_sources() -> list[Path]:
    """The modules compiled into the build: engine.py and its parts, every `engine_*.py` beside it (the
    same rule as build_native.py's)."""
    parts = sorted(ENGINE_SOURCE.parent.glob("engine_*.py"))
    return [ENGINE_SOURCE, *(path for path in parts if not path.name.startswith("engine_native"))]


def _compiled_against() -> list[Path]:
    """The compiled modules and the xpyd modules they import (their own package's and xpyd_api's): what
    the compiled code assumed about types."""
    package_root = ENGINE_SOURCE.parents[2]  # the directory holding xpyd_controller/
    # the shared contract: beside it when installed, in operator/src in a checkout (as build_native.py)
    shared_root = (
        package_root if (package_root / "xpyd_api").is_dir() else package_root.parents[1] / "operator" / "src"
    )
    compiled = compiled_sources()
    paths = list(compiled)
    for source in compiled:
        for module in _XPYD_IMPORT.findall(source.read_text()):
            root = package_root if module.startswith("xpyd_controller.") else shared_root
            base = root.joinpath(*module.split("."))
            module_file = base.with_suffix(".py")
            path = module_file if module_file.exists() else base / "__init__.py"
            if path not in paths:
                paths.append(path)
    return paths


def source_digest() -> str:
    """A digest of the sources a compiled build must match (hack/native writes it to the stamp).

    CRC-32, Adler-32 and the byte count of every file's name and text (32 hex digits): a check that the
    build is not stale, not a guard against forgery, and zlib is loaded already, where hashlib's OpenSSL
    cost each `xpyd simulate` ~6 ms (3 % of a seed-table row).
    """
    crc, adler, size = 0, 1, 0
    for path in _compiled_against():
        data = path.name.encode() + b"\0" + path.read_bytes()
        crc, adler, size = zlib.crc32(data, crc), zlib.adler32(data, adler), size + len(data)
    return f"{crc:08x}{adler:08x}{size:016x}"


def compiled_status() -> str:
    """'current', 'missing' (never built here) or 'stale' (sources changed since the build)."""
    if not STAMP.exists():
        return "missing"
    return "current" if STAMP.read_text().strip() == source_digest() else "stale"


def compiled_run_events() -> RunEvents:
    """The compiled build's `run_events`; NativeEngineError when there is no current, loadable build."""
    status = compiled_status()
    if status == "current":
        try:
            native = importlib.import_module(NATIVE_MODULE)
        except ImportError as error:  # a stamp without its library (a partial copy)
            status = f"unloadable ({error})"
        else:
            run: RunEvents = native.run_events
            return run
    raise NativeEngineError(f"the compiled simulator engine is {status}: run hack/native", status)


@cache
def run_events_impl() -> tuple[RunEvents, str]:
    """(the `run_events` to use, 'compiled' or 'python'), by `XPYD_SIM_ENGINE` and the build's state."""
    choice = os.environ.get(CHOICE_VARIABLE, "auto") or "auto"
    if choice not in CHOICES:
        raise NativeEngineError(f"{CHOICE_VARIABLE}={choice!r}: must be one of {', '.join(CHOICES)}")
    if choice != "python":
        try:
            return compiled_run_events(), "compiled"
        except NativeEngineError as error:
            if choice == "compiled":
                raise NativeEngineError(f"{CHOICE_VARIABLE}=compiled but {error}", error.status) from error
            if error.status == "stale":
                warnings.warn(
                    "the compiled simulator engine is older than sim/engine.py, its parts or their imports: running the "
                    "source (about 2x slower); rebuild with hack/native",
                    stacklevel=2,
                )
    from xpyd_controller.sim import engine  # the source: loaded only when it is what runs

    return engine.run_events, "python"


def engine_description() -> str:
    """What `xpyd version` says: which engine `xpyd simulate` runs, and how to get the faster one."""
    choice = os.environ.get(CHOICE_VARIABLE, "auto") or "auto"
    status = compiled_status()
    if choice == "python":
        return f"source (pure Python; {CHOICE_VARIABLE}=python, compiled build {status})"
    if status == "current":
        return "compiled (mypyc), current with the sources"
    return (
        f"source (pure Python; compiled build {status}: in a checkout run hack/native, "
        "a wheel built with a C compiler carries it; ~2x faster)"
    )


def run_events(
    config: SimConfig,
    requests: Trace,
    policy: Policy | None = None,
    limits: Limits | None = None,
    progress: engine.ProgressFn | None = None,
) -> engine.RawRun:
    """`engine.run_events`, by the fastest current build."""
    return run_events_impl()[0](config, requests, policy, limits, progress)
