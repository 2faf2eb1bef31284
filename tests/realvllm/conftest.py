"""The real-vLLM stack, started once for the module (minutes of engine start-up on 2 cores)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from e2e.harness.vllm_stack import RealStack, real_stack


@pytest.fixture(scope="module", name="real_stack")
def real_stack_fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealStack]:
    with real_stack(tmp_path_factory.mktemp("realvllm")) as stack:
        yield stack
