"""Test and demo helpers (like `xpyd_operator.testing`): the controller as a real subprocess."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from xpyd_api.testing import ProgramProcess


class ControllerProcess(ProgramProcess):
    """`python -m xpyd_controller.cli.controller ARGS` against a cluster (own session, SIGKILL by default,
    log tail)."""

    def __init__(self, env: Mapping[str, str], log_path: Path, args: Sequence[str]) -> None:
        super().__init__(
            "controller", [sys.executable, "-m", "xpyd_controller.cli.controller", *args], env, log_path
        )
