"""The wheel's and hack/native's build of the compiled engine: without a C compiler it says why."""

from __future__ import annotations

from pathlib import Path

import pytest
from build_native import NativeBuildError, compile_engine

REPO = Path(__file__).resolve().parents[2]


def test_no_compiler_is_a_clear_error_the_wheel_falls_back_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CC", "no-such-compiler")
    with pytest.raises(NativeBuildError, match=r"no C compiler \(no-such-compiler\) on PATH"):
        compile_engine(REPO / "controller" / "src", tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_the_wheel_build_and_hack_native_share_the_build() -> None:
    assert "compile_engine" in (REPO / "setup.py").read_text()
    assert "build_native.py" in (REPO / "hack" / "native").read_text()
    assert "include build_native.py" in (REPO / "MANIFEST.in").read_text()
