"""The real-vLLM stack (tests/realvllm, benchmarks/real_vllm.py): engines from rendered pod specs, the router,

Each engine is one "pod" on its own loopback address (127.0.13.x: the 13 keeps clear of other tests),
pinned to one core (VLLM_CPU_OMP_THREADS_BIND, from the pool's env in the PDDeployment, so it is part
of the rendered spec). Every process is started in its own session and killed by its process group
(vLLM's API server spawns its engine core) at teardown, also when set-up fails; logs are printed then.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from e2e.harness.dataplane import answers
from e2e.harness.procs import free_port, pid_alive, wait_until
from e2e.harness.prometheus import PrometheusServer, start_prometheus
from e2e.harness.vllm_engine import ContainerProcess, container_process, vllm_env_dir
from xpyd_api.engines import ENGINES, EngineType
from xpyd_api.models import PDDeployment, RouterType, parse_pdd
from xpyd_api.names import Role
from xpyd_controller.adapters.prometheus import PrometheusSource
from xpyd_controller.control.promql import ROUTER_METRICS, Scope, build_queries
from xpyd_operator.adapters import engine_client
from xpyd_operator.core import render

NAMESPACE, PDD_NAME = "realvllm", "tiny"
POD_IPS = {Role.PREFILL: "127.0.13.1", Role.DECODE: "127.0.13.2"}
ROUTER_IP = "127.0.13.3"
CORES = {Role.PREFILL: "0", Role.DECODE: "1"}
ENGINE_STARTUP_TIMEOUT_S = 900  # imports + first torch.compile under load; cached afterwards
IDLE_SAMPLE_S = 10  # how long idle engines are watched for their CPU use (NIXL busy-polls)
# The controller's rate window covers the whole load stage and its tail, and nothing before it: a
# shorter one drops the first, slowest requests under load and reads a lower p90 than the users saw; a
# longer one (a 120 s floor did, when a quiet machine ran the load in 70 s) takes in the warm-up.
WINDOW_MARGIN_S = 6  # three scrapes before the load starts (the warm-up ends before them)
# Requests through the router before the measured load: a fresh pair's first ones pay one-time costs
# (NIXL's handshake between the engines, first-use allocations) that are no steady state, and skewed
# the means of a 32-request window by a second (decode's mean TTFT 1.30 s over a p90 of 0.93 s).
WARM_UP_REQUESTS = 3
# How often the drain's in-flight reading is taken during the load: each one makes both engines render
# /metrics, CPU the load's requests then wait for; decode holds a request for about a second.
IN_FLIGHT_SAMPLE_S = 1.0
# TTFT buckets 3 % apart (vLLM's defaults are up to 2.5x apart above 1 s), so a p90 read from
# Prometheus is within a bucket's 3 % of the exact one, also with the test's few dozen requests (at 8 %
# a run read prefill's p90 6 % high); the same setting serves any deployment. Only TTFT's: vLLM's
# other latency histograms keep their default buckets, which keeps /metrics small (an engine renders it
# in its API process, every scrape).
# The engines' KV lease (rendered from conversion.kvLeaseSeconds): a stalled pull (see LoadSpec) ends
# about 2 s after it expires, so at 6 s a stalled request is ~8 s late, not ~32 s.
KV_LEASE_S = 6
# What vLLM's NIXL prefill logs when decode did not read a request's KV within the lease: a stalled pull
# (see LoadSpec). A load with one is run once more (MAX_LOAD_ATTEMPTS loads at most) and the last is
# read: the TTFT check is about the engines' steady state, and that stall is vLLM's, not the reading's.
LEASE_EXPIRED_LOG = "Releasing expired KV blocks"
MAX_LOAD_ATTEMPTS = 2
FINE_TTFT_BUCKETS = [round(0.005 * 1.03**k, 6) for k in range(342)]  # 5 ms .. ~120 s
# vLLM's CPU build on a tiny model: a small KV pool (so kv_cache_usage_perc moves) and eager mode
# (no torch.compile: minutes less start-up on 2 cores).
CPU_ENGINE_ARGS = (
    "--max-model-len",
    "1024",
    "--num-gpu-blocks-override",
    "256",
    "--enforce-eager",
    "--custom-histogram-buckets",
    json.dumps({"time_to_first_token": FINE_TTFT_BUCKETS}),
)
CPU_ENGINE_ENV = (
    {"name": "UCX_NET_DEVICES", "value": "lo"},
    {"name": "VLLM_CPU_KVCACHE_SPACE", "value": "1"},
)


def tiny_pdd(model: Path, engine_port: int, router_port: int) -> PDDeployment:
    """The PDDeployment whose rendered pods the test runs (vLLM, NixlConnector by default)."""
    pools = {
        str(role): {"replicas": 1, "env": [{"name": "VLLM_CPU_OMP_THREADS_BIND", "value": CORES[role]}]}
        for role in Role
    }
    spec = {
        "model": {"name": str(model)},
        "engine": {
            "type": "vllm",
            "image": "vllm-cpu:0.32.0",
            "port": engine_port,
            "args": list(CPU_ENGINE_ARGS),
            "env": list(CPU_ENGINE_ENV),
        },
        **pools,
        "conversion": {"kvLeaseSeconds": KV_LEASE_S},
        "router": {"type": "vllm-router", "image": "vllm-router:0.1.17", "port": router_port},
    }
    return parse_pdd({"metadata": {"name": PDD_NAME, "namespace": NAMESPACE, "uid": "u1"}, "spec": spec})


@dataclass
class Running:
    """A process of the stack, killed with its process group."""

    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path

    def log_count(self, text: str) -> int:
        """How many lines of the process's log so far contain `text`."""
        if not self.log_path.exists():
            return 0
        return sum(text in line for line in self.log_path.read_text(errors="replace").splitlines())

    def log_tail(self, lines: int = 80) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, grace: float = 15.0) -> None:
        """SIGTERM to the group, time for every process of the session to exit (an engine core that
        outlives its API server by a moment still unlinks its shared memory), then SIGKILL."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and (self.popen.poll() is None or _session_alive(self.popen.pid)):
            time.sleep(0.1)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGKILL)  # the engine core and any straggler
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=10)


@dataclass
class Engine:
    role: Role
    pod: dict[str, Any]
    process: ContainerProcess
    running: Running

    def cmdline(self) -> list[str]:
        raw = Path(f"/proc/{self.running.popen.pid}/cmdline").read_bytes()
        return [part.decode() for part in raw.split(b"\0") if part]

    def environ(self) -> dict[str, str]:
        raw = Path(f"/proc/{self.running.popen.pid}/environ").read_bytes()
        pairs = (part.decode().partition("=") for part in raw.split(b"\0") if part)
        return {key: value for key, _, value in pairs}

    def metrics_text(self) -> str:
        with urllib.request.urlopen(f"{self.process.url}/metrics", timeout=10) as response:
            return str(response.read().decode())


def _session_stats(session: int) -> Iterator[list[str]]:
    """The /proc stat fields after the command name of each live process of one session."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[3]) == session:  # field 6 of stat: the session id
                yield fields


