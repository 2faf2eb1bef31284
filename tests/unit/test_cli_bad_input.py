"""Bad command lines: one table of argv → exit code and the message (flag, value, rule), never a traceback.

Every row runs `xpyd` in-process; the checks that guard a long run (`xpyd simulate`) must answer before
any traffic is drawn, so the slow scenarios below return at once.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from xpyd_controller.cli import main
from xpyd_controller.sim.policies import policy_names

PLAN = ["plan", "--model", "llama-3.1-8b", "--rate", "10", "--isl", "4096", "--osl", "256"]
CUSTOM = ["plan", "--rate", "1", "--isl", "1000", "--osl", "100", "--params", "8e9", "--layers", "32"]
SLOW = ["simulate", "--scenario", "drift-day", "--policy", "xpyd"]  # minutes of simulation if it ran
KNOBBED = ["simulate", "--scenario", "step-10-20", "--policy", "xpyd"]
UNWRITABLE = "/proc/xpyd-plot.png"  # /proc takes no new files, even as root

CASES = [
    # xpyd plan: MLA from explicit dimensions; messages name flags, not spec fields
    (
        [*CUSTOM, "--kv-latent-dim", "512"],
        2,
        "xpyd plan: error: --model: not given, so --rope-dim is required",
    ),
    (
        [*CUSTOM, "--kv-heads", "8"],
        2,
        "so --head-dim is required (MLA: --kv-latent-dim and --rope-dim instead",
    ),
    ([*CUSTOM, "--kv-latent-dim", "512", "--rope-dim", "-1"], 2, "--rope-dim -1: must be an integer > 0"),
    ([*PLAN, "--active-params", "9e9"], 2, "--active-params 9000000000.0: must be <= --params (8.03e+09)"),
    ([*PLAN, "--rate", "-1"], 2, "--rate -1.0: must be a finite number >= 0"),
    ([*PLAN, "--request-flow", "sideways"], 2, "--request-flow: invalid choice: 'sideways'"),
    ([*PLAN, "--sweep", "rate=5:1"], 2, "STOP >= START"),
    # xpyd simulate: checked before any work
    ([*SLOW, "--rate", "0"], 2, "xpyd simulate: --rate = 0.0: must be a finite number > 0 (requests/s)"),
    ([*SLOW, "--rate", "-3"], 2, "--rate = -3.0: must be a finite number > 0"),
    ([*SLOW, "--rate", "inf"], 2, "--rate = inf: must be a finite number > 0"),
    ([*SLOW, "--rate", "nan"], 2, "--rate = nan: must be a finite number > 0"),
    ([*SLOW, "--split", "0:9"], 2, "--split = '0:9': a PD fleet needs >= 1 prefill and >= 1 decode instance"),
    ([*SLOW, "--split", "9:0"], 2, "--split = '9:0': a PD fleet needs >= 1 prefill and >= 1 decode instance"),
    ([*SLOW, "--split", "6:2:1"], 2, "--split = '6:2:1': must be X:Y prefill:decode instances"),
    ([*SLOW, "--split", "6-2"], 2, "--split = '6-2': must be X:Y (disagg) or N (colocated)"),
    (
        ["simulate", "--mode", "colocated", "--split", "0"],
        2,
        "--split = '0': a co-located fleet needs N >= 1",
    ),
    ([*SLOW, "--plot", UNWRITABLE], 2, f"--plot = '{UNWRITABLE}': is not writable"),
    ([*SLOW, "--plot", "/no/such/folder/x.png"], 2, "folder '/no/such/folder' does not exist"),
    ([*SLOW, "--plot", "run.gif"], 2, "--plot = 'run.gif': must end in one of .png, .pdf"),
    (
        ["simulate", "--policy", "no-such-policy"],
        2,
        f"--policy = 'no-such-policy': unknown policy; known: {', '.join(policy_names())}",
    ),
    (["simulate", "--mode", "colocated", "--policy", "xpyd"], 2, "--policy = 'xpyd': autoscaling runs need"),
    (["simulate", "--scenario", "no-such-scenario"], 2, "scenario = 'no-such-scenario': neither a built-in"),
    (["simulate", "--rate", "fast"], 2, "argument --rate: invalid float value: 'fast'"),
    # xpyd simulate: policy knobs (checked when the policy is built, before the run)
    ([*KNOBBED, "--knob", "tolerance=1.5"], 2, "policy 'xpyd': tolerance = 1.5: must be in [0, 0.99]"),
    ([*KNOBBED, "--knob", "speed=2"], 2, "policy 'xpyd': speed = 2.0: unknown knob"),
    (
        [*KNOBBED, "--knob", "down_period_s=0.5"],
        2,
        "policy 'xpyd': down_period_s = 0.5: must be in [1, 86400]",
    ),
    ([*KNOBBED, "--knob", "tolerance"], 2, "--knob = 'tolerance': must be NAME=VALUE"),
    ([*KNOBBED, "--knob", "tolerance=fast"], 2, "--knob tolerance = 'fast': must be a number"),
    (
        [*KNOBBED, "--knob", "tolerance=0.2", "--knob", "tolerance=0.3"],
        2,
        "--knob tolerance = '0.3': given more than once",
    ),
    (
        [*KNOBBED[:3], "--policy", "oracle-window", "--knob", "tolerance=0.2"],
        2,
        "policy 'oracle-window': tolerance = 0.2: the hindsight oracles take no knobs",
    ),
    (
        ["simulate", "--rate", "4", "--knob", "tolerance=0.2"],
        2,
        "--knob = 'tolerance=0.2': needs a policy in the loop",
    ),
]


@pytest.mark.parametrize(("argv", "code", "message"), CASES, ids=[" ".join(c[0][-2:]) for c in CASES])
def test_bad_input_exits_with_its_code_and_message(
    capsys: pytest.CaptureFixture[str], argv: list[str], code: int, message: str
) -> None:
    started = time.perf_counter()
    try:
        result = main(argv)
    except SystemExit as exit_:  # argparse's own errors
        result = int(exit_.code or 0)
    captured = capsys.readouterr()
    assert result == code
    assert message in " ".join(captured.err.split())
    assert captured.out == ""
    assert time.perf_counter() - started < 5  # refused up front, not after simulating


def test_a_bad_plot_path_leaves_no_file_and_no_traceback(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "xpyd_controller.cli", *SLOW, "--plot", str(tmp_path / "none" / "x.png")],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert "--plot" in done.stderr
    assert list(tmp_path.iterdir()) == []
