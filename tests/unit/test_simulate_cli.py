"""`xpyd simulate` per DESIGN.md's contract: flags, JSON keys, scenario files and clear errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from xpyd_controller.cli import main
from xpyd_controller.sim.config import SimConfigError
from xpyd_controller.sim.scenarios import builtin_scenarios, load_scenario, scenario_from_mapping

CONTRACT_KEYS = {
    "goodput",
    "ttft_p50",
    "ttft_p99",
    "tbt_p99",
    "tokens_per_gpu_second",
    "requests",
    "gpu_hours",
}

SMALL_STEP = """
name: small-step
# The datasheet H100 at the seeds' efficiencies (the calibrated preset's faster prefill leaves the
# TTFT-quantile knob nothing to change here).
hardware: {model: llama-3.1-8b, link: ib-400g, step_overhead_s: 0.005,
           gpu: {peak_flops: 9.89e+14, hbm_bandwidth: 3.35e+12, hbm_bytes: 8.0e+10, mfu: 0.4, mbu: 1.0}}
fleet: {mode: disagg, prefill: 1, decode: 1}
realism: {cold_start_s: 30, conversion_s: 5, kv_capacity: true}
slo: {ttft_s: 1.0, tpot_s: 0.05, max_token_gap_s: null}
control: {scrape_interval_s: 15, role_conversion: true}
traffic: {kind: step, rate: 2, after: 20, at_s: 300, duration_s: 600,
          lengths: {kind: uniform, prompt: [2000, 6000], output: [20, 200]}}
