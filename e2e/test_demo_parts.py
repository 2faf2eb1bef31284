"""The demo's pure parts, without a cluster: the mix schedule, the stand-ins and traffic built from the
PDDeployment, the Event tally and the progress line."""

from __future__ import annotations

import numpy as np
import pytest

from e2e.stack import (
    LONG_OUTPUTS,
    LONG_PROMPTS,
    MIX_RAMP_S,
    DemoSettings,
    Reversals,
    ScaleCounts,
    demo_manifest,
    demo_traffic,
    mix_weight,
    progress_line,
    targets_line,
)
from e2e.traffic import TrafficStats
from xpyd_api.models import PDDeploymentSpec
from xpyd_controller.control.setup import gpu_spec, policy_context
from xpyd_controller.standin.__main__ import SPEC_ENV, hardware_of


@pytest.mark.parametrize(
    ("time_s", "share"),
    [
        (0.0, 0.0),
        (59.0, 0.0),
        (60.0, 0.0),  # the ramp starts at the swing
        (60.0 + MIX_RAMP_S / 2, 0.5),
        (60.0 + MIX_RAMP_S, 1.0),
        (119.0, 1.0),
        (120.0 + MIX_RAMP_S, 0.0),
        (180.0 + MIX_RAMP_S, 1.0),
    ],
)
def test_the_mix_swings_between_long_outputs_and_long_prompts(time_s: float, share: float) -> None:
    assert float(mix_weight(60.0, 240.0)(np.asarray(time_s))) == pytest.approx(share)


@pytest.mark.parametrize(
    ("time_s", "share"), [(59.0, 0.0), (119.0, 1.0), (120.0 + MIX_RAMP_S, 0.0), (239.0, 0.0)]
)
def test_a_limited_mix_holds_its_last_phase(time_s: float, share: float) -> None:
    """Two swings: long outputs, long prompts, then long outputs to the end."""
    assert float(mix_weight(60.0, 240.0, swings=2)(np.asarray(time_s))) == pytest.approx(share)


def test_the_stand_ins_use_the_numbers_the_controller_reads_from_the_spec() -> None:
    settings = DemoSettings()
    manifest = demo_manifest("http://prometheus", settings)
    spec = PDDeploymentSpec.model_validate(manifest["spec"])
    (simulate,) = [e["value"] for e in manifest["spec"]["engine"]["env"] if e["name"] == SPEC_ENV]
    hardware = hardware_of(simulate, spec.model.name, 1)
    assert hardware.gpu == gpu_spec(spec.hardware)
    assert hardware.model == policy_context(spec).model
    _, slo = demo_traffic(manifest, settings)
    assert (slo.ttft_s, slo.tpot_s) == (spec.slo.ttft_seconds, spec.slo.tpot_seconds)
    assert spec.autoscaling.prometheus is not None and spec.autoscaling.prometheus.url == "http://prometheus"
    assert LONG_PROMPTS.prompt_min > LONG_OUTPUTS.prompt_max
    assert LONG_OUTPUTS.output_min > LONG_PROMPTS.output_max


@pytest.mark.parametrize(
    ("messages", "ups", "downs"),
    [
        ([], {"prefill": 0, "decode": 0}, {"prefill": 0, "decode": 0}),
        (
            ["setting prefill 2→1, decode 2→3; binding x; reasons: a"],
            {"prefill": 0, "decode": 1},
            {"prefill": 1, "decode": 0},
        ),
        (
            ["setting prefill 1→3, decode 3→3; binding x", "setting prefill 3→2, decode 3→4; binding y"],
            {"prefill": 1, "decode": 1},
            {"prefill": 1, "decode": 0},
        ),
    ],
)
def test_scale_decisions_are_tallied_per_role_and_direction(
    messages: list[str], ups: dict[str, int], downs: dict[str, int]
) -> None:
    counts = ScaleCounts.of(messages)
    assert (counts.decisions, counts.ups, counts.downs) == (len(messages), ups, downs)


def _stats(completed: int, within: int, in_flight: int) -> TrafficStats:
    return TrafficStats(0.0, completed + in_flight, completed, within, 0)


def test_the_progress_line_shows_pools_binding_conversions_and_slo() -> None:
    pdd = {
        "spec": {"prefill": {"replicas": 3}, "decode": {"replicas": 2}},
        "status": {
            "prefill": {"ready": 2},
            "decode": {"ready": 2},
            "converting": 1,
            "autoscaler": {
                "binding": "gpu_budget",
                "reasons": ["PrefillBelowModelFloor", "LimitedByGpuBudget"],
            },
        },
    }
    line = progress_line(
        elapsed_s=65.0,
        rate=4.0,
        long_prompts=1.0,
        pdd=pdd,
        traffic=_stats(30, 27, 12),
        previous=_stats(10, 10, 5),
        conversions=2,
    )
    for part in (
        "[   65s] 4 req/s 100% long-prompt",
        "prefill 2/3 decode 2/2 ready/desired",
        "converting 1, conversions 2",
        "binding gpu_budget (PrefillBelowModelFloor,LimitedByGpuBudget)",
        "traffic: 20 done  85% in SLO, 12 in flight, 0 failed",
    ):
        assert part in line
    assert "binding - (-)" in progress_line(
        elapsed_s=1.0,
        rate=4.0,
        long_prompts=0.0,
        pdd={},
        traffic=_stats(0, 0, 0),
        previous=_stats(0, 0, 0),
        conversions=0,
    )


@pytest.mark.parametrize("field", ["minutes", "rate", "swing_s", "rate_window_s", "interval_s"])
def test_settings_must_be_positive(field: str) -> None:
    with pytest.raises(ValueError, match=f"{field} = 0: must be > 0"):
        DemoSettings(**{field: 0})


def test_reversals_count_direction_changes_within_a_phase_only() -> None:
    tally = Reversals(swing_s=90.0)
    for elapsed, prefill, decode in [
        (0, 2, 2),
        (10, 3, 2),
        (20, 2, 2),
        (30, 3, 2),  # prefill up, down, up in phase 0: two reversals
        (40, 3, 3),
        (95, 3, 2),  # decode up in phase 0, down in phase 1: the swing, not a reversal
    ]:
        tally.add(elapsed, prefill, decode)
    assert tally.per_phase == {("prefill", 0): 2} and tally.worst == 2
    assert Reversals(90.0).worst == 0


def test_targets_line_says_which_targets_the_run_met() -> None:
    line = targets_line(0.96, 0.85, 1, 4)
    assert "requests within SLO 96% (≥ 95 %: met)" in line
    assert "intervals within SLO 85% (≥ 90 %: NOT met)" in line
    assert "at most 1 (≤ 1: met)" in line and "conversions 4 (visible: met)" in line
    assert "requests within SLO - (≥ 95 %: NOT met)" in targets_line(None, None, 0, 0)
