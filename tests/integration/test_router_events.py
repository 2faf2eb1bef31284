"""What the real router does when an instance pod changes, measured on the cluster: serving=false, not
ready, relabelled to the other role, deleted (docs/operator.md, "The router and pod events").

The instance pods and the router Deployment are the operator's own render (no operator runs, so nothing
undoes the test's changes); the pod runner serves each pod's container on its loopback pod IP: engine
stand-ins, and the real router (vllm-router, sglang-router, or smg, the SGLang model gateway cached by
hack/smg-env) started with exactly the rendered command and args, discovering the pods through the
cluster's API server. Traffic flows through the router the whole time; what the router
did is read from its `GET /workers` and from the engines' request logs.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from e2e.harness.cluster import LocalCluster
from e2e.harness.pods import PodRunner, running_pods
from e2e.harness.procs import wait_until
from e2e.harness.testbin import REPO_ROOT, prepared_dir

from xpyd_api.models import parse_pdd
from xpyd_api.names import LABEL_ROLE, LABEL_SERVING, Role
from xpyd_operator.core import render

pytestmark = pytest.mark.cluster

ROUTER_PORT = 8000
ENGINE_PORT = 8100
STANDIN = ["python", "-m", "xpyd_controller.standin"]
# How long the router may take to act on an event; measured well under a second for vllm-router 0.1.17,
# under two seconds for smg 1.13.0.
REACTION_S = 10.0
# smg, the SGLang model gateway (PyPI, sglang-router's successor), cached outside the repository.
SMG_ENV_SCRIPT = REPO_ROOT / "hack" / "smg-env"
SMG_ENV = "XPYD_SMG_DIR"  # set by hack/test after it ran hack/smg-env
# smg 1.13.0 acts on some pod changes only at its 60 s resync: it keeps a removed worker 5 s (draining,
# listed unhealthy) and skips re-adding it meanwhile, so a pod back within those 5 s (Ready=True below
# comes about a second after Ready=False) waits for the resync; and once in seven runs it did not act on
# serving=false within 10 s. Its pools are given the resync, with margin, for every event.
RESYNC_REACTION_S = {"smg": 90.0}


def rendered(namespace: str, router_type: str = "vllm-router") -> dict[str, Any]:
    """Two prefill and two decode instance pods and the router Deployment, as the operator renders them."""
    pdd = parse_pdd(
        {
            "metadata": {"name": "r", "namespace": namespace, "uid": "u-1", "generation": 1},
            "spec": {
                "model": {"name": "standin/model"},
                "engine": {"image": "xpyd-standin:dev", "command": STANDIN, "port": ENGINE_PORT},
                # the relabel alone switches (no restart in place): what the routers' reaction decides
                "conversion": {"switchMethod": "Routing"},
                # round_robin: every instance gets traffic (measured: the default cache_aware policy sends
                # light load with distinct prompts to one prefill and one decode instance).
                "router": {
                    "type": router_type,
                    "image": f"{router_type}:test",
                    "port": ROUTER_PORT,
                    "args": ["--policy", "round_robin"],
                },
            },
        }
    )
    pods = [render.instance_pod(pdd, role, f"r-{role}-{i}") for role in Role for i in range(2)]
    router = render.router_deployment(pdd)
    assert router is not None
    for body in [*pods, router]:
        body["metadata"].pop("ownerReferences")  # no PDDeployment object exists: keep the GC away
    return {"pods": pods, "router": router}


@dataclass
class Traffic:
    """Requests sent through the router at a steady pace from a thread; failures are kept."""

    url: str
    sent: int = 0
    failures: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        while not self._stop.wait(0.05):
            # Text (sglang-router 0.3.2 refuses token-id prompts with 422), different each time.
            prompt = " ".join(f"w{self.sent}-{i}" for i in range(64))
            body = json.dumps({"model": "standin/model", "prompt": prompt, "max_tokens": 4}).encode()
            request = urllib.request.Request(
                f"{self.url}/v1/completions", body, {"Content-Type": "application/json"}
            )
            self.sent += 1
            try:
                with urllib.request.urlopen(request, timeout=30) as response:
                    json.loads(response.read())
            except (urllib.error.URLError, OSError, ValueError) as error:
                self.failures.append(repr(error))

    def stop(self) -> None:
        self._stop.set()


class Fixture:
    """The running router, the pods' processes and their addresses."""

    def __init__(self, cluster: LocalCluster, namespace: str, runner: PodRunner, router_type: str) -> None:
        self.cluster, self.namespace, self.runner = cluster, namespace, runner
        self.router_type = router_type

    def pod(self, name: str) -> dict[str, Any]:
        return json.loads(self.cluster.kubectl("get", "pod", name, "-n", self.namespace, "-o", "json").stdout)

    def url(self, name: str, port: int) -> str:
        return f"http://{self.pod(name)['status']['podIP']}:{port}"

    def router_url(self) -> str:
        names = self.cluster.kubectl(
            "get", "pods", "-n", self.namespace, "-l", "xpyd.dev/component=router", "-o", "name"
        ).stdout.split()
        assert len(names) == 1, names
        return self.url(names[0].removeprefix("pod/"), ROUTER_PORT)

    def workers(self, healthy_only: bool = True) -> dict[str, str]:
        """The router's pools: engine URL → worker_type (prefill/decode), healthy ones only unless told
        (the operator reads every listed worker: smg lists a removed worker, unhealthy, while it drains)."""
        try:
            with urllib.request.urlopen(f"{self.router_url()}/workers", timeout=5) as response:
                body = json.loads(response.read())
        except (urllib.error.URLError, OSError):
            return {}
        pools: dict[str, str] = {}  # a URL listed twice (in both pools) shows as "decode+prefill"
        for w in body["workers"]:
            if w.get("is_healthy", True) or not healthy_only:
                pools[w["url"]] = "+".join(
                    sorted({*pools.get(w["url"], "").split("+"), w["worker_type"]} - {""})
                )
        return pools

    def engine_log(self, name: str) -> dict[str, Any]:
        with urllib.request.urlopen(f"{self.url(name, ENGINE_PORT)}/xpyd/requests", timeout=5) as response:
            return dict(json.loads(response.read()))

    def label(self, name: str, **labels: str) -> float:
        pairs = [f"{key}={value}" for key, value in labels.items()]
        self.cluster.kubectl("label", "pod", name, "-n", self.namespace, "--overwrite", *pairs)
        return time.time()

    def wait_workers(self, expected: dict[str, str], what: str, timeout: float = REACTION_S) -> float:
        wait_until(lambda: self.workers() == expected, timeout, what, interval=0.1)
        return time.time()


