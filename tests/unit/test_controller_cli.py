"""`xpyd controller`: a --help that teaches, and bad flags refused before anything connects."""

from __future__ import annotations

import pytest

from xpyd_controller.cli import main


def test_help_explains_modes_and_examples(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        main(["controller", "--help"])
    assert stopped.value.code == 0
    text = capsys.readouterr().out
    for expected in (
        "Advisory or Auto",
        "status.autoscaler",
        "--all-namespaces",
        "--no-leader-elect",
        "examples:",
    ):
        assert expected in text


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["controller"], "give --namespace NS (repeatable) or --all-namespaces"),
        (["controller", "--namespace", "a", "--label-role", "1role"], "label name for role = '1role'"),
        (
            ["controller", "--namespace", "a", "--rate-window", "0"],
            "rate window = 0.0 s: must be at least 1 s",
        ),
    ],
)
def test_bad_flags_exit_2_naming_the_problem(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--namespace", "a", "--all-namespaces"], "not allowed with argument"),
        (["--namespace", "a", "--policy", "dynamo"], "invalid choice: 'dynamo'"),
    ],
)
def test_argparse_refuses(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        main(["controller", *argv])
    assert stopped.value.code == 2
    assert message in capsys.readouterr().err
