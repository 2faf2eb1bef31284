"""Test and demo helpers (like `xpyd_operator.testing`): the controller as a real subprocess."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from xpyd_operator.testing import OperatorProcess


class ControllerProcess(OperatorProcess):
    """`python -m xpyd_controller.controller ARGS` against a cluster, with the operator's process handling
    (own session, SIGKILL by default, log tail)."""

    def __init__(self, env: Mapping[str, str], log_path: Path, args: Sequence[str]) -> None:
        super().__init__(env, log_path)
        self.argv = [sys.executable, "-m", "xpyd_controller.controller", *args]
