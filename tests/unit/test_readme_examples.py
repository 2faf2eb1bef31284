"""Every `xpyd plan` and `xpyd simulate` command in the README's code blocks runs green exactly as printed.

Each command is taken from the README as it stands (continuation lines joined, the trailing comment
cut), run as a process from a scratch directory where `.venv/bin/xpyd` is this checkout's, and must
exit 0; a plan must also predict a TTFT within its SLO, which its `--json` twin says.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
CODE_BLOCK = re.compile(r"^```[a-z]*\n(.*?)^```", re.M | re.S)
COMMAND = re.compile(r"^(?:\.venv/bin/)?xpyd (?:plan|simulate)\b")


def readme_commands(text: str) -> list[str]:
    """The `xpyd plan`/`xpyd simulate` lines of the text's code blocks, one string per command."""
    commands: list[str] = []
    for block in CODE_BLOCK.findall(text):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if words and COMMAND.match(" ".join(words)):
                commands.append(shlex.join(words))
    return commands


def test_the_extraction_joins_continuations_and_cuts_comments() -> None:
    text = (
        "prose `xpyd plan --rate 1`\n```bash\n.venv/bin/xpyd plan --rate 1 \\\n    --isl 2   # a comment\n"
        "kubectl get pdd\nxpyd simulate --scenario seed-8gpu\n```\n"
    )
    assert readme_commands(text) == [
        ".venv/bin/xpyd plan --rate 1 --isl 2",
        "xpyd simulate --scenario seed-8gpu",
    ]


COMMANDS = readme_commands(README.read_text())


def test_the_readme_shows_a_plan_and_a_simulation() -> None:
    assert any(" plan " in command for command in COMMANDS)
    assert any(" simulate " in command for command in COMMANDS)


def _run(command: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run the command as printed; `.venv/bin/xpyd` (or `xpyd` on PATH) is this environment's."""
    (cwd / ".venv").mkdir(exist_ok=True)
    if not (cwd / ".venv" / "bin").exists():
        (cwd / ".venv" / "bin").symlink_to(Path(sys.executable).parent)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    return subprocess.run(
        shlex.split(command), cwd=cwd, env=env, capture_output=True, text=True, check=False, timeout=600
    )


@pytest.mark.parametrize("command", COMMANDS)
def test_a_readme_command_runs_green(command: str, tmp_path: Path) -> None:
    done = _run(command, tmp_path)
    assert done.returncode == 0, f"{command}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    assert "Traceback" not in done.stderr
    if " plan " in command and "--sweep" not in command:
        twin = _run(command if "--json" in command else f"{command} --json", tmp_path)
        row = json.loads(twin.stdout)
        assert row["feasible"], row["infeasible"]
        assert row["predicted_ttft_seconds"] <= row["ttft_slo_seconds"]
