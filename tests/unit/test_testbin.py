"""hack/testbin fails early and says which step broke and what to install."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _testbin(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    base = {"HOME": str(tmp_path), "XPYD_CACHE": str(tmp_path / "cache"), "PATH": "/usr/bin:/bin"}
    return subprocess.run(
        [str(REPO / "hack" / "testbin")],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_missing_go_toolchain_is_named_with_what_to_install(tmp_path: Path) -> None:
    result = _testbin(tmp_path)
    assert result.returncode == 1
    assert 'FAILED at step "go toolchain"' in result.stderr
    assert "install Go >= 1.26" in result.stderr


def test_unreachable_module_proxy_is_named(tmp_path: Path) -> None:
    go_bin = Path(
        subprocess.run(["go", "env", "GOROOT"], capture_output=True, text=True, check=True).stdout.strip()
    )
    result = _testbin(
        tmp_path,
        PATH=f"{go_bin / 'bin'}{os.pathsep}/usr/bin:/bin",
        GOPROXY="off",
        GOMODCACHE=str(tmp_path / "gomod"),
        GOCACHE=str(tmp_path / "gocache"),
        GOTOOLCHAIN="local",
    )
    assert result.returncode == 1
    assert 'FAILED at step "go module proxy"' in result.stderr
    assert "set GOPROXY to a reachable proxy" in result.stderr


def test_print_dir_is_keyed_by_the_pinned_versions(tmp_path: Path) -> None:
    pinned = dict(
        line.split("=", 1)
        for line in (REPO / "hack" / "versions.env").read_text().splitlines()
        if line and not line.startswith("#")
    )
    printed = subprocess.run(
        [str(REPO / "hack" / "testbin"), "--print-dir"],
        env={"XPYD_CACHE": str(tmp_path / "cache"), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert printed.startswith(f"{tmp_path}/cache/testbin/") and printed.endswith("/bin")
    for version in (
        pinned["KUBERNETES_VERSION"],
        pinned["ETCD_VERSION"],
        pinned["KWOK_VERSION"],
        pinned["HELM_VERSION"],
    ):
        assert version in printed
