"""`xpyd plan` against DESIGN.md's fixed CLI contract: flags, JSON keys, words, exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from xpyd_controller.cli import main
from xpyd_controller.model.presets import DATASHEET_GPUS, GPU_CALIBRATION, LINK_PRESETS, MODEL_PRESETS
from xpyd_controller.model.sizing import (
    DEFAULT_TTFT_QUANTILE,
    JSON_KEYS,
    PoolConfig,
    Slo,
    Workload,
    size_pools,
)

PRESETS = ["plan", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--link", "ib-400g"]
# The hand-checked numbers below are at the seeds' efficiencies, not the calibrated preset's.
BASE = [*PRESETS, "--mfu", "0.4", "--mbu", "1"]
TRAFFIC = ["--rate", "10", "--isl", "4096", "--osl", "256"]


def run_plan(capsys: pytest.CaptureFixture[str], *flags: str) -> tuple[int, str, str]:
    code = main([*BASE, *flags])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def plan_json(capsys: pytest.CaptureFixture[str], *flags: str) -> dict[str, object]:
    code, out, _ = run_plan(capsys, *TRAFFIC, "--json", *flags)
    assert code in (0, 1)
    result: dict[str, object] = json.loads(out)
    return result


@pytest.mark.parametrize(
    ("flags", "sizing", "quantile"),
    [
        ((), "slo", DEFAULT_TTFT_QUANTILE),
        (("--ttft-quantile", "0.99"), "slo", 0.99),
        (("--sizing", "throughput"), "throughput", None),
    ],
)
def test_json_has_the_design_keys_and_matches_the_model(
    capsys: pytest.CaptureFixture[str], flags: tuple[str, ...], sizing: str, quantile: float | None
) -> None:
    """By default prefill meets the p90 TTFT with queueing; `--sizing throughput` is the seeds' formula."""
    row = plan_json(capsys, "--ttft-slo", "1.5", "--tpot-slo", "0.04", *flags)
    assert set(JSON_KEYS) <= set(row)
    assert (row["sizing"], row["ttft_quantile"]) == (sizing, quantile)
    assert row["prefill_instances"] >= row["prefill_throughput_instances"] == 2  # type: ignore[operator]
    expected = size_pools(
        MODEL_PRESETS["llama-3.1-8b"],
        DATASHEET_GPUS["h100-sxm"],
        LINK_PRESETS["ib-400g"],
        Workload(rate=10, isl=4096, osl=256),
        Slo(ttft=1.5, tpot=0.04, ttft_quantile=quantile),
        pools=PoolConfig(),
    ).as_dict()
    assert {key: row[key] for key in expected} == expected
    assert row["decode_batch_bound"] in ("kv_capacity", "tpot_bandwidth", "tpot_compute")
    assert row["binding"] and isinstance(row["binding"], list)


def test_explicit_flags_override_presets(capsys: pytest.CaptureFixture[str]) -> None:
    row = plan_json(capsys, "--layers", "40", "--kv-bytes", "1")
    assert row["kv_bytes_per_token"] == 2 * 40 * 8 * 128 * 1


def test_custom_mla_model_from_flags(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        [
            "plan",
            *TRAFFIC,
            "--json",
            *("--params", "16e9", "--layers", "27"),  # no --kv-heads/--head-dim: MLA needs neither
            *("--kv-latent-dim", "512", "--rope-dim", "64"),
        ]
    )
    row = json.loads(capsys.readouterr().out)
    assert code in (0, 1)
    assert row["kv_bytes_per_token"] == 27 * (512 + 64) * 2
    assert row["attention_factor"] == 1.0  # no hidden size given


