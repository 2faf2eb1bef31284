"""Properties every registered policy must have, on random observation sequences."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.unit.policy_context import CONTEXT

from xpyd_controller.policy.registry import POLICIES, make_policy
from xpyd_controller.policy.types import Limits, Observation, PoolState

WIDE = dataclasses.replace(CONTEXT, prefill_gpus_per_instance=2, initial_prefill=9, initial_decode=9)
maybe = st.one_of(st.none(), st.just(0.0), st.floats(0.01, 1e4))
pool = st.builds(PoolState, ready=st.integers(0, 20), starting=st.integers(0, 3), draining=st.integers(0, 2))
observation_fields = st.fixed_dictionaries(
    {
        "prefill": pool,
        "decode": pool,
        "arrival_rate": st.one_of(st.none(), st.just(0.0), st.floats(0.01, 100.0)),
        "mean_input_tokens": st.one_of(st.none(), st.floats(10.0, 30_000.0)),
        "mean_output_tokens": st.one_of(st.none(), st.floats(1.0, 2_000.0)),
        "prefill_queue": maybe,
        "decode_running": maybe,
        "decode_waiting": maybe,
        "tpot_mean_s": st.one_of(st.none(), st.floats(1e-4, 10.0)),
        "decode_kv_usage": st.one_of(st.none(), st.floats(0.0, 1.0)),
        "prefix_hit_rate": st.one_of(st.none(), st.floats(0.0, 0.95)),
    }
)


@pytest.mark.parametrize("name", sorted(POLICIES))
@settings(max_examples=40, deadline=None)
@given(
    steps=st.lists(observation_fields, min_size=1, max_size=15),
    budget=st.one_of(st.none(), st.integers(3, 40)),
    maximum=st.integers(1, 30),
    minimum=st.integers(0, 1),
)
def test_decisions_stay_within_limits_and_budget(
    name: str, steps: list[dict[str, object]], budget: int | None, maximum: int, minimum: int
) -> None:
    policy = make_policy(name, WIDE)
    limits = Limits(
        prefill_min=minimum, prefill_max=maximum, decode_min=minimum, decode_max=maximum, gpu_budget=budget
    )
    for index, fields in enumerate(steps):
        decision = policy.decide(Observation(time_s=60.0 * index, window_s=60.0, **fields), limits)  # type: ignore[arg-type]
        for role, count in (("prefill", decision.prefill), ("decode", decision.decode)):
            if count is not None:
                assert minimum <= count <= maximum, (role, count, decision.reasons)
        if decision.prefill is not None and decision.decode is not None and budget is not None:
            assert decision.prefill * 2 + decision.decode <= budget, decision.reasons
        assert all(reason[:1].isupper() and " " not in reason for reason in decision.reasons)
        assert all(isinstance(value, float) for value in decision.details.values())