def session_cpu_seconds(session: int) -> float:
    """CPU seconds (user + system) used so far by the live processes of one session (an engine's API
    server and its engine core)."""
    tick = os.sysconf("SC_CLK_TCK")
    return sum((int(fields[11]) + int(fields[12])) / tick for fields in _session_stats(session))


def _session_alive(session: int) -> bool:
    return any(fields[0] != "Z" for fields in _session_stats(session))


SHM = Path("/dev/shm")


def _shm_in_use() -> set[str]:
    """Names in /dev/shm that a live process has open or mapped."""
    used: set[str] = set()
    for proc in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError):
            used.update(
                line.rsplit("/dev/shm/", 1)[1].split(" ")[0]
                for line in (proc / "maps").read_text().splitlines()
                if "/dev/shm/" in line
            )
            for fd in (proc / "fd").iterdir():
                with contextlib.suppress(OSError):
                    target = os.readlink(fd)
                    if target.startswith("/dev/shm/"):
                        used.add(target.removeprefix("/dev/shm/"))
    return used


@contextlib.contextmanager
def _shared_memory_released() -> Iterator[None]:
    """vLLM's processes share memory through /dev/shm segments (hundreds of MB each) that stay behind,
    holding RAM, when a process dies before unlinking them: at the end, the segments that appeared
    meanwhile and that no live process uses are removed."""
    before = set(os.listdir(SHM)) if SHM.is_dir() else set()
    try:
        yield
    finally:
        if SHM.is_dir():
            left = set(os.listdir(SHM)) - before - _shm_in_use()
            for name in left:
                if name.startswith(("psm_", "sem.mp-")):
                    with contextlib.suppress(OSError):
                        (SHM / name).unlink()


