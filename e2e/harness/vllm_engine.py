"""Real vLLM (its CPU build) from the cached environment `hack/vllm-env` builds, and rendered pods run
here as the kubelet would run them (e2e/harness/pods.py resolves env and args the same way for kwok).

The argv and environment come from the rendered pod spec, never re-typed: the `vllm` command is the
cached venv's, `$(VAR)` references are expanded, downward-API fields are filled with what the kubelet
would put there (the pod IP, the pod's labels), and `0.0.0.0` is the pod IP (a pod's own address). Each
"pod" is one 127.0.0.x address, so several engines share the machine with the ports they render.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from e2e.harness.pods import container_env, pod_argv
from e2e.harness.testbin import REPO_ROOT, prepared_dir

VLLM_ENV_SCRIPT = REPO_ROOT / "hack" / "vllm-env"
# Set by hack/test after it ran hack/vllm-env, so the harness need not run it again.
VLLM_ENV = "XPYD_VLLM_ENV"


@functools.cache
def vllm_env_dir() -> Path:
    """The cached real-vLLM environment: `engine/` (vLLM CPU venv), `loadgen/` (inference-perf venv) and
    `model/` (a tiny random Llama with its locally trained tokenizer). Built by `hack/vllm-env` on first
    use (minutes; progress on stderr), a no-op when cached."""
    return prepared_dir(VLLM_ENV, ".complete", VLLM_ENV_SCRIPT)


@dataclass(frozen=True)
class ContainerProcess:
    """What the kubelet would exec for a rendered pod's first container, on the pod address `pod_ip`."""

    argv: tuple[str, ...]
    env: Mapping[str, str]
    pod_ip: str
    port: int

    @property
    def url(self) -> str:
        return f"http://{self.pod_ip}:{self.port}"


def container_process(pod: Mapping[str, Any], pod_ip: str, binaries: Mapping[str, Path]) -> ContainerProcess:
    """The process for a rendered pod (a dict as render.py makes it), placed on `pod_ip`."""
    metadata = pod["metadata"]
    view = SimpleNamespace(  # the attributes pods.field_value reads from a Kubernetes client pod
        metadata=SimpleNamespace(
            name=metadata["name"],
            namespace=metadata.get("namespace"),
            uid=metadata.get("uid", ""),
            labels=metadata.get("labels") or {},
            annotations=metadata.get("annotations") or {},
        ),
        spec=SimpleNamespace(node_name=None),
        status=SimpleNamespace(pod_ip=pod_ip, host_ip=pod_ip),
    )
    container = pod["spec"]["containers"][0]
    env = container_env(view, container)
    argv = pod_argv(view, container, env, binaries)
    if argv is None:
        raise ValueError(f"container command {container.get('command')!r}: no local executable for it")
    port = next(p["containerPort"] for p in container["ports"] if p["name"] == "http")
    return ContainerProcess(tuple(argv), env, pod_ip, int(port))
