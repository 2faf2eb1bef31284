"""The xpyd operator converting real vLLM engines (tests/realvllm/test_real_conversion.py).

On the kwok cluster: the operator (reconciling against its API server), a PDDeployment of real vLLM
engines (vLLM's CPU build, NixlConnector over UCX on CPU) run for its instance pods by `VllmPodRunner`
(vllm_pods.py, the kubelet's part), and the real vllm-router run for the router pod by the pod runner
(pods.py), finding the engines by Kubernetes service discovery as in a cluster. Traffic goes through the
router the whole time, one request after the other, each with a prompt of its own (no prefix cache
hit, so every request's KV crosses over NIXL).
"""

from __future__ import annotations

import contextlib
import json
import random
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from e2e.harness.cluster import ClusterError, LocalCluster
from e2e.harness.pods import PodRunner, running_pods
from e2e.harness.procs import free_port, wait_until
from e2e.harness.vllm_engine import vllm_env_dir
from e2e.harness.vllm_pods import VllmPodRunner, describe, running_engines
from e2e.harness.vllm_stack import (
    CPU_ENGINE_ENV,
    _base_env,
    _logs_in_memory,
    _shared_memory_released,
    completion_request,
    metric_sum,
)
from xpyd_api.engines import EngineType
from xpyd_api.names import (
    ANNOTATION_CONVERSIONS,
    ANNOTATION_TRANSITION,
    COMPONENT_INSTANCE,
    COMPONENT_ROUTER,
    LABEL_COMPONENT,
    LABEL_PDD,
    LABEL_ROLE,
    LABEL_SERVING,
)
from xpyd_operator.adapters import engine_client
from xpyd_operator.testing import OperatorProcess

ROOT = Path(__file__).resolve().parents[2]
CRD_PATH = ROOT / "crds" / "pddeployments.xpyd.dev.yaml"
PDD_NAME = "tiny"
ENGINE_STARTUP_TIMEOUT_S = 900  # three engines starting together on 2 loaded cores
KV_LEASE_S = 6  # what a converting prefill waits after its last request (decode may still pull)
OPERATOR_SETTINGS = {
    "XPYD_RESYNC_SECONDS": "2",
    "XPYD_ACTIVE_POLL_SECONDS": "0.5",
    "XPYD_PROBE_POD_IP": "true",  # read the engines' in-flight and the router's pools at their pod IPs
}
# Each engine computes with one OpenMP thread. The pools' env must not differ (an instance converted by
# relabelling keeps its pod, and a pod whose template, env included, is the other role's would be
# rolled as outdated), so a core binding puts every engine on the same core. While requests come, a
# vLLM worker does not sleep between them: its input queue spins for a second after each read, and
# NIXL's UCX progress thread polls (about 0.6 core per engine here). A converted engine that restarts
# (InPlace) starts beside two such engines: bound to their core it got 1-5 % of it and did not start
# within 15 minutes, so InPlace stacks run unbound (it then starts in 5-9 minutes). Routing stacks,
# whose engines never restart, keep the binding to core 0.
ENGINE_ENV = {
    "Routing": [*CPU_ENGINE_ENV, {"name": "VLLM_CPU_OMP_THREADS_BIND", "value": "0"}],
    "InPlace": [
        *CPU_ENGINE_ENV,
        {"name": "VLLM_CPU_OMP_THREADS_BIND", "value": "nobind"},
        {"name": "OMP_NUM_THREADS", "value": "1"},
    ],
}
ENGINE_ARGS = ["--max-model-len", "1024", "--num-gpu-blocks-override", "256", "--enforce-eager"]
PROMPT_TOKENS = 96
OUTPUT_TOKENS = 8
XFER_COUNT = "vllm:nixl_xfer_time_seconds_count"  # NIXL reads, counted by the engine that pulls (decode)


