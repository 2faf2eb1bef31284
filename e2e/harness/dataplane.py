"""Data-plane processes for tests: the real vllm-router binary and engine stand-ins, each tracked by pid.

The router renames its process (`vllm::router`), so it is never looked up by name: the Popen pid is what
teardown kills. Logs go to files the caller names, printed by `log_tail` when a test fails.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from e2e.harness.procs import kill_pid, wait_until
from xpyd_api.engines import STANDIN_MODULE

VENV_BIN = Path(sys.executable).parent
ROUTER_BINARY = VENV_BIN / "vllm-router"  # from the dev extra (PyPI vllm-router, pinned in pyproject)


@dataclass
class Started:
    """A process a test started: its pid, where it answers and its log."""

    pid: int
    url: str
    log_path: Path
    process: subprocess.Popen[bytes]

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def get_json(self, path: str, timeout: float = 5) -> Any:
        with urllib.request.urlopen(f"{self.url}{path}", timeout=timeout) as response:
            return json.loads(response.read())


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
        return False


@contextlib.contextmanager
def started_process(
    argv: Sequence[str],
    url: str,
    ready_path: str,
    log_path: Path,
    *,
    env: Mapping[str, str] | None = None,
    startup_timeout: float = 60,
) -> Iterator[Started]:
    """Start `argv`, wait until `url + ready_path` answers 200, and kill it by pid on exit."""
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            list(argv),
            stdout=log,
            stderr=subprocess.STDOUT,
            env=dict(env or os.environ),
            start_new_session=True,
        )
    started = Started(process.pid, url, log_path, process)
    try:
        wait_until(
            lambda: process.poll() is not None or answers(url + ready_path),
            startup_timeout,
            f"{Path(argv[0]).name} at {url}",
        )
        if process.poll() is not None:
            raise RuntimeError(f"{argv[0]} exited with {process.returncode}:\n{started.log_tail()}")
        yield started
    finally:
        kill_pid(process.pid)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=10)


def standin_argv(host: str, port: int, *extra: str) -> list[str]:
    return [sys.executable, "-m", STANDIN_MODULE, "--host", host, "--port", str(port), *extra]


@contextlib.contextmanager
def router_process(
    command: Sequence[str],
    args: Sequence[str],
    host: str,
    port: int,
    log_path: Path,
    *,
    env: Mapping[str, str] | None = None,
) -> Iterator[Started]:
    """The real router started with `command` + `args` (a rendered container's), the binary from the venv.

    `command[0]` names the router binary the container image has; here it is the venv's copy of it.
    """
    if Path(command[0]).name != ROUTER_BINARY.name:
        raise ValueError(f"router command = {list(command)!r}: only {ROUTER_BINARY.name} is installed here")
    argv = [str(ROUTER_BINARY), *command[1:], *args]
    with started_process(argv, f"http://{host}:{port}", "/health", log_path, env=env) as router:
        yield router
