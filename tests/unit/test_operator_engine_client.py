"""Engine HTTP adapter: parsing in-flight counts, and real calls against a loopback HTTP server."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from http.server import BaseHTTPRequestHandler
from typing import Any

import pytest
from e2e.harness.loopback import loopback_server
from tests.unit.operator_builders import D, make_instance

from xpyd_api.engines import ENGINES, EngineType
from xpyd_api.names import Role
from xpyd_operator.adapters import engine_client

VLLM = ENGINES[EngineType.VLLM].in_flight
CUSTOM = ENGINES[EngineType.CUSTOM].in_flight

PARSE_CASES = [
    ("vllm:num_requests_running 3\nvllm:num_requests_waiting 2\n", VLLM, 5),
    (
        '# HELP x\nvllm:num_requests_running{model_name="a b"} 1.0\nvllm:num_requests_running{model_name="c"} 2\n'
        'vllm:num_requests_waiting{model_name="a b"} 0\n',
        VLLM,
        3,
    ),
    ("vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n", VLLM, 0),
    ("vllm:num_requests_running 4\n", VLLM, None),  # half the data is no data
    ("", VLLM, None),
    ("vllm:num_requests_running NaN\nvllm:num_requests_waiting 1\n", VLLM, None),
    ("sglang:num_running_reqs 2\nsglang:num_queue_reqs 7\n", CUSTOM, 9),
]


@pytest.mark.parametrize(("text", "families", "expected"), PARSE_CASES)
def test_parse_in_flight(text: str, families: Any, expected: int | None) -> None:
    assert engine_client.parse_in_flight(text, families) == expected


class _Engine(BaseHTTPRequestHandler):
    role = "decode"
    in_flight = 4
    switches: list[dict[str, Any]] = []  # noqa: RUF012 (shared with the test by design)

    def do_GET(self) -> None:
        if self.path == "/metrics":
            text = f"vllm:num_requests_running {self.in_flight}\nvllm:num_requests_waiting 0\n"
            self._send(200, text.encode())
        elif self.path == "/workers":  # vllm-router 0.1.17's shape (measured)
            workers = [
                {"url": "http://10.0.0.5:8000", "worker_type": "decode", "is_healthy": True, "load": 6},
                {"url": "http://10.0.0.6:8000", "worker_type": "prefill", "is_healthy": False, "load": 0},
                {"url": "http://10.0.0.7:9999", "worker_type": "prefill", "is_healthy": True, "load": 0},
            ]
            self._send(200, json.dumps({"workers": workers, "total": 3}).encode())
        elif self.path == "/server_info":  # SGLang's shape: launch args on top, live role per scheduler
            state = {"disaggregation_mode": type(self).role, "decode_cuda_graph_memory_gb": 1.5}
            info = {"disaggregation_mode": "prefill", "internal_states": [state, dict(state)]}
            self._send(200, json.dumps(info).encode())
        else:
            self._send(404, b"")

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if body.get("new_role") not in ("prefill", "decode"):
            self._send(400, b"bad role")
            return
        type(self).role = body["new_role"]
        type(self).switches.append(body)
        self._send(200, b"{}")

    def _send(self, code: int, payload: bytes) -> None:
        self.send_response(code)
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def engine_url() -> Iterator[str]:
    with loopback_server(_Engine) as address:
        yield f"http://{address}"


def test_read_switch_and_verify_against_a_live_endpoint(engine_url: str) -> None:
    assert engine_client.read_in_flight(f"{engine_url}/metrics", EngineType.VLLM, 2.0) == 4
    assert engine_client.reported_role(f"{engine_url}/server_info", 2.0) == "decode"
    engine_client.switch_role(f"{engine_url}/pd_role_switch", Role.PREFILL, 2.0)
    assert engine_client.reported_role(f"{engine_url}/server_info", 2.0) == "prefill"
    engine_client.switch_role(
        f"{engine_url}/pd_role_switch", Role.DECODE, 2.0, {"decode_cuda_graph_memory_gb": 2}
    )
    assert _Engine.switches[-1] == {"new_role": "decode", "decode_cuda_graph_memory_gb": 2}


def test_role_is_read_from_internal_states_not_launch_args(engine_url: str) -> None:
    """The top level says prefill (launch args); the schedulers say decode: the live role wins."""
    _Engine.role = "decode"
    assert engine_client.reported_role(f"{engine_url}/server_info", 2.0) == "decode"


@pytest.mark.parametrize(
    ("info", "expected"),
    [
        ({"disaggregation_mode": "decode"}, None),
        ({"internal_states": [{"disaggregation_mode": "decode"}, {"disaggregation_mode": "prefill"}]}, None),
        ({"internal_states": []}, None),
        ({"internal_states": [{"disaggregation_mode": "prefill"}]}, "prefill"),
    ],
)
def test_reported_role_needs_every_scheduler_to_agree(info: dict[str, Any], expected: str | None) -> None:
    class Info(_Engine):
        def do_GET(self) -> None:
            self._send(200, json.dumps(info).encode())

    with loopback_server(Info) as address:
        assert engine_client.reported_role(f"http://{address}/server_info", 2.0) == expected


def test_decode_graph_settings_from_a_peer(engine_url: str) -> None:
    assert engine_client.decode_graph_settings(f"{engine_url}/server_info", 2.0) == {
        "decode_cuda_graph_memory_gb": 1.5
    }
    assert engine_client.decode_graph_settings("http://127.0.0.1:9/server_info", 0.5) == {}


def test_failures_are_no_data_or_named_errors(engine_url: str) -> None:
    assert engine_client.read_in_flight(f"{engine_url}/missing", EngineType.VLLM, 2.0) is None
    assert engine_client.read_in_flight("http://127.0.0.1:9/metrics", EngineType.VLLM, 0.5) is None
    with pytest.raises(engine_client.EngineError, match="pd_role_switch"):
        engine_client.switch_role("http://127.0.0.1:9/pd_role_switch", Role.DECODE, 0.5)


@pytest.mark.parametrize(
    ("engine", "probe", "expected"),
    [
        ("http://e:2/", False, "http://e:2/metrics"),
        (None, True, "http://10.0.0.5:8000/metrics"),
        (None, False, None),
    ],
)
def test_metrics_url_precedence(engine: str | None, probe: bool, expected: str | None) -> None:
    instance = replace(make_instance("x-1", D), engine_url=engine, pod_ip="10.0.0.5")
    assert engine_client.metrics_url(instance, EngineType.VLLM, 8000, probe) == expected


def test_router_worker_hosts_lists_every_engine_on_the_engine_port(engine_url: str) -> None:
    """Unhealthy workers too: the router keeps them in its pool and may take them back."""
    assert engine_client.router_worker_hosts(engine_url, 8000, 2.0) == {"10.0.0.5", "10.0.0.6"}
    assert engine_client.router_worker_hosts("http://127.0.0.1:9", 8000, 0.5) is None
