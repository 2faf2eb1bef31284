"""The controller's /healthz and /readyz: a loop that stops completing passes is reported stalled."""

from __future__ import annotations

import urllib.error
import urllib.request

from e2e.harness.procs import free_port

from xpyd_controller.adapters.health import LoopHealth, serve_health


def test_live_until_no_pass_for_too_long_ready_after_the_first() -> None:
    now = [0.0]
    health = LoopHealth(30.0, clock=lambda: now[0])
    assert health.live and not health.ready
    now[0] = 20.0
    health.pass_done()
    now[0] = 49.0
    assert health.live and health.ready
    now[0] = 51.0
    assert not health.live


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as error:
        return error.code


def test_endpoints_answer_on_loopback() -> None:
    now = [0.0]
    health = LoopHealth(30.0, clock=lambda: now[0])
    port = free_port()
    server = serve_health(health, port, "127.0.0.1")
    try:
        base = f"http://127.0.0.1:{port}"
        assert _status(f"{base}/healthz") == 200 and _status(f"{base}/readyz") == 503
        health.pass_done()
        now[0] = 100.0
        assert _status(f"{base}/healthz") == 503 and _status(f"{base}/readyz") == 200
        assert _status(f"{base}/other") == 404
    finally:
        server.shutdown()
        server.server_close()
