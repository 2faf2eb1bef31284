"""Status from observed instances: ready/desired summaries, conversions, and the four conditions."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from tests.unit.operator_builders import HASHES, NOW, D, P, convert, make_instance, make_spec

from xpyd_api.instances import Instance, rejected_flags
from xpyd_operator.core.status import (
    StatusInput,
    autoscaling_problem,
    blocked_conditions,
    compute_status,
    unsupported_flags_message,
)


def status_of(
    instances: list[Instance], router_ready: int = 1, previous: Any = (), **spec: Any
) -> dict[str, Any]:
    inp = StatusInput(3, make_spec(**spec), instances, HASHES, router_ready, previous, NOW)
    return compute_status(inp)


def conditions(status: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}


READY_PAIR = [make_instance("x-0", P), make_instance("x-1", D)]

CASES: list[tuple[str, list[Instance], int, dict[str, Any], dict[str, tuple[str, str]]]] = [
    (
        "all ready",
        READY_PAIR,
        1,
        {},
        {
            "Ready": ("True", "AllInstancesReady"),
            "Progressing": ("False", "Stable"),
            "Degraded": ("False", "Healthy"),
            "Converting": ("False", "NoConversion"),
        },
    ),
    ("router not ready", READY_PAIR, 0, {}, {"Ready": ("False", "RouterNotReady")}),
    (
        "no router wanted",
        READY_PAIR,
        0,
        {"router": {"type": "none"}},
        {"Ready": ("True", "AllInstancesReady")},
    ),
    (
        "scaling up",
        READY_PAIR,
        1,
        {"prefill": 2},
        {"Ready": ("False", "InstancesNotReady"), "Progressing": ("True", "Scaling")},
    ),
    (
        "rolling update",
        [make_instance("x-0", P, template="old"), make_instance("x-1", D)],
        1,
        {},
        {"Progressing": ("True", "RollingUpdate")},
    ),
    (
        "failed pod",
        [*READY_PAIR, make_instance("x-2", D, failed=True)],
        1,
        {},
        {"Degraded": ("True", "PodsFailed")},
    ),
    (
        "converting",
        [make_instance("x-0", P), make_instance("x-1", D), make_instance("x-2", D, transition=convert(D))],
        1,
        {"prefill": 2},
        {"Converting": ("True", "ConvertingRoles"), "Progressing": ("True", "ConvertingRoles")},
    ),
]


@pytest.mark.parametrize(
    ("title", "instances", "router", "spec", "expected"), CASES, ids=[c[0] for c in CASES]
)
def test_conditions(
    title: str,
    instances: list[Instance],
    router: int,
    spec: dict[str, Any],
    expected: dict[str, tuple[str, str]],
) -> None:
    extra = {k: v for k, v in spec.items() if k not in ("prefill", "decode")}
    counts = {k: v for k, v in spec.items() if k in ("prefill", "decode")}
    found = conditions(status_of(instances, router, **counts, **extra))
    assert {k: found[k] for k in expected} == expected


def test_pool_summaries_and_conversions() -> None:
    instances = [
        make_instance("x-0", P),
        make_instance("x-1", D),
        make_instance("x-2", D, transition=convert(D)),
    ]
    status = status_of(instances, prefill=2, decode=1)
    assert status["prefill"] == {"desired": 2, "current": 2, "ready": 1, "updated": 1, "summary": "1/2"}
    assert status["decode"]["summary"] == "1/1"
    assert status["converting"] == 1
    assert status["conversions"][0]["pod"] == "x-2"
    assert (status["conversions"][0]["from"], status["conversions"][0]["to"]) == ("decode", "prefill")
    assert status["observedGeneration"] == 3


def test_transition_time_kept_while_status_unchanged() -> None:
    previous = [{"type": "Ready", "status": "True", "lastTransitionTime": "2020-01-01T00:00:00Z"}]
    status = status_of(READY_PAIR, previous=previous)
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert ready["lastTransitionTime"] == "2020-01-01T00:00:00Z"
    flipped = status_of(READY_PAIR, router_ready=0, previous=previous)
    ready = next(c for c in flipped["conditions"] if c["type"] == "Ready")
    assert ready["lastTransitionTime"] != "2020-01-01T00:00:00Z"


def test_invalid_spec_is_reported_as_degraded() -> None:
    blocked = blocked_conditions("InvalidSpec", "bad", 2, NOW, [])
    found = {c["type"]: (c["status"], c["reason"]) for c in blocked}
    assert found == {"Ready": ("False", "InvalidSpec"), "Degraded": ("True", "InvalidSpec")}


def test_rejected_flags_are_read_from_the_termination_message() -> None:
    message = "usage: vllm serve [-h]\nvllm serve: error: unrecognized arguments: --new-flag 3 --other\n"
    status = {"containerStatuses": [{"state": {"terminated": {"message": message}}}]}
    assert rejected_flags(status) == ("--new-flag", "--other")
    assert rejected_flags({"containerStatuses": [{"state": {"running": {}}}]}) == ()


@pytest.mark.parametrize(
    ("message", "flags"),
    [
        # vLLM 0.32's exit on a kv_role it does not take (measured with an unknown role), as a release
        # that refused kv_both would exit
        (
            "vllm serve: error: argument --kv-transfer-config: 1 validation error for KVTransferConfig\n"
            "kv_role\n  Input should be 'kv_producer', 'kv_both' or 'kv_consumer'\n",
            ("--kv-transfer-config",),
        ),
        ("launch_server: error: argument --tp/--tp-size: invalid int value: 'x'\n", ("--tp-size",)),
        ("error: unrecognized arguments: --a\nerror: argument --a: refused\n", ("--a",)),
        ("ValueError: argument must be positive\n", ()),
    ],
    ids=["kv-role-refused", "alias-value", "once-each", "not-argparse"],
)
def test_a_value_a_known_flag_refuses_names_the_flag(message: str, flags: tuple[str, ...]) -> None:
    status = {"containerStatuses": [{"lastState": {"terminated": {"message": message}}}]}
    assert rejected_flags(status) == flags


def test_a_refused_kv_role_says_which_switch_method_renders_which() -> None:
    instance = dataclasses.replace(READY_PAIR[0], rejected_flags=("--kv-transfer-config",))
    message = unsupported_flags_message("vllm:next", [instance])
    assert message is not None
    assert "does not accept --kv-transfer-config" in message
    assert "kv_both under spec.conversion.switchMethod Routing" in message
    assert "kv_producer/kv_consumer under Restart and InPlace" in message
    assert "set spec.engine.version" in message


def test_a_router_measured_to_ignore_labels_degrades_a_converting_deployment() -> None:
    status = status_of(READY_PAIR, router={"type": "sglang-router", "image": "s:1"})
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "RouterIgnoresLabels")
    assert "spec.router.type=sglang-router with spec.conversion.enabled" in degraded["message"]
    assert "sglang-router 0.3.2" in degraded["message"]
    without = status_of(
        READY_PAIR, router={"type": "sglang-router", "image": "s:1"}, conversion={"enabled": False}
    )
    assert conditions(without)["Degraded"] == ("False", "Healthy")
    assert conditions(status_of(READY_PAIR))["Degraded"] == ("False", "Healthy")  # vllm-router follows labels


AUTO = {"mode": "Auto", "prometheus": {"url": "http://prom:9090"}}
REFUSED = "spec.autoscaling.prometheus.url: 'http://prom:9090': host prom resolves to 169.254.169.254"


@pytest.mark.parametrize(
    ("autoscaling", "autoscaler", "expected"),
    [
        (AUTO, {"binding": "invalid_setup", "message": REFUSED, "observedGeneration": 3}, REFUSED),
        (AUTO, {"binding": "invalid_setup", "message": REFUSED, "observedGeneration": 2}, None),  # older spec
        (AUTO, {"binding": "min_max", "observedGeneration": 3}, None),
        ({"mode": "Off"}, {"binding": "invalid_setup", "message": REFUSED, "observedGeneration": 3}, None),
        (AUTO, None, None),
    ],
    ids=["this-generation", "older-generation", "deciding", "autoscaling-off", "never-decided"],
)
def test_the_controllers_invalid_setup_for_this_generation_degrades_the_deployment(
    autoscaling: dict[str, Any], autoscaler: dict[str, Any] | None, expected: str | None
) -> None:
    spec = make_spec(autoscaling=autoscaling)
    problem = autoscaling_problem(spec, {"autoscaler": autoscaler} if autoscaler else {}, 3)
    assert problem == expected
    inp = StatusInput(3, spec, READY_PAIR, HASHES, 1, (), NOW, autoscaling_problem=problem)
    degraded = next(c for c in compute_status(inp)["conditions"] if c["type"] == "Degraded")
    if expected:
        assert (degraded["status"], degraded["reason"], degraded["message"]) == (
            "True",
            "InvalidAutoscaling",
            REFUSED,
        )
    else:
        assert (degraded["status"], degraded["reason"]) == ("False", "Healthy")
