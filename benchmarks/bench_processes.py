"""The environment a timed child process runs in: bytecode cached, as an installed package runs.

pip compiles a wheel's modules on install, so a user's `xpyd` never compiles at start-up. A benchmark
run from a checkout under PYTHONDONTWRITEBYTECODE (or on its first run) would instead compile every
xpyd module in every process, while numpy's bytecode comes precompiled from its wheel: that times the
compiler, not the start-up. Children read and write bytecode under one temporary folder
(PYTHONPYCACHEPREFIX, so numpy's is cached there too and the checkout stays clean); each timed
command gets one untimed warm-up run first.
"""

from __future__ import annotations

import os
from pathlib import Path


def cached_bytecode_env(folder: Path) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = str(folder)
    return env
