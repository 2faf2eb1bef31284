"""The real-vLLM harness runs exactly the rendered engine container: args, env and downward API."""

from __future__ import annotations

from pathlib import Path

from e2e.harness.vllm_conversion import handshake_failures
from e2e.harness.vllm_engine import container_process
from e2e.harness.vllm_stack import static_router_args, tiny_pdd

from xpyd_api.names import Role
from xpyd_operator.core import render


def test_engine_process_is_the_rendered_container_on_the_pod_ip() -> None:
    pdd = tiny_pdd(Path("/m"), 8123, 8124)
    pod = render.instance_pod(pdd, Role.DECODE, "tiny-decode")
    container = pod["spec"]["containers"][0]
    process = container_process(pod, "127.0.13.2", {"vllm": Path("/venv/bin/vllm")})
    assert process.argv[0] == "/venv/bin/vllm"
    assert list(process.argv[1:]) == [
        *container["command"][1:],
        *("127.0.13.2" if arg == "0.0.0.0" else arg for arg in container["args"]),
    ]
    assert process.env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "127.0.13.2"
    assert process.env["XPYD_ROLE"] == "decode"
    assert process.env["VLLM_CPU_OMP_THREADS_BIND"] == "1"  # decode's pool env: its own core
    assert process.url == "http://127.0.13.2:8123"


def test_static_router_args_swap_only_the_discovery() -> None:
    pdd = tiny_pdd(Path("/m"), 8123, 8124)
    deployment = render.router_deployment(pdd)
    assert deployment is not None
    rendered = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    args = static_router_args(rendered, "http://p:1", "http://d:1")
    assert "--service-discovery" not in args and "--prefill-selector" not in args
    assert not any(arg.startswith("xpyd.dev/") for arg in args)
    assert args[-4:] == ["--prefill", "http://p:1", "--decode", "http://d:1"]
    assert args[args.index("--kv-connector") + 1] == "nixl"
    assert args[: args.index("--service-discovery") if "--service-discovery" in args else 5] == rendered[:5]


def test_handshake_failures_are_read_from_vllms_own_log_lines() -> None:
    failed = "cmpl-___prefill_addr_127.186.1.6:56467___decode_addr_127.186.0.3:56467_04ba5517"
    log = "\n".join(
        [
            "(Worker pid=2601) ERROR 12-08 01:19:30 [base_worker.py:1318] zmq.error.Again: Resource "
            "temporarily unavailable",
            "(Worker pid=2601) ERROR 12-08 01:19:30 [base_worker.py:1354] NIXL transfer failure: "
            f"handshake_failed | Context: {{'failure_type': 'handshake_failed', 'request_id': '{failed}'}}",
            "(Worker pid=2601) ERROR 12-08 01:19:30 [base_worker.py:1354] Traceback (most recent call last):",
            'INFO:     127.0.0.1:38128 - "POST /v1/completions HTTP/1.1" 500 Internal Server Error',
        ]
    )
    assert handshake_failures(log) == {failed}
    assert handshake_failures("INFO: all requests served") == set()
