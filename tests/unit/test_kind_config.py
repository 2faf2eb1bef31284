"""The kind cluster config the harness writes: each workaround hack/kind detected, and only those."""

from __future__ import annotations

import pytest
from e2e.harness.cluster import ClusterError, kind_config


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
    assert config["containerdConfigPatches"] == [
        '[plugins."io.containerd.grpc.v1.cri"]\n  restrict_oom_score_adj = true\n'
    ]


def test_an_unknown_workaround_is_an_error_naming_it() -> None:
    with pytest.raises(ClusterError, match="no-such-fix"):
        kind_config("", ["no-such-fix"])