"""


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    assert main(["simulate", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)  # type: ignore[no-any-return]


def test_seed_scenario_json_reproduces_the_article_row(capsys: pytest.CaptureFixture[str]) -> None:
    out = run_json(capsys, "--scenario", "seed-8gpu", "--mode", "disagg", "--split", "6:2", "--rate", "28")
    assert out.keys() >= CONTRACT_KEYS
    assert out["requests"] == 6000
    assert out["goodput"] == pytest.approx(0.972, abs=0.015)
    assert out["ttft_p50"] == pytest.approx(0.2516, rel=0.05)
    assert out["tbt_p99"] == pytest.approx(0.0098, rel=0.05)


def test_a_prefill_decode_split_implies_the_disaggregated_mode(capsys: pytest.CaptureFixture[str]) -> None:
    implied = run_json(capsys, "--scenario", "seed-8gpu", "--split", "6:2", "--rate", "28")
    explicit = run_json(
        capsys, "--scenario", "seed-8gpu", "--mode", "disagg", "--split", "6:2", "--rate", "28"
    )
    assert (implied["mode"], implied["split"]) == ("disagg", "6:2")
    assert implied["goodput"] == explicit["goodput"]
    colocated = run_json(
        capsys, "--scenario", "seed-8gpu", "--mode", "colocated", "--split", "0:8", "--rate", "8"
    )
    assert (colocated["mode"], colocated["split"]) == ("colocated", "0:8")


def test_colocated_split_takes_a_gpu_count(capsys: pytest.CaptureFixture[str]) -> None:
    out = run_json(capsys, "--split", "8G", "--rate", "8")
    assert out["mode"] == "colocated"
    assert out["split"] == "0:8"
    assert out["goodput"] == pytest.approx(0.997, abs=0.015)


def test_knobs_reach_the_policy(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "small.yaml"
    path.write_text(SMALL_STEP, encoding="utf-8")
    default = run_json(capsys, "--scenario", str(path), "--policy", "xpyd")
    # No tolerance band: a pool above its need shrinks to exactly the need, fewer GPU-hours.
    knobbed = run_json(capsys, "--scenario", str(path), "--policy", "xpyd", "--knob", "tolerance=0")
    assert (default["knobs"], knobbed["knobs"]) == ({}, {"tolerance": 0.0})
    assert knobbed["gpu_hours"] < default["gpu_hours"]


def test_table_and_plot(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    png = tmp_path / "run.png"
    assert main(["simulate", "--rate", "4", "--plot", str(png)]) == 0
    assert "goodput" in capsys.readouterr().out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_policy_in_the_loop_from_a_yaml_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "small.yaml"
    path.write_text(SMALL_STEP, encoding="utf-8")
    out = run_json(capsys, "--scenario", str(path), "--policy", "oracle-window")
    assert out["scenario"] == "small-step"
    assert out["policy"] == "oracle-window"
    assert "recovery_seconds" in out
    assert out["scale_ups"] > 0  # the step needs more prefill than 1:1


@pytest.mark.parametrize(
    ("patch", "field"),
    [
        ({"fleet": {"mode": "split", "prefill": 1, "decode": 1}}, "mode"),
        ({"fleet": {"mode": "disagg", "prefill": 1, "decode": 1, "gpus": 2}}, "fleet.gpus"),
        ({"hardware": {"model": "gpt-9", "gpu": "h100-sxm", "link": "ib-400g"}}, "hardware.model"),
        ({"realism": {"kv_memory_fraction": 1.5}}, "kv_memory_fraction"),
        ({"traffic": {"kind": "step", "rate": 2}}, "traffic.after"),
        ({"traffic": {"kind": "lottery"}}, "traffic.kind"),
        ({"slo": {"ttft_s": -1}}, "ttft_s"),
        ({"colour": "blue"}, "colour"),
    ],
)
def test_scenario_validation_names_the_field(patch: dict[str, object], field: str) -> None:
    data: dict[str, object] = {
        "hardware": {"model": "llama-3.1-8b", "gpu": "h100-sxm", "link": "ib-400g"},
        "fleet": {"mode": "disagg", "prefill": 1, "decode": 1},
        "traffic": {"kind": "poisson", "rate": 1, "count": 10},
    }
    data.update(patch)
    with pytest.raises(SimConfigError) as caught:
        scenario_from_mapping(data)
    assert caught.value.field == field


def test_builtins_include_the_seed_and_a_drift_day() -> None:
    names = builtin_scenarios()
    assert {"seed-8gpu", "drift-day", "step-10-20", "diurnal-day"} <= names.keys()
    drift = load_scenario("drift-day").traffic.build(seed=1, rate=2.0)
    first, last = drift.arrival_s < 3 * 3600, (drift.arrival_s > 10 * 3600) & (drift.arrival_s < 12 * 3600)

    # The mix drifts: RAG-like (long prompts, short answers) around 11:00, chat-like at night.
    def ratio(mask: np.ndarray) -> float:
        return float(drift.prompt_tokens[mask].mean() / drift.output_tokens[mask].mean())

    assert ratio(last) > 3 * ratio(first)


@pytest.mark.parametrize("kind", ["poisson", "gamma", "diurnal"])
def test_traffic_hit_fraction_marks_cached_prompt_tokens(kind: str) -> None:
    scenario = scenario_from_mapping(
        {
            "hardware": {"model": "llama-3.1-8b", "gpu": "h100-sxm", "link": "ib-400g"},
            "fleet": {"mode": "disagg", "prefill": 1, "decode": 1},
            "traffic": {"kind": kind, "rate": 2, "duration_s": 600, "cv": 2, "hit_fraction": 0.5},
        }
    )
    trace = scenario.traffic.build(seed=3)
    assert len(trace) > 100
    np.testing.assert_array_equal(trace.prefix_hit_tokens, trace.prompt_tokens // 2)


def test_help_lists_every_policy() -> None:
    from xpyd_controller.cli.simulate import POLICY_NAMES
    from xpyd_controller.sim.policies import policy_names

    assert policy_names() == POLICY_NAMES


def test_plot_marks_where_each_pool_grew_and_shrank() -> None:
    from xpyd_controller.cli.simulate import _step_markers

    assert _step_markers([0.0, 1.0, 2.0, 3.0], [2, 3, 3, 1]) == ([1.0], [3], [3.0], [1])
