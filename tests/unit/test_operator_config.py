"""Operator settings from the environment: defaults, parsing, and errors naming the variable."""

from __future__ import annotations

import pytest

from xpyd_operator.core.config import OperatorConfig


def test_defaults() -> None:
    assert OperatorConfig.from_env({}) == OperatorConfig()


def test_values_are_parsed() -> None:
    config = OperatorConfig.from_env({"XPYD_PROBE_POD_IP": "false", "XPYD_ACTIVE_POLL_SECONDS": "0.2"})
    assert config.probe_pod_ip is False and config.active_poll_seconds == 0.2


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"XPYD_PROBE_POD_IP": "maybe"}, "XPYD_PROBE_POD_IP='maybe'"),
        ({"XPYD_RESYNC_SECONDS": "soon"}, "XPYD_RESYNC_SECONDS='soon' must be a number"),
        ({"XPYD_ACTIVE_POLL_SECONDS": "0"}, "XPYD_ACTIVE_POLL_SECONDS='0' must be greater than 0"),
    ],
)
def test_bad_values_name_the_variable(env: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        OperatorConfig.from_env(env)
