"""The engine stand-in behind the real vllm-router (PyPI 0.1.17): the router's PD flow reaches prefill and
decode as it would reach vLLM, the decode side pulls the prefill's KV blocks, streaming works, and a pull
from a prefill that no longer holds the blocks is recomputed locally (as vLLM does)."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e.harness.dataplane import Started, router_process, standin_argv, started_process
from e2e.harness.procs import free_port

HOST = "127.0.0.1"


@pytest.fixture
def pd_pair(tmp_path: Path) -> Iterator[tuple[Started, Started, Started]]:
    """One prefill and one decode stand-in behind the real router, by static URLs."""
    ports = [free_port() for _ in range(4)]
    with (
        started_process(
            standin_argv(HOST, ports[0]), f"http://{HOST}:{ports[0]}", "/health", tmp_path / "p.log"
        ) as p,
        started_process(
            standin_argv(HOST, ports[1], "--stream-interval", "4"),
            f"http://{HOST}:{ports[1]}",
            "/health",
            tmp_path / "d.log",
        ) as d,
    ):
        args = ["--host", HOST, "--port", str(ports[2]), "--vllm-pd-disaggregation"]
        args += [
            "--prefill",
            p.url,
            "--decode",
            d.url,
            "--prometheus-host",
            HOST,
            "--prometheus-port",
            str(ports[3]),
        ]
        with router_process(["vllm-router"], args, HOST, ports[2], tmp_path / "router.log") as router:
            try:
                yield p, d, router
            finally:
                print(router.log_tail(30))


def complete(router: Started, body: dict[str, object]) -> bytes:
    request = urllib.request.Request(
        f"{router.url}/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status == 200
        return bytes(response.read())


def test_the_router_runs_prefill_then_decode_and_the_decode_pulls_the_prefills_blocks(
    pd_pair: tuple[Started, Started, Started],
) -> None:
    prefill, decode, router = pd_pair
    answer = json.loads(
        complete(router, {"model": "standin/model", "prompt": list(range(300)), "max_tokens": 7})
    )
    assert answer["usage"]["completion_tokens"] == 7
    assert answer["choices"][0]["text"] == " tok" * 7
    stream = complete(
        router, {"model": "standin/model", "prompt": "a b c d", "max_tokens": 9, "stream": True}
    )
    chunks = [line.removeprefix(b"data: ") for line in stream.split(b"\n\n") if line.startswith(b"data: ")]
    assert chunks[-1] == b"[DONE]"
    texts = [json.loads(chunk)["choices"][0]["text"] for chunk in chunks[:-1]]
    # The first token at once, then at every 4th token (--stream-interval 4), then the end.
    assert texts == [" tok", " tok" * 3, " tok" * 4, " tok"]

    on_prefill = prefill.get_json("/xpyd/requests")
    on_decode = decode.get_json("/xpyd/requests")
    assert [(r["kind"], r["prompt_tokens"], r["max_tokens"]) for r in on_prefill["requests"]] == [
        ("prefill", 300, 1),
        ("prefill", 4, 1),
    ]
    assert [(r["kind"], r["max_tokens"], r["kv_pull"]) for r in on_decode["requests"]] == [
        ("decode", 7, "ok"),
        ("decode", 9, "ok"),
    ]
    assert [r["request_id"] for r in on_prefill["requests"]] == [
        r["request_id"] for r in on_decode["requests"]
    ]
    assert on_prefill["leased_blocks"] == 0  # pulled, so freed before the lease ran out
    assert on_prefill["health_checks"] >= 1 and on_decode["health_checks"] >= 1


def test_a_decode_whose_pull_fails_recomputes_the_prompt_itself(
    pd_pair: tuple[Started, Started, Started],
) -> None:
    _, decode, _ = pd_pair
    params = {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "remote_block_ids": [0, 1],
        "remote_engine_id": "gone",
        "remote_host": HOST,
        "remote_port": free_port(),
    }
    body = {"model": "standin/model", "prompt": [1, 2, 3], "max_tokens": 2, "kv_transfer_params": params}
    request = urllib.request.Request(
        f"{decode.url}/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        assert json.loads(response.read())["usage"]["completion_tokens"] == 2
    (entry,) = decode.get_json("/xpyd/requests")["requests"]
    assert entry["kind"] == "decode" and entry["kv_pull"] != "ok" and entry["status"] == "ok"
