"""Small process utilities shared by the harness: free loopback ports, waiting, and killing by pid."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import time
from collections.abc import Callable
from pathlib import Path


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_until(condition: Callable[[], bool], timeout: float, what: str, interval: float = 0.2) -> None:
    """Poll `condition` until it is true; raise TimeoutError naming `what` otherwise."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")


def pid_alive(pid: int) -> bool:
    """True while `pid` runs; a zombie (exited, not yet reaped by its parent) counts as gone."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def kill_pid(pid: int, grace: float = 5.0) -> None:
    """SIGTERM, then SIGKILL after `grace` seconds; silently done if the process is already gone."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            return
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> None:
    """Adopt orphaned descendants (Linux), so detached processes we start can be reaped, not left defunct.

    kwokctl starts components with setsid and exits; without this they are re-parented to PID 1, which in
    some sandboxes never reaps them, and `ps` keeps showing zombies after teardown.
    """
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def pids_in(directory: Path) -> list[int]:
    """The pids named by `*.pid` files under `directory`."""
    pids = []
    for pid_file in sorted(directory.glob("**/*.pid")):
        with contextlib.suppress(ValueError, OSError):
            pids.append(int(pid_file.read_text().strip()))
    return pids


def kill_and_reap(pids: list[int]) -> None:
    """Stop whichever of `pids` still run (waiting until each has exited), then reap our adopted children."""
    for pid in pids:
        kill_pid(pid)
    for pid in pids:
        _reap(pid)


def _reap(pid: int, timeout: float = 5.0) -> None:
    """Collect `pid`'s exit status if it is our child. A multi-threaded (Go) process can look defunct
    before its last thread is gone, when `waitpid` cannot collect it yet, so poll briefly."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            reaped, _ = os.waitpid(pid, os.WNOHANG)
        except (ChildProcessError, OSError):
            return  # not our child (or already collected): its own parent reaps it
        if reaped == pid:
            return
        time.sleep(0.05)
