"""Test and benchmark helpers (like `kopf.testing`): the operator as a real subprocess, and engine stubs.

Pods on fake (kwok) nodes run nothing, so `EngineStub` plays their engines on 127.0.0.1: one HTTP server,
one path prefix per pod (`/<pod>/metrics`, `/<pod>/pd_role_switch`, `/<pod>/server_info`). Tests point
the operator at it through the pods' `xpyd.dev/engine-url` annotation; nothing talks to pod IPs.
"""

from __future__ import annotations

import contextlib
import json
import sys
import threading
from collections.abc import Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from xpyd_api.testing import ProgramProcess


class EngineStub:
    """Simulated engine endpoints for many pods; in-flight and finished counts and roles are set by the
    test."""

    def __init__(self) -> None:
        self.in_flight: dict[str, int] = {}
        self.finished: dict[str, int] = {}
        self.roles: dict[str, str] = {}
        self.switch_calls: list[tuple[str, str]] = []  # every role-switch POST that arrived
        self.switch_arrived = threading.Event()
        self._lock = threading.Lock()
        self._switches_released = threading.Event()
        self._switches_released.set()
        self._switches_take_effect = True
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                pod, _, endpoint = self.path.strip("/").partition("/")
                with stub._lock:
                    if endpoint == "metrics":
                        n, done = stub.in_flight.get(pod, 0), stub.finished.get(pod, 0)
                        text = (  # both engines' gauge names, so one stub serves vLLM and SGLang pods
                            f"vllm:num_requests_running {n}\nvllm:num_requests_waiting 0\n"
                            f"vllm:request_prompt_tokens_count {done}\n"
                            f"sglang:num_running_reqs {n}\nsglang:num_queue_reqs 0\n"
                        )
                        self._reply(200, text.encode())
                    elif endpoint == "server_info":
                        # SGLang's shape: the live role per scheduler (the top level is launch args)
                        state = {"disaggregation_mode": stub.roles.get(pod)}
                        self._reply(200, json.dumps({"internal_states": [state]}).encode())
                    else:
                        self._reply(404, b"not found")

            def do_POST(self) -> None:
                pod, _, _endpoint = self.path.strip("/").partition("/")
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                with stub._lock:
                    stub.switch_calls.append((pod, str(body.get("new_role"))))
                    held = not stub._switches_released.is_set()
                stub.switch_arrived.set()
                stub._switches_released.wait()
                with stub._lock:
                    if stub._switches_take_effect or not held:
                        stub.roles[pod] = str(body.get("new_role"))
                with contextlib.suppress(OSError):  # the caller may have been killed while it was held
                    self._reply(200, b"{}")

            def _reply(self, code: int, payload: bytes) -> None:
                self.send_response(code)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def url(self, pod: str) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/{pod}"

    def set_in_flight(self, pod: str, count: int) -> None:
        with self._lock:
            self.in_flight[pod] = count

    def set_finished(self, pod: str, count: int) -> None:
        with self._lock:
            self.finished[pod] = count

    def hold_switches(self) -> None:
        """Keep role-switch POSTs unanswered after they arrive (an engine busy switching), so a test
        can kill the caller mid-call."""
        self._switches_released.clear()

    def release_switches(self, took_effect: bool) -> None:
        """Answer the held POSTs; `took_effect=False` drops their switch, as if the call never arrived
        (a caller killed right after recording its intent). Later POSTs take effect."""
        with self._lock:
            self._switches_take_effect = took_effect
        self._switches_released.set()

    def __enter__(self) -> EngineStub:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._switches_released.set()
        self._server.shutdown()
        self._server.server_close()


class OperatorProcess(ProgramProcess):
    """`kopf run -m xpyd_operator.entry.handlers --standalone` against a cluster; killed on exit, always."""

    def __init__(
        self,
        env: Mapping[str, str],
        log_path: Path,
        namespaces: Sequence[str] = (),
        settings: Mapping[str, str] | None = None,
    ) -> None:
        scope = [arg for ns in namespaces for arg in ("--namespace", ns)] or ["--all-namespaces"]
        argv = [
            sys.executable,
            "-m",
            "kopf",
            "run",
            "--standalone",
            "-m",
            "xpyd_operator.entry.handlers",
            *scope,
        ]
        super().__init__(
            "operator", argv, {**env, "XPYD_PROBE_POD_IP": "false", **(settings or {})}, log_path
        )
