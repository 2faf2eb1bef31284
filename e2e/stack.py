"""The whole demo stack on a running cluster: operator, Prometheus, the instance pods' engine stand-ins
and the real vllm-router (run on their loopback pod IPs by the pod runner), controller, a PDDeployment in
Auto, and traffic through the router whose mix swings between long prompts and long outputs. Shared by
`make demo` (e2e/demo.py) and the end-to-end test (e2e/test_demo.py), which runs it time-compressed.

The PDDeployment describes a deliberately small GPU (slow FLOP/s, little HBM): a few requests per second
then keep a handful of instances busy, and the controller's capacity model and the stand-ins' roofline
use the same numbers (the spec's model and hardware, passed to every stand-in), so what the controller
predicts is what the engines do. Prometheus finds the pods by Kubernetes pod discovery against the cluster
and scrapes them with the relabelling of the chart's PodMonitor.
"""

from __future__ import annotations

import contextlib
import json
import re
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np
from kubernetes import client, config

from e2e.harness import LocalCluster, PrometheusServer, start_prometheus
from e2e.harness.pods import PodRunner, running_pods
from e2e.harness.procs import free_port, wait_until
from e2e.harness.prometheus import chart_pod_monitors, pod_monitor_scrape_config
from e2e.traffic import RouterTraffic, TrafficStats, router_traffic
from xpyd_api.engines import STANDIN_COMMAND
from xpyd_api.models import PDDeploymentSpec
from xpyd_api.names import (
    COMPONENT_INSTANCE,
    COMPONENT_ROUTER,
    GROUP,
    LABEL_COMPONENT,
    LABEL_PDD,
    PLURAL,
    VERSION,
)
from xpyd_controller.sim.config import GoodputSlo
from xpyd_controller.sim.traces.synthetic import Constant, MixDrift, PiecewiseLinear, UniformLengths
from xpyd_controller.testing import ControllerProcess
from xpyd_operator.testing import OperatorProcess

ROOT = Path(__file__).resolve().parents[1]
CRD_PATH = ROOT / "crds" / "pddeployments.xpyd.dev.yaml"
PDD_NAME = "demo"
# Chat-like long answers (decode-heavy) and RAG-like long prompts with short answers (prefill-heavy).
LONG_OUTPUTS = UniformLengths(200, 800, 600, 1400)
LONG_PROMPTS = UniformLengths(3000, 6000, 20, 80)
MIX_RAMP_S = 5.0  # how quickly the mix flips at each swing
# The operator reads draining instances' /metrics at their pod IPs, as in a cluster.
OPERATOR_SETTINGS = {
    "XPYD_RESYNC_SECONDS": "2",
    "XPYD_ACTIVE_POLL_SECONDS": "0.5",
    "XPYD_PROBE_POD_IP": "true",
}
# The KV lease (conversion.kvLeaseSeconds, rendered into the stand-ins' args as into vLLM's; vLLM's
# default is 30 s): a converting prefill instance waits it out, and the demo is time-compressed. Decode
# pulls at once after the prefill answered, well within it.
KV_LEASE_S = 10.0
STREAM_INTERVAL = 16  # tokens per streamed chunk: fewer chunks for the client and the router to carry
ROUTER_IMAGE = "ghcr.io/vllm-project/vllm-router:v0.1.17"  # the version measured (docs/operator.md)


@dataclass(frozen=True)
class DemoSettings:
    """How long, how much traffic, how fast the mix swings and how quickly the controller reacts."""

    minutes: float = 5.0
    rate: float = 4.0  # requests/s, flat: only the mix moves
    swing_s: float = 90.0  # seconds of each phase (decode-heavy first, then prefill-heavy, ...)
    swings: int = 0  # > 0: the mix swings this many times, then holds its last phase; 0: keeps swinging
    rate_window_s: float = 20.0  # the controller's window behind rates and quantiles
    interval_s: float = 5.0  # spec.autoscaling.intervalSeconds
    # Longer than a phase: a pool keeps what the other end of the mix needs, within the GPU budget,
    # and the swings are met by conversions between the pools, not by cold starts after the swing.
    scale_down_window_s: float = 120.0
    scale_down_period_s: float = 15.0  # a pool shrinks by one instance per this (60 s would outlast a phase)
    replicas: int = 4  # each pool's at the start: the budget's even split
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("minutes", "rate", "swing_s", "rate_window_s", "interval_s"):
            value = getattr(self, name)
            if not value > 0:
                raise ValueError(f"{name} = {value!r}: must be > 0")
        if self.swings < 0:
            raise ValueError(f"swings = {self.swings!r}: must be >= 0 (0 keeps swinging)")


