"""Setting up kind: hack/kind installs nothing unasked; the harness's kind config holds each workaround
hack/kind detected, and only those."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from e2e.harness.cluster import ClusterError, kind_config

REPO = Path(__file__).resolve().parents[2]


def test_missing_engine_packages_are_named_not_installed(tmp_path: Path) -> None:
    """No engine answers and dpkg knows none of the packages: hack/kind says what it would install and
    how to allow it, and stops before starting anything."""
    stubs = tmp_path / "bin"
    stubs.mkdir()
    for name in ("docker", "dpkg-query"):
        (stubs / name).write_text("#!/bin/sh\nexit 1\n")
        (stubs / name).chmod(0o755)
    env = {"HOME": str(tmp_path), "XPYD_CACHE": str(tmp_path / "cache"), "PATH": f"{stubs}:/usr/bin:/bin"}
    result = subprocess.run(
        [str(REPO / "hack" / "kind"), "images"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 1, result.stderr
    assert 'FAILED at step "docker engine"' in result.stderr
    assert "apt-get install -y --no-install-recommends docker.io" in result.stderr
    assert "XPYD_ALLOW_SYSTEM_PACKAGES=1" in result.stderr
    assert "starting a private dockerd" not in result.stderr


def test_stock_image_on_a_cgroup_v2_host_needs_nothing() -> None:
    config = kind_config("", [])
    assert config["nodes"] == [{"role": "control-plane"}]
    assert config["networking"] == {"disableDefaultCNI": False}
    assert config["kubeadmConfigPatches"] == []
    assert "containerdConfigPatches" not in config


def test_offline_image_on_this_kind_of_host() -> None:
    config = kind_config(
        "xpyd-kind/node:v1.36.3-abc", ["static-cni", "restrict-oom-score-adj", "kubelet-cgroup-v1"]
    )
    assert config["nodes"] == [{"role": "control-plane", "image": "xpyd-kind/node:v1.36.3-abc"}]
    assert config["networking"] == {"disableDefaultCNI": True}
    patches = config["kubeadmConfigPatches"]
    assert isinstance(patches, list)
    assert "skipPhases: [addon/coredns]" in patches[0]
    assert "failCgroupV1: false" in patches[1]
    assert "ignorePreflightErrors: [SystemVerification]" in patches[2]
    assert config["containerdConfigPatches"] == [
        '[plugins."io.containerd.grpc.v1.cri"]\n  restrict_oom_score_adj = true\n'
    ]


def test_an_unknown_workaround_is_an_error_naming_it() -> None:
    with pytest.raises(ClusterError, match="no-such-fix"):
        kind_config("", ["no-such-fix"])
