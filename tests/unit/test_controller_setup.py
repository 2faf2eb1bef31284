"""A PDDeployment spec → the policy's context: the request flow follows the engine and the router."""

from __future__ import annotations

import pytest
from tests.unit.operator_builders import make_spec

from xpyd_controller.control.setup import policy_context


@pytest.mark.parametrize(
    ("engine", "router", "flow"),
    [
        ("vllm", "vllm-router", "prefill_first"),  # vllm-router: prefill, then decode with the KV's address
        ("sglang", "sglang-router", "decode_first"),  # to both at once; decode pre-allocates KV
        ("vllm", "none", "decode_first"),
        ("custom", "vllm-router", "decode_first"),
    ],
)
def test_request_flow_follows_engine_and_router(engine: str, router: str, flow: str) -> None:
    spec = make_spec(
        model={"preset": "llama-3.1-8b"}, engine={"type": engine}, router={"type": router, "image": "r:1"}
    )
    assert policy_context(spec).request_flow == flow
