"""The stand-in stops like vLLM 0.32 on SIGTERM: in-flight requests get `--shutdown-timeout` seconds."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
import urllib.request

import pytest
from e2e.harness.procs import free_port, kill_pid

REQUEST_TOKENS = 600  # about 3 s of decoding on the default simulated hardware


def answer_after_sigterm(shutdown_timeout: float) -> str:
    """Start a request, SIGTERM the stand-in 0.3 s later; "ok" when the request still completed."""
    port = free_port()
    argv = [sys.executable, "-m", "xpyd_controller.standin", "--host", "127.0.0.1", "--port", str(port)]
    process = subprocess.Popen([*argv, "--shutdown-timeout", str(shutdown_timeout)])
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        outcome: list[str] = []

        def send() -> None:
            body = json.dumps({"prompt": "a b c", "max_tokens": REQUEST_TOKENS}).encode()
            request = urllib.request.Request(
                f"http://127.0.0.1:{port}/v1/completions", body, {"Content-Type": "application/json"}
            )
            try:
                usage = json.loads(urllib.request.urlopen(request, timeout=60).read())["usage"]
                outcome.append("ok" if usage["completion_tokens"] == REQUEST_TOKENS else str(usage))
            except OSError as error:
                outcome.append(repr(error))

        sender = threading.Thread(target=send)
        sender.start()
        time.sleep(0.3)
        process.send_signal(signal.SIGTERM)
        sender.join(timeout=90)
        assert process.wait(timeout=60) == 0
        return outcome[0]
    finally:
        kill_pid(process.pid)


@pytest.mark.timeout(180)
def test_in_flight_requests_finish_within_the_shutdown_timeout_and_not_without_one() -> None:
    assert answer_after_sigterm(30) == "ok"
    assert answer_after_sigterm(0) != "ok"