def metric_sum(text: str, name: str, **labels: str) -> float:
    """Sum of a metric's samples in Prometheus text whose labels include `labels`."""
    total = 0.0
    wanted = [f'{key}="{value}"' for key, value in labels.items()]
    for line in text.splitlines():
        named = line.startswith((name + "{", name + " "))
        if named and all(pair in line for pair in wanted):
            total += float(line.rsplit(" ", 1)[1])
    return total


@dataclass
class LoadResult:
    """What the load generator measured on the users' side (inference-perf's own report)."""

    requests: int
    prompt_tokens: int
    ttft_p90_s: float
    ttft_p75_s: float
    ttft_mean_s: float
    ttft_median_s: float
    ttft_p99_s: float
    report: dict[str, Any]


@dataclass
class RealStack:
    engines: list[Engine]
    router: Running
    prometheus: PrometheusServer
    load: LoadResult
    decode_external_kv_tokens: tuple[float, float]
    controller_answers: dict[str, float | None]
    ttft_legs: dict[str, float | None]  # what the controller's TTFT is made of (see ttft_legs())
    in_flight_peaks: dict[str, int | None]
    in_flight_after: dict[str, int | None]
    timings: dict[str, float] = field(default_factory=dict)
    cpu_cores: dict[str, dict[str, float]] = field(default_factory=dict)  # role -> idle / under load
    # per load attempt, the KV pulls that stalled until the lease expired (LEASE_EXPIRED_LOG); the
    # other fields are the last attempt's
    stalled_pulls: list[int] = field(default_factory=list)


def _base_env() -> dict[str, str]:
    """What every process inherits: nothing of the test's own environment beyond the basics."""
    keep = ("PATH", "HOME", "LANG", "TMPDIR")
    return {key: os.environ[key] for key in keep if key in os.environ} | {"PYTHONUNBUFFERED": "1"}


@contextlib.contextmanager
def _logs_in_memory(log_dir: Path) -> Iterator[Path]:
    """A directory in tmpfs for the processes' logs, copied into `log_dir` at the end: a write to a
    disk file blocks while the kernel throttles dirty pages (a CI run's etcd saw 14 s fsyncs), and an
    engine's API process that blocks on its access log holds requests outside every clock but the
    users' and the router's (that run's users' p90 was 25 s over engine TTFT p90s of 3 s)."""
    shm = Path("/dev/shm")
    if not (shm.is_dir() and os.access(shm, os.W_OK)):
        yield log_dir
        return
    memory = Path(tempfile.mkdtemp(prefix="xpyd-realvllm-", dir=shm))
    try:
        yield memory
    finally:
        for path in memory.rglob("*"):
            if path.is_file():
                target = log_dir / path.relative_to(memory)
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(path, target)
        shutil.rmtree(memory, ignore_errors=True)


@contextlib.contextmanager
def _started(name: str, argv: Sequence[str], env: Mapping[str, str], log_dir: Path) -> Iterator[Running]:
    log_path = log_dir / f"{name}.log"
    with log_path.open("ab") as log:
        popen = subprocess.Popen(
            list(argv), stdout=log, stderr=subprocess.STDOUT, env=dict(env), start_new_session=True
        )
    running = Running(name, popen, log_path)
    try:
        yield running
    except BaseException:
        print(f"--- {name} ({' '.join(argv[:3])} ...) ---\n{running.log_tail()}")
        raise
    finally:
        running.stop()


