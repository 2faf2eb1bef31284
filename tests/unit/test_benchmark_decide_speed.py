"""policy_decide_speed.py times each tree's policy in a process of its own: a replay there must decide
exactly as the policy does in this process, and must refuse a tree whose path did not win the import
(the editable install would otherwise quietly time this tree twice)."""

from __future__ import annotations

import pickle
import sys
from pathlib import Path

import pytest
from tests.unit.policy_context import CONTEXT

from xpyd_controller.policy.registry import make_policy
from xpyd_controller.policy.types import Limits, Observation, PoolState

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import policy_decide_speed

LIMITS = Limits(prefill_min=1, prefill_max=16, decode_min=1, decode_max=16, gpu_budget=16)


def calls() -> list[tuple[Observation, Limits]]:
    """A ramp and a fall, so the replay both grows and shrinks the pools."""
    rates = [5.0, 10.0, 20.0, 40.0, 40.0, 20.0, 5.0, 5.0]
    return [
        (
            Observation(
                time_s=15.0 * step,
                window_s=30.0,
                prefill=PoolState(ready=2),
                decode=PoolState(ready=2),
                arrival_rate=rate,
                mean_input_tokens=2000.0,
                mean_output_tokens=200.0,
            ),
            LIMITS,
        )
        for step, rate in enumerate(rates)
    ]


def recorded(tmp_path: Path) -> Path:
    path = tmp_path / "calls.pickle"
    with path.open("wb") as file:
        pickle.dump((CONTEXT, calls()), file)
    return path


def test_a_replay_in_its_own_process_decides_as_the_policy_does_here(tmp_path: Path) -> None:
    policy = make_policy("xpyd", CONTEXT)
    here = [policy.decide(observation, limits) for observation, limits in calls()]
    seconds, counts = policy_decide_speed.run_replay(policy_decide_speed.ROOT, recorded(tmp_path))
    assert counts == [(decision.prefill, decision.decode) for decision in here]
    assert seconds > 0


def test_a_tree_whose_sources_are_not_imported_is_refused(tmp_path: Path) -> None:
    empty = tmp_path / "tree"
    (empty / "controller" / "src").mkdir(parents=True)
    with pytest.raises(RuntimeError, match="imported xpyd_controller from"):
        policy_decide_speed.run_replay(empty, recorded(tmp_path))