def mix_weight(swing_s: float, duration_s: float, swings: int = 0) -> PiecewiseLinear:
    """Share of long-prompt requests over time: 0 for `swing_s`, then 1 for `swing_s`, and so on;
    after `swings` swings (when > 0) the last phase holds to the end."""
    times, values = [0.0], [0.0]
    edge, high = swing_s, 1.0
    while edge < duration_s + swing_s and (swings == 0 or len(times) < 2 * swings + 1):
        times += [edge, edge + MIX_RAMP_S]
        values += [1.0 - high, high]
        edge, high = edge + swing_s, 1.0 - high
    return PiecewiseLinear(tuple(times), tuple(values))


def demo_manifest(prometheus_url: str, settings: DemoSettings) -> dict[str, Any]:
    """The PDDeployment the demo applies: vLLM (switch by routing), conversion allowed, Auto mode.

    Its engine is the stand-in, given the spec's own model and hardware to simulate.
    """
    pool = {"replicas": settings.replicas, "minReplicas": 1, "maxReplicas": 5}
    model = {"name": "demo/llama-3.1-8b", "preset": "llama-3.1-8b"}
    hardware = {
        "gpu": "h100-sxm",
        "peakFlops": 3e14,
        "mfu": 0.4,
        "mbu": 1.0,
        "hbmBandwidth": 1e12,
        "hbmBytes": 20e9,
        "link": "ib-400g",
    }
    simulate = json.dumps({"model": model, "hardware": hardware})
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "PDDeployment",
        "metadata": {"name": PDD_NAME},
        "spec": {
            "model": model,
            "hardware": hardware,
            "slo": {"ttftSeconds": 2.0, "tpotSeconds": 0.04, "attainment": 0.9},
            "engine": {
                "type": "vllm",
                "image": "xpyd-standin:dev",
                "command": list(STANDIN_COMMAND),
                "args": ["--stream-interval", str(STREAM_INTERVAL)],
                "env": [{"name": "XPYD_STANDIN_SPEC", "value": simulate}],
            },
            "prefill": pool,
            "decode": pool,
            # power_of_two: by load (the default cache_aware keeps light traffic on one instance per pool).
            "router": {"image": ROUTER_IMAGE, "args": ["--policy", "power_of_two"]},
            # the stand-in serves either role, as vLLM with kv_both does: its image names no vLLM version,
            # so Auto would restart it in place; the demo converts by relabelling
            "conversion": {
                "enabled": True,
                "drainTimeoutSeconds": 60,
                "kvLeaseSeconds": KV_LEASE_S,
                "switchMethod": "Routing",
            },
            "autoscaling": {
                "mode": "Auto",
                "intervalSeconds": settings.interval_s,
                "prometheus": {"url": prometheus_url},
                "scaleUpWindowSeconds": 0,
                "scaleDownWindowSeconds": settings.scale_down_window_s,
                "scaleDownPeriodSeconds": settings.scale_down_period_s,
                "gpuBudget": 8,
            },
        },
    }


def demo_traffic(manifest: Mapping[str, Any], settings: DemoSettings) -> tuple[MixDrift, GoodputSlo]:
    """The traffic's length mix over time and the SLO the client measures (the PDDeployment's)."""
    spec = PDDeploymentSpec.model_validate(manifest["spec"])
    duration = settings.minutes * 60.0
    lengths = MixDrift(LONG_OUTPUTS, LONG_PROMPTS, mix_weight(settings.swing_s, duration, settings.swings))
    slo = GoodputSlo(ttft_s=spec.slo.ttft_seconds, tpot_s=spec.slo.tpot_seconds, max_token_gap_s=None)
    return lengths, slo


@dataclass
class Demo:
    """The running stack and what the demo reads back from it."""

    cluster: LocalCluster
    namespace: str
    settings: DemoSettings
    pods: PodRunner
    traffic: RouterTraffic
    prometheus: PrometheusServer
    operator: OperatorProcess
    controller: ControllerProcess
    workdir: Path
    router_url: str  # the router pod's address (the traffic's target)
    _custom: client.CustomObjectsApi = field(init=False)
    core: client.CoreV1Api = field(init=False)

    def __post_init__(self) -> None:
        api = config.new_client_from_config(config_file=str(self.cluster.kubeconfig))
        self._custom = client.CustomObjectsApi(api)
        self.core = client.CoreV1Api(api)

    def pdd(self) -> dict[str, Any]:
        body = self._custom.get_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, PDD_NAME)
        return cast(dict[str, Any], body)

    def instance_pods(self) -> list[Any]:
        """This PDDeployment's instance pods (kubernetes client objects)."""
        selector = f"{LABEL_PDD}={PDD_NAME},{LABEL_COMPONENT}={COMPONENT_INSTANCE}"
        return list(self.core.list_namespaced_pod(self.namespace, label_selector=selector).items)

    def event_messages(self, reason: str) -> list[str]:
        """Messages of this namespace's Events with `reason`, one per occurrence."""
        items = self.core.list_namespaced_event(self.namespace, field_selector=f"reason={reason}").items
        return [item.message or "" for item in items for _ in range(item.count or 1)]

    def long_prompt_share(self) -> float:
        weight = mix_weight(self.settings.swing_s, self.settings.minutes * 60.0, self.settings.swings)
        return float(weight(np.asarray(self.traffic.now_s)))