def conversion_manifest(
    model: Path, engine_port: int, router_port: int, switch_method: str
) -> dict[str, Any]:
    """2 prefill + 1 decode real vLLM engines behind vllm-router (round robin: after a conversion the
    converted instance gets its share of requests), conversion on, the given switch method."""
    return {
        "apiVersion": "xpyd.dev/v1alpha1",
        "kind": "PDDeployment",
        "metadata": {"name": PDD_NAME},
        "spec": {
            "model": {"name": str(model)},
            "engine": {
                "type": "vllm",
                "image": "vllm-cpu:0.32.0",
                "port": engine_port,
                "args": ENGINE_ARGS,
                "env": ENGINE_ENV[switch_method],
            },
            "prefill": {"replicas": 2},
            "decode": {"replicas": 1},
            "router": {
                "type": "vllm-router",
                "image": "vllm-router:0.1.17",
                "port": router_port,
                "args": ["--policy", "round_robin"],
            },
            "conversion": {
                "enabled": True,
                "kvLeaseSeconds": KV_LEASE_S,
                "drainTimeoutSeconds": 120,
                "switchMethod": switch_method,
            },
        },
    }


# What vLLM's NIXL worker logs for a pull whose handshake with the prefill engine failed (nixl/base_worker.py).
HANDSHAKE_FAILED = "NIXL transfer failure: handshake_failed"
REQUEST_ID_FIELD = "'request_id': '"


def handshake_failures(log: str) -> set[str]:
    """The request ids of an engine log's `HANDSHAKE_FAILED` lines (vLLM logs one per failed pull)."""
    return {
        line.split(REQUEST_ID_FIELD, 1)[1].split("'", 1)[0]
        for line in log.splitlines()
        if HANDSHAKE_FAILED in line and REQUEST_ID_FIELD in line
    }


@dataclass
class Outcome:
    """One request through the router: when, how it ended, and what came back."""

    started: float
    ended: float
    status: int | None  # HTTP status; None when no response came
    error: str = ""
    completion_tokens: int = 0


