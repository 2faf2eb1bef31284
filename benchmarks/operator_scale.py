"""Operator at scale on the local kwok cluster: convergence time, peak RSS, and conversion latency.

Measures, in one run of a fresh cluster:
  1. time until N PDDeployments x 4 instances are all Ready (status condition, observedGeneration current),
     beside a baseline: the same number of bare pods created directly (the cluster's own speed);
  2. the operator's peak RSS (VmHWM) after that, beside its RSS idle (no PDDeployment yet);
  3. conversion latency: the engine (EngineStub) drains `--drain` seconds after the scale patch; the
     conversion's overhead is the time from the patch to the relabelled pod, minus that drain time.

Usage: .venv/bin/python benchmarks/operator_scale.py [--pdds 100] [--runs 3] [--conversions 5] [--drain 3]
       [--no-router]  (PDDeployments without routers: the operator's own cost, without 100 Deployments)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from e2e.harness.cluster import LocalCluster, start_cluster  # noqa: E402

from xpyd_api.names import ANNOTATION_CONVERSIONS, ANNOTATION_ENGINE_URL  # noqa: E402
from xpyd_operator.testing import EngineStub, OperatorProcess  # noqa: E402

INSTANCES_PER_PDD = 4
GPUS_PER_NODE = 8


def pdd(
    name: str, prefill: int = 2, decode: int = 2, drain: float = 60.0, router: bool = True
) -> dict[str, Any]:
    return {
        "apiVersion": "xpyd.dev/v1alpha1",
        "kind": "PDDeployment",
        "metadata": {"name": name},
        "spec": {
            "model": {"name": "meta-llama/Llama-3.1-8B-Instruct"},
            "engine": {"image": "vllm/vllm-openai:v0.11.0"},
            "router": {"image": "ghcr.io/xpyd/vllm-router:0.1.17"} if router else {"type": "none"},
            "prefill": {"replicas": prefill},
            "decode": {"replicas": decode},
            "conversion": {"drainTimeoutSeconds": drain},
        },
    }


def bare_pod(name: str) -> dict[str, Any]:
    gpu = {"nvidia.com/gpu": "1"}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"bench": "baseline"}},
        "spec": {
            "containers": [{"name": "engine", "image": "x", "resources": {"limits": gpu, "requests": gpu}}]
        },
    }


def get(cluster: LocalCluster, *args: str) -> Any:
    return json.loads(cluster.kubectl("get", *args, "-o", "json", timeout=300).stdout)


def create_list(cluster: LocalCluster, namespace: str, items: list[dict[str, Any]]) -> None:
    body = json.dumps({"apiVersion": "v1", "kind": "List", "items": items})
    cluster.kubectl("create", "-n", namespace, "-f", "-", input=body, timeout=600)


def timed_until(condition: Callable[[], bool], timeout: float, interval: float = 0.5) -> float:
    start = time.monotonic()
    while not condition():
        if time.monotonic() - start > timeout:
            raise TimeoutError(f"not converged after {timeout:.0f}s")
        time.sleep(interval)
    return time.monotonic() - start


def all_ready(cluster: LocalCluster, namespace: str, count: int) -> bool:
    ready = 0
    for item in get(cluster, "pdd", "-n", namespace)["items"]:
        status = item.get("status") or {}
        fresh = status.get("observedGeneration") == item["metadata"]["generation"]
        conditions = status.get("conditions") or []
        ready += fresh and any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)
    return ready == count


def pods_ready(cluster: LocalCluster, namespace: str, count: int) -> bool:
    items = get(cluster, "pods", "-n", namespace, "-l", "bench=baseline")["items"]
    ready = [
        p
        for p in items
        if any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", []))
    ]
    return len(ready) == count


def memory_mb(pid: int, field: str) -> float:
    """A memory figure of a process from /proc (VmRSS: now, VmHWM: peak since start), in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} for pid {pid}")


def converge_run(
    cluster: LocalCluster, run: int, pdds: int, operator: OperatorProcess, router: bool
) -> dict[str, float]:
    """One baseline (bare pods) and one operator convergence, in fresh namespaces, then cleanup."""
    instances = pdds * INSTANCES_PER_PDD
    base_ns, op_ns = f"bench-base-{run}", f"bench-op-{run}"
    for ns in (base_ns, op_ns):
        cluster.kubectl("create", "namespace", ns)
    start = time.monotonic()
    create_list(cluster, base_ns, [bare_pod(f"p-{i}") for i in range(instances)])
    timed_until(lambda: pods_ready(cluster, base_ns, instances), 900)
    baseline = time.monotonic() - start
    cluster.kubectl("delete", "namespace", base_ns, "--wait=true", timeout=600)

    start = time.monotonic()
    create_list(cluster, op_ns, [pdd(f"d{i}", router=router) for i in range(pdds)])
    timed_until(lambda: all_ready(cluster, op_ns, pdds), 1800, interval=1.0)
    converged = time.monotonic() - start
    assert operator.process is not None
    peak = memory_mb(operator.process.pid, "VmHWM")
    cluster.kubectl("delete", "namespace", op_ns, "--wait=true", timeout=900)
    return {"baseline_s": baseline, "operator_s": converged, "peak_rss_mb": peak}