def _wait_healthy(running: Sequence[Running], urls: Sequence[str], timeout: float) -> None:
    def ready() -> bool:
        for process in running:
            if process.popen.poll() is not None:
                raise RuntimeError(
                    f"{process.name} exited with {process.popen.returncode}:\n{process.log_tail()}"
                )
        return all(answers(url) for url in urls)

    wait_until(ready, timeout, " and ".join(urls), interval=2.0)


def static_router_args(rendered: Sequence[str], prefill: str, decode: str) -> list[str]:
    """The rendered router args with Kubernetes service discovery swapped for the two static URLs (there
    is no cluster here); the rest as rendered."""
    discovery_flags = {
        "--service-discovery": 0,
        "--service-discovery-namespace": 1,
        "--service-discovery-port": 1,
    }
    out: list[str] = []
    skip = 0
    in_selector = False
    for arg in rendered:
        if skip:
            skip -= 1
            continue
        if arg in ("--prefill-selector", "--decode-selector"):
            in_selector = True
            continue
        if in_selector and not arg.startswith("--"):
            continue
        in_selector = False
        if arg in discovery_flags:
            skip = discovery_flags[arg]
            continue
        out.append(arg)
    return [*out, "--prefill", prefill, "--decode", decode]


@dataclass(frozen=True)
class LoadSpec:
    """A fixed number of fixed-length requests at a fixed concurrency: bounded however slow the loaded
    machine is (a rate would pile up a queue when two single-core engines fall behind).

    One request at a time: at two, vLLM 0.32's NIXL pull on this CPU build stalls when both requests
    sit at decode (6 runs of 32 requests: 1-4 stalls each): decode gets no KV for seconds, up to the
    prefill's 30 s lease (then the prefill logs LEASE_EXPIRED_LOG and decode reads blocks already
    freed), and the request streaming beside it stops as long. With a tenth of the requests that late
    the users' p90 of 32 sits on the knee (4.8 s in one run, 29.6 s in another), which no reading from
    histograms places within 10 %. One at a time it still stalls: at the 6 s lease 9 of 11 loads of 32
    had at least one (see MAX_LOAD_ATTEMPTS and KV_LEASE_S)."""

    requests: int = 32
    concurrency: int = 1
    prompt_tokens: int = 256
    output_tokens: int = 16

    def inference_perf_config(self, router_url: str, model: Path, out: Path) -> dict[str, Any]:
        """inference-perf's YAML: streaming completions through the router, tokens counted locally."""

        def fixed(tokens: int) -> dict[str, Any]:
            return {
                "type": "fixed",
                "min": tokens,
                "max": tokens,
                "mean": tokens,
                "std_dev": 0,
                "total_count": 1000,
            }

        return {
            "load": {
                "type": "concurrent",
                "stages": [{"num_requests": self.requests, "concurrency_level": self.concurrency}],
            },
            "api": {"type": "completion", "streaming": True},
            "server": {"type": "vllm", "model_name": str(model), "base_url": router_url, "ignore_eos": True},
            "tokenizer": {"pretrained_model_name_or_path": str(model)},
            "data": {
                "type": "random",
                "input_distribution": fixed(self.prompt_tokens),
                "output_distribution": fixed(self.output_tokens),
            },
            "report": {"request_lifecycle": {"summary": True, "per_stage": False, "per_request": True}},
            "storage": {"local_storage": {"path": str(out)}},
        }


def _find_ttft(report: Any) -> dict[str, float]:
    """The TTFT statistics inside inference-perf's summary (its nesting differs between releases)."""
    if isinstance(report, dict):
        for key, value in report.items():
            if key in ("time_to_first_token", "ttft") and isinstance(value, dict) and "p90" in value:
                return {k: float(v) for k, v in value.items() if isinstance(v, int | float)}
            if found := _find_ttft(value):
                return found
    return {}


