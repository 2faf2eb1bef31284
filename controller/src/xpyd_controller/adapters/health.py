"""The controller's health endpoint: /healthz says the decision loop still completes passes (a wedged
loop gets the pod restarted), /readyz that it completed one. Served on its own port, on a thread."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class LoopHealth:
    """When the loop last finished a pass; stale after `stale_after_s` without one."""

    def __init__(self, stale_after_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.stale_after_s = stale_after_s
        self._clock = clock
        self._started = clock()
        self._last_pass: float | None = None

    def pass_done(self) -> None:
        self._last_pass = self._clock()

    @property
    def ready(self) -> bool:
        return self._last_pass is not None

    @property
    def live(self) -> bool:
        """A pass finished recently (or the loop is still within its first grace period)."""
        last = self._started if self._last_pass is None else self._last_pass
        return self._clock() - last <= self.stale_after_s


def serve_health(health: LoopHealth, port: int, address: str) -> ThreadingHTTPServer:
    """Start the /healthz and /readyz server on a daemon thread; returns it (for shutdown)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            ok = {"/healthz": health.live, "/readyz": health.ready}.get(self.path)
            if ok is None:
                self.send_error(404)
                return
            body = b"ok\n" if ok else b"loop stalled\n" if self.path == "/healthz" else b"no pass yet\n"
            self.send_response(200 if ok else 503)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:  # probes every few seconds: not worth a log line
            pass

    server = ThreadingHTTPServer((address, port), Handler)
    threading.Thread(target=server.serve_forever, name="health", daemon=True).start()
    return server