def conversion_run(cluster: LocalCluster, engines: EngineStub, drain: float, count: int) -> list[float]:
    """Seconds beyond `drain` for `count` conversions, alternating decode->prefill and back."""
    ns = "bench-convert"
    cluster.kubectl("create", "namespace", ns)
    create_list(cluster, ns, [pdd("conv", prefill=1, decode=2, drain=drain + 30)])
    timed_until(lambda: all_ready(cluster, ns, 1), 120)
    pods = get(cluster, "pods", "-n", ns, "-l", "xpyd.dev/component=instance")["items"]
    for pod in pods:
        name = pod["metadata"]["name"]
        cluster.kubectl("annotate", "pod", name, "-n", ns, f"{ANNOTATION_ENGINE_URL}={engines.url(name)}")
    overheads = []
    for i in range(count):
        prefill, decode = (2, 1) if i % 2 == 0 else (1, 2)
        done_before = total_conversions(cluster, ns)
        for pod in pods:
            engines.set_in_flight(pod["metadata"]["name"], 1)
        timer = threading.Timer(
            drain, lambda: [engines.set_in_flight(p["metadata"]["name"], 0) for p in pods]
        )
        patch = {"spec": {"prefill": {"replicas": prefill}, "decode": {"replicas": decode}}}
        start = time.monotonic()
        timer.start()
        cluster.kubectl("patch", "pdd", "conv", "-n", ns, "--type=merge", "-p", json.dumps(patch))
        wanted = done_before + 1
        timed_until(lambda: total_conversions(cluster, ns) >= wanted, drain + 60, interval=0.05)  # noqa: B023
        took = time.monotonic() - start
        overheads.append(took - drain)
        timed_until(lambda: all_ready(cluster, ns, 1), 60)
        print(
            f"conversion {i + 1}: {took:.2f}s (drain {drain:.1f}s, overhead {took - drain:.2f}s)", flush=True
        )
    return overheads


def total_conversions(cluster: LocalCluster, namespace: str) -> int:
    pods = get(cluster, "pods", "-n", namespace, "-l", "xpyd.dev/component=instance")["items"]
    return sum(int((p["metadata"].get("annotations") or {}).get(ANNOTATION_CONVERSIONS, "0")) for p in pods)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pdds", type=int, default=100)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--conversions", type=int, default=5)
    parser.add_argument("--no-router", action="store_true", help="PDDeployments without a router Deployment")
    parser.add_argument(
        "--drain", type=float, default=3.0, help="seconds until the converting engine is idle"
    )
    args = parser.parse_args()

    nodes = -(-args.pdds * INSTANCES_PER_PDD // GPUS_PER_NODE) + 1
    log = Path(tempfile.mkdtemp(prefix="xpyd-bench-")) / "operator.log"
    with start_cluster(nodes=nodes) as cluster, EngineStub() as engines:
        cluster.install_crd(ROOT / "crds" / "pddeployments.xpyd.dev.yaml")
        with OperatorProcess(cluster.env(), log, settings={"XPYD_ACTIVE_POLL_SECONDS": "0.2"}) as operator:
            time.sleep(5)
            assert operator.process is not None
            idle_rss = memory_mb(operator.process.pid, "VmRSS")
            runs = [
                converge_run(cluster, i, args.pdds, operator, not args.no_router) for i in range(args.runs)
            ]
            for i, r in enumerate(runs):
                print(f"run {i + 1}: {json.dumps({k: round(v, 2) for k, v in r.items()})}", flush=True)
            overheads = conversion_run(cluster, engines, args.drain, args.conversions)
    summary = {
        "pdds": args.pdds,
        "instances": args.pdds * INSTANCES_PER_PDD,
        "nodes": nodes,
        "runs": args.runs,
        "baseline_bare_pods_s_median": statistics.median(r["baseline_s"] for r in runs),
        "operator_all_ready_s_median": statistics.median(r["operator_s"] for r in runs),
        "operator_peak_rss_mb_max": max(r["peak_rss_mb"] for r in runs),
        "operator_idle_rss_mb": idle_rss,
        "conversion_drain_s": args.drain,
        "conversion_overhead_s_median": statistics.median(overheads),
        "conversion_overhead_s_max": max(overheads),
    }
    print(json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in summary.items()}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