def run_inference_perf(
    loadgen: Path, config: dict[str, Any], workdir: Path, timeout_s: float
) -> dict[str, Any]:
    config_path = workdir / "inference-perf.yaml"
    config_path.write_text(yaml.safe_dump(config))
    log_path = workdir / "inference-perf.log"
    with log_path.open("wb") as log:
        result = subprocess.run(
            [str(loadgen / "bin" / "inference-perf"), "--config_file", str(config_path)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=_base_env(),
            timeout=timeout_s,
            check=False,
            start_new_session=True,
        )
    tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-60:])
    if result.returncode != 0:
        raise RuntimeError(f"inference-perf exited with {result.returncode}:\n{tail}")
    summaries = sorted(
        Path(config["storage"]["local_storage"]["path"]).glob("**/summary_lifecycle_metrics.json")
    )
    if not summaries:
        raise RuntimeError(f"inference-perf wrote no summary_lifecycle_metrics.json:\n{tail}")
    return dict(json.loads(summaries[-1].read_text()))


class InFlightSampler:
    """Reads each engine's in-flight requests the way the operator's drain does, a few times a second."""

    def __init__(self, urls: Mapping[str, str]) -> None:
        self.urls = urls
        self.peaks: dict[str, int | None] = dict.fromkeys(urls)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            for name, url in self.urls.items():
                value = engine_client.read_in_flight(url, EngineType.VLLM, 2.0)
                if value is not None and (self.peaks[name] is None or value > (self.peaks[name] or 0)):
                    self.peaks[name] = value
            self._stop.wait(IN_FLIGHT_SAMPLE_S)

    def __enter__(self) -> InFlightSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def _settled_in_flight(urls: Mapping[str, str], timeout: float) -> dict[str, int | None]:
    readings: dict[str, int | None] = {}

    def idle() -> bool:
        readings.update(
            {name: engine_client.read_in_flight(url, EngineType.VLLM, 2.0) for name, url in urls.items()}
        )
        return all(value == 0 for value in readings.values())

    with contextlib.suppress(TimeoutError):
        wait_until(idle, timeout, "in-flight requests to reach 0", interval=0.5)
    return readings


def _prometheus_config(engines: Sequence[Engine], router_metrics: str) -> dict[str, Any]:
    targets = [
        {
            "targets": [f"{engine.process.pod_ip}:{engine.process.port}"],
            "labels": {"namespace": NAMESPACE, "pdd": PDD_NAME, "role": str(engine.role)},
        }
        for engine in engines
    ]
    targets.append({"targets": [router_metrics], "labels": {"namespace": NAMESPACE, "pdd": PDD_NAME}})
    return {
        "global": {"scrape_interval": "2s", "evaluation_interval": "2s"},
        "scrape_configs": [{"job_name": "realvllm", "static_configs": targets}],
    }


def warm_up(router_url: str, model: Path, spec: LoadSpec, requests: int) -> None:
    """A few of the load's requests, one at a time, through the router (before the controller's window
    opens, and not in the users' report)."""
    body = {
        "model": str(model),
        "prompt": " ".join(str(i) for i in range(spec.prompt_tokens)),
        "max_tokens": spec.output_tokens,
        "ignore_eos": True,
    }
    for _ in range(requests):
        with urllib.request.urlopen(completion_request(router_url, body), timeout=300) as response:
            response.read()