class Traffic:
    """Completions through the router, one after the other, until closed; each outcome is kept."""

    def __init__(self, router_url: str, model: Path, timeout_s: float = 300.0) -> None:
        self.router_url = router_url
        self.model = model
        self.timeout_s = timeout_s
        self.outcomes: list[Outcome] = []
        self._random = random.Random(7)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="traffic", daemon=True)

    def one(self) -> Outcome:
        # token ids as words of the locally trained byte-level tokenizer; distinct per request
        prompt = " ".join(str(self._random.randrange(10_000)) for _ in range(PROMPT_TOKENS // 2))
        body = {"model": str(self.model), "prompt": prompt, "max_tokens": OUTPUT_TOKENS, "ignore_eos": True}
        request = completion_request(self.router_url, body)
        started = time.monotonic()
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                answer = json.loads(response.read())
                tokens = int((answer.get("usage") or {}).get("completion_tokens") or 0)
                return Outcome(started, time.monotonic(), response.status, completion_tokens=tokens)
        except urllib.error.HTTPError as error:
            text = error.read()[:300].decode(errors="replace")
            return Outcome(started, time.monotonic(), error.code, error=text)
        except (urllib.error.URLError, OSError, ValueError) as error:
            return Outcome(started, time.monotonic(), None, error=repr(error))

    def _run(self) -> None:
        while not self._stop.is_set():
            self.outcomes.append(self.one())

    def start(self) -> Traffic:
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=self.timeout_s + 10)

    def failures(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.status != 200 or o.completion_tokens != OUTPUT_TOKENS]


@dataclass
class ConversionStack:
    cluster: LocalCluster
    namespace: str
    engines: VllmPodRunner
    routers: PodRunner
    operator: OperatorProcess
    router_url: str
    engine_port: int
    model: Path
    timings: dict[str, float] = field(default_factory=dict)

    def pods(self) -> list[dict[str, Any]]:
        selector = f"{LABEL_PDD}={PDD_NAME},{LABEL_COMPONENT}={COMPONENT_INSTANCE}"
        got = self.cluster.kubectl("get", "pods", "-n", self.namespace, "-l", selector, "-o", "json")
        return list(json.loads(got.stdout)["items"])

    def roles(self) -> dict[str, str]:
        return {p["metadata"]["name"]: p["metadata"]["labels"][LABEL_ROLE] for p in self.pods()}

    def settled(self, prefill: int, decode: int) -> bool:
        """Every instance serving in its role, none in a transition, and the counts as given (not yet
        when the API server does not answer: on 2 cores, starting engines can starve it for seconds)."""
        try:
            pods = self.pods()
        except ClusterError:
            return False
        labels = [p["metadata"]["labels"] for p in pods]
        quiet = all(ANNOTATION_TRANSITION not in (p["metadata"].get("annotations") or {}) for p in pods)
        counts = sorted(label[LABEL_ROLE] for label in labels)
        serving = all(label.get(LABEL_SERVING) == "true" for label in labels)
        return quiet and serving and counts == sorted(["prefill"] * prefill + ["decode"] * decode)

    def conversions(self) -> dict[str, int]:
        return {
            p["metadata"]["name"]: int(
                (p["metadata"].get("annotations") or {}).get(ANNOTATION_CONVERSIONS, 0)
            )
            for p in self.pods()
        }

    def router_pools(self) -> dict[str, str]:
        """The router's pools as it lists them (`GET /workers`): engine host -> worker type."""
        with urllib.request.urlopen(f"{self.router_url}/workers", timeout=5) as response:
            workers = json.loads(response.read())["workers"]
        return {
            str(urllib.parse.urlsplit(w["url"]).hostname): str(w.get("worker_type", "")).lower()
            for w in workers
        }

    def router_lists(self, roles: dict[str, str]) -> bool:
        """The router lists every engine (by pod IP) in the pool of its role."""
        ips = {p["metadata"]["name"]: p["status"].get("podIP") for p in self.pods()}
        try:
            pools = self.router_pools()
        except (urllib.error.URLError, OSError, ValueError, KeyError):
            return False
        return all(role in pools.get(str(ips.get(name)), "") for name, role in roles.items())

    def xfer_counts(self) -> dict[str, float]:
        """Each engine's NIXL reads so far, by pod."""
        return {
            name: metric_sum(_metrics(container.url), XFER_COUNT)
            for name, container in self.engines.by_pod().items()
        }

    def pull_directly(self, decoding: str, prefilling: str) -> None:
        """One request prefilled on `prefilling` and decoded on `decoding`, sent to the two engines as
        vLLM's disaggregated proxy sends them (the prefill asked with `do_remote_decode`, its answer's
        `kv_transfer_params` given to the decode), so `decoding` pulls KV from `prefilling` over NIXL."""
        engines = self.engines.by_pod()
        body: dict[str, Any] = {"model": str(self.model), "prompt": "1 2 3 4 5 6 7 8", "ignore_eos": True}
        asked = {"do_remote_decode": True, "do_remote_prefill": False}
        prefilled = _complete(engines[prefilling].url, {**body, "max_tokens": 1, "kv_transfer_params": asked})
        params = prefilled.get("kv_transfer_params")
        assert params, f"{prefilling} answered no kv_transfer_params: {prefilled}"
        _complete(engines[decoding].url, {**body, "max_tokens": OUTPUT_TOKENS, "kv_transfer_params": params})

    def handshake_failures(self, pod: str) -> set[str]:
        """The requests whose KV pull `pod` logged as failed at NIXL's handshake."""
        return handshake_failures(self.engines.by_pod()[pod].running.log_path.read_text(errors="replace"))

    def in_flight(self) -> dict[str, int | None]:
        return {
            name: engine_client.read_in_flight(f"{c.url}/metrics", EngineType.VLLM, 2.0)
            for name, c in self.engines.by_pod().items()
        }

    def patch_replicas(self, prefill: int, decode: int) -> None:
        patch = {"spec": {"prefill": {"replicas": prefill}, "decode": {"replicas": decode}}}
        self.cluster.kubectl(
            "patch", "pdd", PDD_NAME, "-n", self.namespace, "--type=merge", "-p", json.dumps(patch)
        )

    def dump(self) -> None:
        _dump(self.engines, self.routers, self.operator)

    def describe(self) -> str:
        return (
            f"engines {describe(self.engines)}; restarts {self.engines.restarted}; roles {self.roles()}; "
            f"conversions {self.conversions()}"
        )


def _complete(url: str, body: dict[str, Any]) -> dict[str, Any]:
    with urllib.request.urlopen(completion_request(url, body), timeout=120) as response:
        return dict(json.loads(response.read()))


def _metrics(url: str) -> str:
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
        return str(response.read().decode())


@contextlib.contextmanager
def conversion_stack(
    cluster: LocalCluster, namespace: str, log_dir: Path, switch_method: str
) -> Iterator[ConversionStack]:
    """The operator, a 2P+1D PDDeployment of real engines and the router, up and listing all three."""
    env_dir = vllm_env_dir()
    model = env_dir / "model"
    engine_port, router_port = free_port(), free_port()
    cluster.install_crd(CRD_PATH)
    cluster.kubectl("create", "namespace", namespace)
    timings: dict[str, float] = {}
    with contextlib.ExitStack() as stack:
        stack.callback(
            cluster.kubectl,
            "delete",
            "namespace",
            namespace,
            "--wait=false",
            "--ignore-not-found",
            check=False,
        )
        log_dir = stack.enter_context(_logs_in_memory(log_dir))
        stack.enter_context(_shared_memory_released())
        operator = stack.enter_context(
            OperatorProcess(cluster.env(), log_dir / "operator.log", [namespace], OPERATOR_SETTINGS)
        )
        routers = stack.enter_context(
            running_pods(cluster, namespace, log_dir / "router", f"{LABEL_COMPONENT}={COMPONENT_ROUTER}")
        )
        engines = stack.enter_context(
            running_engines(
                cluster,
                namespace,
                f"{LABEL_COMPONENT}={COMPONENT_INSTANCE}",
                log_dir / "engines",
                binaries={"vllm": env_dir / "engine" / "bin" / "vllm"},
                base_env=_base_env(),
            )
        )
        manifest = conversion_manifest(model, engine_port, router_port, switch_method)
        cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(manifest))
        started = time.monotonic()

        def engines_ready() -> bool:
            running = engines.by_pod()
            return len(running) == 3 and all(c.ready for c in running.values())

        try:
            wait_until(
                engines_ready, ENGINE_STARTUP_TIMEOUT_S, "three real vLLM engines to answer", interval=2.0
            )
            timings["engine_startup_s"] = time.monotonic() - started
            router_pod = _router_pod_ip(cluster, namespace)
            conversion = ConversionStack(
                cluster,
                namespace,
                engines,
                routers,
                operator,
                f"http://{router_pod}:{router_port}",
                engine_port,
                model,
                timings,
            )
            roles = conversion.roles()
            wait_until(
                lambda: conversion.router_lists(roles),
                180,
                "the router to list all three engines",
                interval=1.0,
            )
            timings["router_listed_s"] = time.monotonic() - started
        except BaseException:
            _dump(engines, routers, operator)
            raise
        yield conversion


def _dump(engines: VllmPodRunner, routers: PodRunner, operator: OperatorProcess) -> None:
    """The tails of every process's log (a failed set-up or test)."""
    for container in engines.by_pod().values():
        print(f"--- {container.pod} ---\n{container.running.log_tail()}")
    print(f"--- operator ---\n{operator.log_tail(150)}")
    for process in routers.processes().values():
        print(f"--- router {process.pod} ---\n{process.log_tail(80)}")


def _router_pod_ip(cluster: LocalCluster, namespace: str) -> str:
    ips: list[str] = []

    def found() -> bool:
        got = cluster.kubectl(
            "get", "pods", "-n", namespace, "-l", f"{LABEL_COMPONENT}={COMPONENT_ROUTER}", "-o", "json"
        )
        ips[:] = [
            p["status"]["podIP"]
            for p in json.loads(got.stdout)["items"]
            if (p.get("status") or {}).get("podIP")
        ]
        return bool(ips)

    wait_until(found, 120, "the router pod's IP", interval=1.0)
    return ips[0]