@pytest.fixture(params=["vllm-router", "sglang-router", "smg"])
def router_cluster(
    request: pytest.FixtureRequest, kube_cluster: LocalCluster, namespace: str, tmp_path: Path
) -> Iterator[Fixture]:
    objects = rendered(namespace, request.param)
    binaries: dict[str, Path] = {}
    if request.param == "smg":
        binaries["smg"] = prepared_dir(SMG_ENV, ".complete", SMG_ENV_SCRIPT) / "bin" / "smg"
    with running_pods(kube_cluster, namespace, tmp_path / "pods", binaries=binaries) as runner:
        manifest = {"apiVersion": "v1", "kind": "List", "items": [*objects["pods"], objects["router"]]}
        kube_cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(manifest))
        fixture = Fixture(kube_cluster, namespace, runner, request.param)
        try:
            yield fixture
        finally:
            for started in [*runner.running.values(), *(p for p, _ in runner.exited)]:
                print(f"--- {started.pod} ({started.argv[0]}) ---\n{started.log_tail(15)}")


# What each router does within REACTION_S (RESYNC_REACTION_S for smg), as measured by the test
# below (docs/operator.md's table):
# True = the router's pools follow the event, False = they do not (the instance keeps its old place).
EXPECTED: dict[str, dict[str, bool]] = {
    "vllm-router": {
        "serving=false": True,
        "serving=true": True,
        "role relabel": True,
        "not ready": True,
        "ready again": True,
        "delete": True,
    },
    "sglang-router": {
        "serving=false": False,
        "serving=true": True,  # nothing to undo: it never left
        "role relabel": False,
        "not ready": False,
        "ready again": True,
        "delete": True,
    },
    "smg": {
        "serving=false": True,
        "serving=true": True,
        "role relabel": True,
        "not ready": True,
        "ready again": True,
        "delete": True,
    },
}