def completion_request(url: str, body: dict[str, Any]) -> urllib.request.Request:
    """A POST of `body` to `url`'s OpenAI completions endpoint (a router's or an engine's)."""
    return urllib.request.Request(
        f"{url}/v1/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )


def ttft_legs(source: PrometheusSource, scope: Scope) -> dict[str, float | None]:
    """Means, medians and p90s of the legs the controller's TTFT combines, over its window: what a failed
    comparison with the users' clock is read against (which leg grew, or time outside them all)."""
    window = scope.window

    def mean(name: str, role: Role | None) -> str:
        selector = scope.selector(role)
        return f"sum(rate({name}_sum{selector}[{window}])) / sum(rate({name}_count{selector}[{window}]))"

    def quantile(q: float, name: str, role: Role | None) -> str:
        selector = scope.selector(role)
        return f"histogram_quantile({q}, sum by (le) (rate({name}_bucket{selector}[{window}])))"

    def p90(name: str, role: Role | None) -> str:
        return quantile(0.9, name, role)

    def median(name: str, role: Role | None) -> str:
        return quantile(0.5, name, role)

    ttft, router = "vllm:time_to_first_token_seconds", "vllm_router_pd_request_duration_seconds"
    return source.query_all(
        {
            "prefill_ttft_mean": mean(ttft, Role.PREFILL),
            "prefill_ttft_median": median(ttft, Role.PREFILL),
            "prefill_ttft_p90": p90(ttft, Role.PREFILL),
            "decode_ttft_mean": mean(ttft, Role.DECODE),
            "decode_ttft_median": median(ttft, Role.DECODE),
            "decode_ttft_p90": p90(ttft, Role.DECODE),
            "router_until_decode_responds_mean": mean(router, None),
            "router_until_decode_responds_p90": p90(router, None),  # coarse: buckets 2x apart
        }
    )


@contextlib.contextmanager
def real_stack(log_dir: Path) -> Iterator[RealStack]:
    """Start everything, run the load once, collect what the tests check; tear all down by pid."""
    env_dir = vllm_env_dir()
    model = env_dir / "model"
    engine_port, router_port = free_port(), free_port()
    pdd = tiny_pdd(model, engine_port, router_port)
    binaries = {"vllm": env_dir / "engine" / "bin" / "vllm"}
    timings: dict[str, float] = {}
    with contextlib.ExitStack() as stack:
        log_dir = stack.enter_context(_logs_in_memory(log_dir))
        stack.enter_context(_shared_memory_released())
        engines = []
        started = time.monotonic()
        for role in Role:
            pod = render.instance_pod(pdd, role, f"{PDD_NAME}-{role}")
            process = container_process(pod, POD_IPS[role], binaries)
            running = stack.enter_context(
                _started(str(role), process.argv, _base_env() | dict(process.env), log_dir)
            )
            engines.append(Engine(role, pod, process, running))
        _wait_healthy(
            [e.running for e in engines],
            [f"{e.process.url}/health" for e in engines],
            ENGINE_STARTUP_TIMEOUT_S,
        )
        timings["engine_startup_s"] = time.monotonic() - started
        prefill, decode = engines
        deployment = render.router_deployment(pdd)
        assert deployment is not None
        router_pod = {
            "metadata": {"name": f"{PDD_NAME}-router", **deployment["spec"]["template"]["metadata"]}
        }
        router_pod["spec"] = copy.deepcopy(deployment["spec"]["template"]["spec"])
        container = router_pod["spec"]["containers"][0]
        container["args"] = static_router_args(container["args"], prefill.process.url, decode.process.url)
        router_process = container_process(router_pod, ROUTER_IP, {})
        router_metrics_port = next(p["containerPort"] for p in container["ports"] if p["name"] == "metrics")
        router = stack.enter_context(_started("router", router_process.argv, _base_env(), log_dir))
        router_url = f"http://{ROUTER_IP}:{router_port}"
        _wait_healthy([router], [f"{router_url}/health"], 60)
        prometheus = stack.enter_context(
            start_prometheus(_prometheus_config(engines, f"{ROUTER_IP}:{router_metrics_port}"))
        )
        wait_until(
            lambda: prometheus.targets_up() == 3, 60, "Prometheus scraping both engines and the router"
        )

        urls = {str(e.role): f"{e.process.url}/metrics" for e in engines}
        kv_before = metric_sum(
            decode.metrics_text(), "vllm:prompt_tokens_by_source_total", source="external_kv_transfer"
        )
        spec = LoadSpec()
        warm_up(router_url, model, spec, WARM_UP_REQUESTS)
        sessions = {str(e.role): e.running.popen.pid for e in engines}  # each runs in its own session
        stalled_pulls: list[int] = []
        while True:
            # the idle sample is also the gap that keeps the last attempt out of the window's margin
            idle_from = {role: session_cpu_seconds(sid) for role, sid in sessions.items()}
            time.sleep(IDLE_SAMPLE_S)
            idle = {
                role: (session_cpu_seconds(sid) - idle_from[role]) / IDLE_SAMPLE_S
                for role, sid in sessions.items()
            }
            load_from = {role: session_cpu_seconds(sid) for role, sid in sessions.items()}
            expired_from = prefill.running.log_count(LEASE_EXPIRED_LOG)
            attempt_dir = (
                "inference-perf" if not stalled_pulls else f"inference-perf-{len(stalled_pulls) + 1}"
            )
            config = spec.inference_perf_config(router_url, model, log_dir / attempt_dir)
            started = time.monotonic()
            with InFlightSampler(urls) as sampler:
                report = run_inference_perf(env_dir / "loadgen", config, log_dir, timeout_s=600)
            timings["load_s"] = time.monotonic() - started
            after = _settled_in_flight(urls, timeout=60)
            stalled_pulls.append(prefill.running.log_count(LEASE_EXPIRED_LOG) - expired_from)
            if stalled_pulls[-1] == 0 or len(stalled_pulls) == MAX_LOAD_ATTEMPTS:
                break
            print(f"load attempt {len(stalled_pulls)}: {stalled_pulls[-1]} stalled KV pull(s), once more")
        cpu_cores = {
            role: {
                "idle": idle[role],
                "load": (session_cpu_seconds(sid) - load_from[role]) / timings["load_s"],
            }
            for role, sid in sessions.items()
        }
        kv_after = metric_sum(
            decode.metrics_text(), "vllm:prompt_tokens_by_source_total", source="external_kv_transfer"
        )
        time.sleep(5)  # two more scrapes, so the window's last samples include the load's end
        window_s = math.ceil(time.monotonic() - started) + WINDOW_MARGIN_S
        scope = Scope(NAMESPACE, PDD_NAME, window_s)
        source = PrometheusSource(prometheus.url)
        queries = build_queries(
            ENGINES[EngineType.VLLM].metrics, scope, ROUTER_METRICS[RouterType.VLLM_ROUTER]
        )
        controller_answers = {str(signal): value for signal, value in source.query_all(queries).items()}
        legs = ttft_legs(source, scope)
        ttft = _find_ttft(report)
        successes = report.get("successes") or {}
        load = LoadResult(
            requests=int(successes.get("count") or 0),
            prompt_tokens=spec.prompt_tokens,
            ttft_p90_s=float(ttft.get("p90", float("nan"))),
            ttft_p75_s=float(ttft.get("p75", float("nan"))),
            ttft_mean_s=float(ttft.get("mean", float("nan"))),
            ttft_median_s=float(ttft.get("median", float("nan"))),
            ttft_p99_s=float(ttft.get("p99", float("nan"))),
            report=report,
        )
        print(
            json.dumps(
                {
                    "timings": timings,
                    "window_s": window_s,
                    "controller": controller_answers,
                    "ttft_legs": legs,
                    "ttft": ttft,
                    "in_flight_peaks": sampler.peaks,
                    "stalled_pulls_per_attempt": stalled_pulls,
                },
                indent=1,
            )
        )
        yield RealStack(
            engines=engines,
            router=router,
            prometheus=prometheus,
            load=load,
            decode_external_kv_tokens=(kv_before, kv_after),
            controller_answers=controller_answers,
            ttft_legs=legs,
            in_flight_peaks=sampler.peaks,
            in_flight_after=after,
            timings=timings,
            cpu_cores=cpu_cores,
            stalled_pulls=stalled_pulls,
        )
    for engine in engines:
        assert not pid_alive(engine.running.popen.pid)