def _controller_args(namespace: str, settings: DemoSettings) -> list[str]:
    window = f"{settings.rate_window_s:g}"
    # A free loopback port for the controller's /metrics: the default 9400 may be taken (another stack).
    metrics = ["--metrics-port", str(free_port()), "--metrics-address", "127.0.0.1"]
    return ["--namespace", namespace, "--no-leader-elect", "--tick", "1", "--rate-window", window, *metrics]


def router_url(cluster: LocalCluster, namespace: str, port: int) -> str | None:
    """The router pod's address, once it has one."""
    selector = f"{LABEL_PDD}={PDD_NAME},{LABEL_COMPONENT}={COMPONENT_ROUTER}"
    pods = json.loads(cluster.kubectl("get", "pods", "-n", namespace, "-l", selector, "-o", "json").stdout)
    ips = [p["status"].get("podIP") for p in pods["items"] if not p["metadata"].get("deletionTimestamp")]
    return f"http://{ips[0]}:{port}" if ips and ips[0] else None


def _router_answers(url: str | None) -> bool:
    if url is None:
        return False
    try:
        with urllib.request.urlopen(f"{url}/workers", timeout=2) as response:
            stats = json.loads(response.read())["stats"]
    except (urllib.error.URLError, OSError, ValueError, KeyError):
        return False
    return bool(stats.get("prefill_count") and stats.get("decode_count"))


@contextlib.contextmanager
def demo_stack(
    cluster: LocalCluster, settings: DemoSettings, namespace: str = "xpyd-demo", workdir: Path | None = None
) -> Iterator[Demo]:
    """Everything the demo runs, on `cluster`; each piece is stopped (by pid) on exit, in reverse order.

    Logs go to `workdir` (a new temporary folder, kept, by default); the pods' processes log under pods/.
    """
    workdir = workdir or Path(tempfile.mkdtemp(prefix="xpyd-demo-"))
    cluster.install_crd(CRD_PATH)
    cluster.kubectl("create", "namespace", namespace, check=False)
    with contextlib.ExitStack() as stack:
        operator = stack.enter_context(
            OperatorProcess(cluster.env(), workdir / "operator.log", [namespace], OPERATOR_SETTINGS)
        )
        pods = stack.enter_context(running_pods(cluster, namespace, workdir / "pods"))
        # The engines' PodMonitor only: with the routers' series the controller would take arrivals and
        # TTFT from the router (promql), a change of the demo's inputs that is not measured yet.
        engines = chart_pod_monitors()[COMPONENT_INSTANCE]
        scrape = pod_monitor_scrape_config([engines], cluster.kubeconfig, namespace)
        prometheus = stack.enter_context(start_prometheus(scrape))
        manifest = demo_manifest(prometheus.url, settings)
        cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(manifest))
        port = PDDeploymentSpec.model_validate(manifest["spec"]).router.port
        try:
            wait_until(
                lambda: _router_answers(router_url(cluster, namespace, port)),
                120,
                "the router to serve both pools",
                interval=0.5,
            )
        except TimeoutError:
            listing = cluster.kubectl("get", "pods", "-n", namespace, "-o", "wide", check=False).stdout
            tails = [
                f"--- {p.pod} (pid {p.process.pid}, exit {p.process.poll()})\n{p.log_tail(15)}"
                for p in pods.processes().values()
            ]
            print(f"--- pods ---\n{listing}", *tails, sep="\n")
            raise
        url = router_url(cluster, namespace, port)
        assert url is not None
        lengths, slo = demo_traffic(manifest, settings)
        model = manifest["spec"]["model"]["name"]
        traffic = stack.enter_context(
            router_traffic(url, model, Constant(settings.rate), lengths, slo, seed=settings.seed)
        )
        controller = ControllerProcess(
            cluster.env(), workdir / "controller.log", _controller_args(namespace, settings)
        )
        stack.enter_context(controller)
        yield Demo(
            cluster, namespace, settings, pods, traffic, prometheus, operator, controller, workdir, url
        )