def test_request_flow_flag_sizes_decode_sessions(capsys: pytest.CaptureFixture[str]) -> None:
    """Long prompts, short outputs: prefill-first counts only the decode's residency."""
    flags = ("--rate", "12", "--isl", "6000", "--osl", "150", "--json")
    _, out, _ = run_plan(capsys, *flags)
    decode_first = json.loads(out)
    _, out, _ = run_plan(capsys, *flags, "--request-flow", "prefill-first")
    prefill_first = json.loads(out)
    assert decode_first["request_flow"] == "decode_first"
    assert prefill_first["request_flow"] == "prefill_first"
    step, pull = prefill_first["decode_step_seconds"], prefill_first["transfer_seconds"]
    assert prefill_first["concurrency"] == pytest.approx(12 * (pull + 150 * step))
    assert decode_first["concurrency"] > prefill_first["concurrency"] + 12 * 2.0 * 0.99
    _, out, _ = run_plan(capsys, *flags[:-1], "--request-flow", "prefill-first")
    assert "sessions: λ·L_out·TPOT, prefill-first" in out


def test_human_table_names_the_binding_constraint(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_plan(capsys, *TRAFFIC)
    assert code == 0
    assert "sizing    each pool the smallest that meets its SLO: TTFT p90 with queueing" in out
    assert "3 × 1 GPU   TTFT p90 with queueing; throughput floor 2" in out
    assert "prefill: 3 instances to meet the TTFT quantile with queueing (throughput alone needs 2" in out
    assert "bound by KV capacity" in out
    assert "D/P (article formula) 0.28" in out
    code, out, _ = run_plan(capsys, *TRAFFIC, "--sizing", "throughput")
    assert code == 0
    assert "2 × 1 GPU   throughput (the seeds' formula)" in out
    assert "prefill: 2 instances sized by throughput (1.89 busy instances" in out


def test_the_readme_example_meets_its_slos_as_printed(capsys: pytest.CaptureFixture[str]) -> None:
    """70B on 4-GPU instances at 10 req/s of 8000/400: the throughput floor (7) would queue to a 2.62 s mean
    TTFT; the default plan is 8 prefill instances with a p90 TTFT of 1.24 s."""
    argv = ["plan", "--model", "llama-3.1-70b", "--gpu", "h100-sxm", "--link", "ib-400g"]
    argv += ["--prefill-gpus", "4", "--decode-gpus", "4", "--rate", "10", "--isl", "8000", "--osl", "400"]
    argv += ["--ttft-slo", "2", "--tpot-slo", "0.05", "--remote-overhead", "0.02"]
    assert main(argv) == 0
    assert "8 × 4 GPU   TTFT p90 with queueing; throughput floor 7" in capsys.readouterr().out
    assert main([*argv, "--json"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert (row["sizing"], row["ttft_quantile"], row["feasible"]) == ("slo", 0.9, True)
    assert (row["prefill_instances"], row["prefill_throughput_instances"]) == (8, 7)
    assert row["predicted_ttft_seconds"] == pytest.approx(1.24, abs=0.005)


def test_throughput_sizing_that_misses_the_ttft_is_a_plan_not_an_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """At 98 % utilisation the seeds' prefill pool queues past the SLO; a larger pool meets it: exit 0."""
    flags: tuple[str, ...] = ("--model", "llama-3.1-70b", "--prefill-gpus", "4", "--decode-gpus", "4")
    flags += ("--rate", "10", "--isl", "8000", "--osl", "400", "--sizing", "throughput")
    assert main(["plan", *flags]) == 0
    assert (
        "SLO MISSED at this size (the default --sizing slo sizes prefill to meet it):"
        in capsys.readouterr().out
    )
    assert main(["plan", *flags, "--json"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert (row["feasible"], row["slo_attainable"]) == (False, True)


def test_infeasible_transfer_in_words_and_exit_one(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_plan(
        capsys,
        *("--model", "llama-3.1-70b", "--prefill-gpus", "8", "--decode-gpus", "8"),
        *("--rate", "1", "--isl", "131072", "--osl", "256", "--ttft-slo", "60", "--transfer-budget", "0.2"),
        "--no-layerwise-transfer",
    )
    assert code == 1
    assert (
        "KV transfer of 42.9 GB takes 859 ms on ib-400g (serialized: layer-wise pipelining off): 659 ms over "
        "the 200 ms budget; needs NVLink or KV compression" in out
    )
    assert "INFEASIBLE (no pool size meets it):" in out


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (
            ["--tpot-slo", "0.004"],
            ["the TPOT SLO 4 ms leaves no batch: one step already takes 4.79 ms", "794 µs over it"],
        ),
        (["--ttft-slo", "0.01"], ["TTFT floor 213 ms", "203 ms over the 10 ms SLO: no pool size meets it"]),
    ],
)
def test_slo_below_its_floor_exits_one_naming_the_gap(
    capsys: pytest.CaptureFixture[str], flags: list[str], words: list[str]
) -> None:
    code, out, _ = run_plan(capsys, *TRAFFIC, *flags)
    assert code == 1
    assert "INFEASIBLE (no pool size meets it):" in out
    for word in words:
        assert word in out
    code, out, _ = run_plan(capsys, *TRAFFIC, *flags, "--json")
    row = json.loads(out)
    assert code == 1
    assert row["slo_attainable"] is False
    assert any(words[-1] in sentence for sentence in row["infeasible"])


def test_ttft_quantile_is_for_slo_sizing_only(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_plan(capsys, *TRAFFIC, "--sizing", "throughput", "--ttft-quantile", "0.9")
    assert (code, out) == (2, "")
    assert "--ttft-quantile 0.9: sizes for a TTFT quantile, which --sizing throughput does not" in err


def test_transfer_verdict_follows_the_exposed_time_under_layerwise_overlap(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The verdict and the overlap note agree: 10.7 ms exposed fits a 200 ms budget."""
    code, out, _ = run_plan(
        capsys,
        *("--model", "llama-3.1-70b", "--prefill-gpus", "8", "--decode-gpus", "8"),
        *("--rate", "1", "--isl", "131072", "--osl", "256", "--ttft-slo", "60", "--transfer-budget", "0.2"),
    )
    assert code == 0
    assert "KV transfer (serialized)           859 ms" in out
    assert (
        "KV transfer exposed               10.7 ms   budget 200 ms: feasible, layer-wise overlap holds" in out
    )
    assert "INFEASIBLE" not in out


def test_weights_that_do_not_fit_say_how_many_gpus(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_plan(capsys, "--model", "llama-3.1-70b", *TRAFFIC)
    assert code == 1
    assert "needs 2 or more GPUs per decode instance (--decode-gpus)" in out
    assert "nan" not in out.lower()


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (["--rate", "-1"], ["--rate", "-1.0", ">= 0"]),
        (["--rate", "nan"], ["--rate", "nan", "finite"]),
        (["--hit-rate", "1"], ["--hit-rate", "1.0", "[0, 1)"]),
        (["--mfu", "0"], ["--mfu", "0.0", "(0, 1]"]),
        (["--link-bandwidth", "0"], ["--link-bandwidth", "0.0", "> 0"]),
        (["--prefill-gpus", "1.5"], ["--prefill-gpus", "1.5", "whole number"]),
        (["--ttft-quantile", "1.2"], ["--ttft-quantile", "1.2", "[0.5, 1)"]),
        (["--sweep", "rate=5:1"], ["--sweep", "rate=5:1", "STOP >= START"]),
        (["--sweep", "speed=1:2"], ["--sweep", "speed", "rate"]),
    ],
)
def test_invalid_input_exits_two_naming_flag_value_rule(
    capsys: pytest.CaptureFixture[str], flags: list[str], words: list[str]
) -> None:
    code, out, err = run_plan(capsys, *TRAFFIC, *flags)
    assert code == 2
    assert out == ""
    for word in words:
        assert word in err


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            ["--params", "8e9"],
            "--model: not given, so --layers, --kv-heads, --head-dim are required (MLA: --kv-latent-dim "
            "and --rope-dim instead of --kv-heads, --head-dim)",
        ),
        (["--params", "8e9", "--layers", "32", "--kv-latent-dim", "512"], "so --rope-dim is required"),
        (
            ["--params", "8e9", "--layers", "32", "--kv-latent-dim", "512", "--rope-dim", "0"],
            "--rope-dim 0: must be an integer > 0",
        ),
        (
            [
                "--params",
                "8e9",
                "--layers",
                "32",
                "--kv-heads",
                "8",
                "--head-dim",
                "128",
                "--active-params",
                "9e9",
            ],
            "--active-params 9000000000.0: must be <= --params (8e+09)",
        ),
    ],
)
def test_custom_model_needs_its_shape(
    capsys: pytest.CaptureFixture[str], flags: list[str], message: str
) -> None:
    """Messages name the flags the user types, never the spec's field names."""
    assert main(["plan", *TRAFFIC, *flags]) == 2
    err = capsys.readouterr().err
    assert message in err
    assert "_" not in err.replace("xpyd plan", "")


@pytest.mark.parametrize("spec", ["rate=1:4", "rate=1,2,3,4", "rate=1:4:1"])
def test_sweep_json_points(capsys: pytest.CaptureFixture[str], spec: str) -> None:
    code, out, _ = run_plan(capsys, *TRAFFIC, "--json", "--sweep", spec)
    assert code == 0
    result = json.loads(out)
    assert result["sweep"] == "rate"
    assert result["values"] == [1.0, 2.0, 3.0, 4.0]
    decode = [point["decode_instances"] for point in result["plans"]]
    assert decode == sorted(decode)
    assert all(set(JSON_KEYS) <= set(point) for point in result["plans"])
    assert {(point["sizing"], point["ttft_quantile"]) for point in result["plans"]} == {("slo", 0.9)}


def test_sweep_table_has_a_row_per_value(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_plan(capsys, *TRAFFIC, "--sweep", "tpot-slo=0.01,0.02,0.05")
    assert code == 0
    rows = [line for line in out.splitlines() if line.strip().startswith(("0.01", "0.02", "0.05"))]
    assert len(rows) == 3


def test_sweep_marks_invalid_points_instead_of_aborting(capsys: pytest.CaptureFixture[str]) -> None:
    """A negative rate is a row marked invalid, a TPOT below its floor a row that says no pool size meets
    it; the other points are sized."""
    code, out, _ = run_plan(capsys, *TRAFFIC, "--sweep", "tpot-slo=0.004,0.02,0.05")
    assert code == 0
    rows = {
        line.split()[0]: line
        for line in out.splitlines()
        if line.strip().startswith(("0.004", "0.02", "0.05"))
    }
    assert "no: decode: the TPOT SLO 4 ms leaves no batch: one step already takes 4.79 ms" in rows["0.004"]
    assert rows["0.05"].split()[1:3] == ["3", "2"]  # p90 sizing beside the throughput floor
    assert rows["0.05"].rstrip().endswith("yes")
    assert "TTFT p90" in out
    code, out, _ = run_plan(capsys, *TRAFFIC, "--sizing", "throughput", "--sweep", "tpot-slo=0.02")
    assert "TTFT mean" in out
    code, out, _ = run_plan(capsys, *TRAFFIC, "--json", "--sweep", "rate=-1,2")
    assert code == 0
    first, second = json.loads(out)["plans"]
    assert first == {"invalid_input": "--rate -1.0: must be a finite number >= 0", "feasible": False}
    assert second["invalid_input"] is None and second["prefill_instances"] >= 1
    code, out, _ = run_plan(capsys, *TRAFFIC, "--ttft-quantile", "0.99", "--sweep", "rate=1,2")
    assert "TTFT p99" in out


def test_sweep_with_no_valid_point_exits_two(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_plan(capsys, *TRAFFIC, "--sweep", "rate=-2,-1")
    assert code == 2
    assert "--rate -2.0: must be a finite number >= 0" in err


def test_sweep_plot_is_drawn_against_the_swept_quantity(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import matplotlib.axes

    labels: list[str] = []
    original = matplotlib.axes.Axes.set_xlabel
    monkeypatch.setattr(
        matplotlib.axes.Axes,
        "set_xlabel",
        lambda self, label, **kw: labels.append(label) or original(self, label, **kw),
    )
    target = tmp_path / "sweep.png"
    code, _, _ = run_plan(capsys, *TRAFFIC, "--sweep", "tpot-slo=0.004,0.02,0.05", "--plot", str(target))
    assert code == 0
    assert target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert labels[0] == "tpot-slo (swept)"


def test_plot_writes_a_png(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    target = tmp_path / "plan.png"
    code, _, _ = run_plan(capsys, *TRAFFIC, "--plot", str(target))
    assert code == 0
    assert target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_console_entry_point_end_to_end() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "xpyd_controller.cli", *BASE, *TRAFFIC, "--hit-rate", "-0.5"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2
    assert "--hit-rate -0.5" in done.stderr


def _assumed(capsys: pytest.CaptureFixture[str], *flags: str) -> tuple[dict[str, object], str]:
    """The JSON object and the table's `assumed` line for a plan of 40 req/s of 2000/500 tokens."""
    traffic = ("--rate", "40", "--isl", "2000", "--osl", "500")
    assert main([*PRESETS[:3], *traffic, *flags, "--json"]) in (0, 1)
    row = json.loads(capsys.readouterr().out)
    assert main([*PRESETS[:3], *traffic, *flags]) in (0, 1)
    return row, next(x for x in capsys.readouterr().out.splitlines() if x.startswith("assumed"))


def test_plan_says_where_its_efficiencies_come_from(capsys: pytest.CaptureFixture[str]) -> None:
    default, line = _assumed(capsys, "--gpu", "h100-sxm")
    assert line == (
        "assumed   MFU 0.48 (h100-sxm calibration), MBU 0.54 (h100-sxm calibration), "
        "step overhead 0 s (h100-sxm calibration)"
    )
    assert default["calibration_source"] == "splitwise-sim Llama-2-70B TP2"
    seeds, line = _assumed(capsys, "--gpu", "h100-sxm", "--mfu", "0.4", "--mbu", "1")
    assert "MFU 0.4 (--mfu), MBU 1 (--mbu), step overhead 0 s (h100-sxm calibration)" in line
    assert (seeds["mfu_source"], seeds["mbu_source"], seeds["step_overhead_source"]) == (
        "flag",
        "flag",
        "calibration",
    )
    # The calibrated preset's slower decode steps cost decode instances at the same load.
    assert default["decode_instances"] > seeds["decode_instances"]  # type: ignore[operator]
    h200, line = _assumed(capsys, "--gpu", "h200")
    assert "MFU 0.49 (h200 calibration), MBU 0.78 (h200 calibration), step overhead 2.2 ms" in line
    assert h200["step_overhead_seconds"] == GPU_CALIBRATION["h200"].step_overhead_s
    assert h200["tpot_floor_seconds"] == pytest.approx(  # the fitted 2.2 ms step overhead is the default
        GPU_CALIBRATION["h200"].step_overhead_s + 16.06e9 / (4.8e12 * 0.78), rel=0.01
    )
    unmeasured, line = _assumed(capsys, "--gpu", "b200")
    assert "MFU 0.4 (default: no measured profile for b200)" in line
    assert unmeasured["calibration_source"] is None


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        # every hardware number given: nothing of the preset's calibration is left
        (
            ("--peak-flops", "5e14", "--hbm-bandwidth", "2e12", "--hbm-bytes", "9e10"),
            {"mfu": (0.4, "default"), "mbu": (1.0, "default"), "step_overhead_seconds": (0.0, "default")},
        ),
        # the memory side given: the compute fit stays, MBU and the step overhead go back to defaults
        (
            (
                "--hbm-bandwidth",
                "2e12",
            ),
            {
                "mfu": (0.49, "calibration"),
                "mbu": (1.0, "default"),
                "step_overhead_seconds": (0.0, "default"),
            },
        ),
        # a flag always wins, even against a calibration that applies
        (
            ("--mbu", "0.7", "--step-overhead", "0.001"),
            {"mfu": (0.49, "calibration"), "mbu": (0.7, "flag"), "step_overhead_seconds": (0.001, "flag")},
        ),
    ],
)
def test_flags_win_over_the_preset_calibration(
    capsys: pytest.CaptureFixture[str], flags: tuple[str, ...], expected: dict[str, tuple[float, str]]
) -> None:
    row, _ = _assumed(capsys, "--gpu", "h200", *flags)
    for key, (value, source) in expected.items():
        source_key = key.removesuffix("_seconds") + "_source"
        assert (row[key], row[source_key]) == (value, source), key