def test_the_router_follows_serving_readiness_role_and_deletion_as_measured(router_cluster: Fixture) -> None:
    f = router_cluster
    names = [f"r-{role}-{i}" for role in Role for i in range(2)]
    urls = {name: f.url(name, ENGINE_PORT) for name in names}
    start = {urls[n]: ("prefill" if "prefill" in n else "decode") for n in names}
    wait_until(lambda: f.workers() == start, 90, "the router to discover all four instances", interval=0.5)
    # The router is the rendered container: same command and args, started from the pod spec.
    router = next(p for p in f.runner.running.values() if p.pod.startswith("r-router-"))
    container = f.pod(router.pod)["spec"]["containers"][0]
    command = [*container["command"][1:], *container["args"]]
    assert router.argv[1:] == [router.pod_ip if a == "0.0.0.0" else a for a in command]

    traffic = Traffic(f.router_url())
    thread = threading.Thread(target=traffic.run, daemon=True)
    thread.start()
    reaction = RESYNC_REACTION_S.get(f.router_type, REACTION_S)
    measured: dict[str, float | None] = {}  # seconds until the pools followed, None: not within `reaction`

    def follows(event: str, expected: dict[str, str]) -> bool:
        changed = time.time()
        try:
            measured[event] = (
                f.wait_workers(expected, f"the router's pools after {event}", reaction) - changed
            )
        except TimeoutError:
            measured[event] = None
        return measured[event] is not None

    try:
        try:
            wait_until(
                lambda: all(f.engine_log(n)["requests"] for n in names), 30, "traffic on every instance"
            )
        except TimeoutError:
            counts = {n: len(f.engine_log(n)["requests"]) for n in names}
            raise AssertionError(f"requests per instance {counts}, failures {traffic.failures[:3]}") from None

        # serving=false: out of the prefill pool; then no new request and no health check.
        labelled = f.label("r-prefill-0", **{LABEL_SERVING: "false"})
        unlisted: float | None = None
        pools = {u: t for u, t in start.items() if u != urls["r-prefill-0"]}
        if follows("serving=false", pools):
            seen = f.engine_log("r-prefill-0")
            time.sleep(3)
            later = f.engine_log("r-prefill-0")
            assert len(later["requests"]) == len(seen["requests"]), "requests after serving=false"
            assert later["health_checks"] == seen["health_checks"], "health checks after serving=false"
            # not listed at all: what the operator waits for before it relabels a draining instance
            wait_until(lambda: urls["r-prefill-0"] not in f.workers(healthy_only=False), reaction, "unlisted")
            unlisted = time.time() - labelled
        # back to serving once unlisted (the operator's order; for sglang-router 4 s later)
        f.label("r-prefill-0", **{LABEL_SERVING: "true"})
        follows("serving=true", start)

        # relabelled to the other role: moves pools, then gets only that role's requests.
        f.label("r-decode-1", **{LABEL_ROLE: "prefill"})
        moved = {**start, urls["r-decode-1"]: "prefill"}
        if follows("role relabel", moved):
            before = len(f.engine_log("r-decode-1")["requests"])
            wait_until(
                lambda: len(f.engine_log("r-decode-1")["requests"]) > before + 3, 30, "work on r-decode-1"
            )
            kinds = {r["kind"] for r in f.engine_log("r-decode-1")["requests"][before:]}
            # vllm-router and smg (told NixlConnector by the rendered annotation) ask it for KV
            # (do_remote_decode) only
            assert kinds == {"prefill"}, kinds
        current = f.workers()

        # not ready (kwok leaves a pod's status alone with this annotation): out; ready again: back.
        # (Each pool keeps a serving instance throughout: with none, the router answers 503.)
        f.cluster.kubectl(
            "annotate", "pod", "r-prefill-1", "-n", f.namespace, "--overwrite", "kwok.x-k8s.io/status=custom"
        )
        _set_ready(f, "r-prefill-1", False)
        follows("not ready", {u: t for u, t in current.items() if u != urls["r-prefill-1"]})
        _set_ready(f, "r-prefill-1", True)
        follows("ready again", current)

        # deleted: out at once.
        f.cluster.kubectl("delete", "pod", "r-decode-1", "-n", f.namespace, "--wait=false")
        follows("delete", {u: t for u, t in current.items() if u != urls["r-decode-1"]})
    finally:
        traffic.stop()
        thread.join(timeout=35)
    print(
        f"{f.router_type}: seconds until the pools followed:",
        {k: v and round(v, 2) for k, v in measured.items()},
        "; serving=false until unlisted:",
        unlisted and round(unlisted, 2),
    )
    assert {event: seconds is not None for event, seconds in measured.items()} == EXPECTED[f.router_type]
    assert traffic.failures == [], traffic.failures[:5]
    assert traffic.sent > 50


def _set_ready(f: Fixture, name: str, ready: bool) -> None:
    status = "True" if ready else "False"
    conditions = [
        {"type": "Ready", "status": status},
        {"type": "ContainersReady", "status": status},
    ]
    f.cluster.kubectl(
        "patch", "pod", name, "-n", f.namespace, "--subresource=status", "--type=strategic",
        "-p", json.dumps({"status": {"conditions": conditions}}),
    )  # fmt: skip