# ---- what the demo prints ----------------------------------------------------------------------------------

_DECISION = re.compile(r"prefill (\d+)→(\d+), decode (\d+)→(\d+)")


@dataclass(frozen=True)
class ScaleCounts:
    """Replica changes the controller wrote, from its ScaleDecision Events."""

    decisions: int
    ups: dict[str, int]
    downs: dict[str, int]

    @classmethod
    def of(cls, messages: list[str]) -> ScaleCounts:
        ups = {"prefill": 0, "decode": 0}
        downs = {"prefill": 0, "decode": 0}
        for message in messages:
            match = _DECISION.search(message)
            if match is None:
                continue
            p0, p1, d0, d1 = map(int, match.groups())
            for role, before, after in (("prefill", p0, p1), ("decode", d0, d1)):
                ups[role] += after > before
                downs[role] += after < before
        return cls(len(messages), ups, downs)


@dataclass
class Reversals:
    """Direction reversals of each pool's replicas within one mix phase (up then down, or down then up),
    from the replicas sampled at every progress line: the flapping the demo's target allows once."""

    swing_s: float
    replicas: dict[str, int] = field(default_factory=dict)
    last_move: dict[str, tuple[int, int]] = field(default_factory=dict)  # role → (phase, ±1)
    per_phase: dict[tuple[str, int], int] = field(default_factory=dict)

    def add(self, elapsed_s: float, prefill: int, decode: int) -> None:
        phase = int(elapsed_s // self.swing_s)
        for role, now in (("prefill", prefill), ("decode", decode)):
            before = self.replicas.get(role, now)
            self.replicas[role] = now
            if now == before:
                continue
            move = 1 if now > before else -1
            last = self.last_move.get(role)
            if last is not None and last[0] == phase and last[1] != move:
                self.per_phase[(role, phase)] = self.per_phase.get((role, phase), 0) + 1
            self.last_move[role] = (phase, move)

    @property
    def worst(self) -> int:
        """The most reversals any pool made in any one phase."""
        return max(self.per_phase.values(), default=0)


def targets_line(within_slo: float | None, intervals: float | None, reversals: int, conversions: int) -> str:
    """The demo's targets against this run: shares of requests and progress intervals within the SLO,
    reversals per pool per mix phase, conversions."""

    def verdict(ok: bool) -> str:
        return "met" if ok else "NOT met"

    def share(value: float | None) -> str:
        return "-" if value is None else f"{value:.0%}"

    return (
        f"  targets: requests within SLO {share(within_slo)} (≥ 95 %: "
        f"{verdict(within_slo is not None and within_slo >= 0.95)}), intervals within SLO "
        f"{share(intervals)} (≥ 90 %: {verdict(intervals is not None and intervals >= 0.9)}), reversals "
        f"per pool per mix phase at most {reversals} (≤ 1: {verdict(reversals <= 1)}), conversions "
        f"{conversions} (visible: {verdict(conversions > 0)})"
    )


def progress_line(
    *,
    elapsed_s: float,
    rate: float,
    long_prompts: float,
    pdd: Mapping[str, Any],
    traffic: TrafficStats,
    previous: TrafficStats,
    conversions: int,
) -> str:
    """One readable line: traffic, pools ready/desired, the controller's last binding, the client's SLO."""
    status = pdd.get("status") or {}
    spec = pdd.get("spec") or {}

    def pool(role: str) -> str:
        ready = (status.get(role) or {}).get("ready", 0)
        return f"{role} {ready}/{(spec.get(role) or {}).get('replicas', '?')}"

    autoscaler = status.get("autoscaler") or {}
    reasons = ",".join(autoscaler.get("reasons") or []) or "-"
    done = traffic.completed - previous.completed
    good = traffic.within_slo - previous.within_slo
    slo = f"{100 * good / done:3.0f}% in SLO" if done else "   - in SLO"
    mix = f"{100 * long_prompts:3.0f}% long-prompt"
    return (
        f"[{elapsed_s:5.0f}s] {rate:g} req/s {mix} | {pool('prefill')} {pool('decode')} ready/desired"
        f" | converting {status.get('converting', 0)}, conversions {conversions}"
        f" | binding {autoscaler.get('binding') or '-'} ({reasons})"
        f" | traffic: {done} done {slo}, {traffic.in_flight} in flight, {traffic.failed} failed"
    )
