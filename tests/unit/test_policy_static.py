"""The static policy, the shared clamp, and the registry."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from tests.unit.policy_context import CONTEXT

from xpyd_controller.policy.context import PolicyConfigError
from xpyd_controller.policy.limits import LimitsError, clamp
from xpyd_controller.policy.registry import POLICIES, make_policy
from xpyd_controller.policy.types import Limits, Observation, PoolState

QUIET = Observation(
    time_s=0.0,
    window_s=60.0,
    prefill=PoolState(ready=6),
    decode=PoolState(ready=2),
    arrival_rate=None,
    mean_input_tokens=None,
    mean_output_tokens=None,
)


def test_static_keeps_its_split_whatever_it_observes() -> None:
    policy = make_policy("static", CONTEXT)
    decision = policy.decide(QUIET, Limits())
    assert (decision.prefill, decision.decode) == (6, 2)
    assert decision.binding == "static_split"
    assert decision.reasons == ("StaticSplit",)


def test_static_respects_limits() -> None:
    decision = make_policy("static", CONTEXT).decide(QUIET, Limits(prefill_max=4, gpu_budget=5))
    assert (decision.prefill, decision.decode) == (3, 2)  # 3/4 and 2/2 of the asks beat 4/4 and 1/2
    assert decision.binding == "gpu_budget"
    assert decision.reasons == ("StaticSplit", "PrefillLimitedByMax", "LimitedByGpuBudget")


@pytest.mark.parametrize(
    ("asked", "limits", "gpus", "expected", "reasons"),
    [
        ((3, 5), Limits(), (1, 1), (3, 5), ()),
        (
            (0, 0),
            Limits(prefill_min=1, decode_min=2),
            (1, 1),
            (1, 2),
            ("PrefillRaisedToMin", "DecodeRaisedToMin"),
        ),
        ((70, 3), Limits(), (1, 1), (64, 3), ("PrefillLimitedByMax",)),
        ((6, 6), Limits(gpu_budget=8), (1, 1), (4, 4), ("LimitedByGpuBudget",)),
        ((9, 3), Limits(gpu_budget=8), (1, 1), (6, 2), ("LimitedByGpuBudget",)),
        ((4, 4), Limits(gpu_budget=12), (2, 1), (4, 4), ()),
        ((4, 4), Limits(gpu_budget=10), (2, 1), (3, 4), ("LimitedByGpuBudget",)),
        ((10, 1), Limits(gpu_budget=4, decode_min=1), (1, 1), (3, 1), ("LimitedByGpuBudget",)),
    ],
)
def test_clamp_table(
    asked: tuple[int, int],
    limits: Limits,
    gpus: tuple[int, int],
    expected: tuple[int, int],
    reasons: tuple[str, ...],
) -> None:
    result = clamp(*asked, limits, *gpus)
    assert (result.prefill, result.decode) == expected
    assert result.reasons == reasons
    if limits.gpu_budget is not None:
        assert result.prefill * gpus[0] + result.decode * gpus[1] <= limits.gpu_budget


@pytest.mark.parametrize(
    ("limits", "message"),
    [
        (Limits(prefill_min=5, prefill_max=4), "limits.prefill_max = 4: must be >= prefill_min = 5"),
        (Limits(decode_min=-1), "limits.decode_min = -1: must be >= 0"),
        (
            Limits(prefill_min=2, decode_min=2, gpu_budget=3),
            r"limits.gpu_budget = 3: must cover the minimum pools \(4",
        ),
    ],
)
def test_contradictory_limits_are_rejected(limits: Limits, message: str) -> None:
    with pytest.raises(LimitsError, match=message):
        clamp(1, 1, limits, 1, 1)


def test_registry_names_and_unknown_policy() -> None:
    assert "static" in POLICIES
    with pytest.raises(PolicyConfigError, match=r"unknown policy; known: .*static"):
        make_policy("magic", CONTEXT)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("ttft_slo_s", 0.0, "ttft_slo_s = 0.0: must be a finite number > 0"),
        ("prefill_gpus_per_instance", 0, "prefill_gpus_per_instance = 0: must be an integer >= 1"),
        ("initial_decode", -1, "initial_decode = -1"),
        ("step_overhead_s", -1.0, "step_overhead_s = -1.0"),
    ],
)
def test_context_rejects_bad_values(field: str, value: float, message: str) -> None:
    changes: dict[str, Any] = {field: value}
    with pytest.raises(PolicyConfigError, match=message):
        dataclasses.replace(CONTEXT, **changes)
