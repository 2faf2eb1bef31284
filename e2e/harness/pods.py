"""Runs what fake (kwok) pods would run, for the containers this machine can run: the engine stand-in
and the vllm-router.

For each Running pod with a pod IP (a loopback address, see cluster.py) whose first container's command
is one of those, a process is started with that container's command, args and environment, as a kubelet
would: `$(VAR)` references in args are expanded, downward-API fields are resolved, and the process sees the
pod's network as its own, so `0.0.0.0` in its args is the pod IP (a pod's network namespace has no
other address). KUBECONFIG stands for the pod's service account. A pod that goes (or starts terminating)
has its process stopped by pid as a kubelet stops a container: its `preStop` sleep first, then SIGTERM,
SIGKILL when `terminationGracePeriodSeconds` are over; `close()` stops them all at once. Like a
kubelet, the runner keeps a deleted pod Terminating (its finalizer `RUNNER_FINALIZER`) until its process
has ended: kwok hands a pod's IP to the next pod once the pod object is gone, and a new pod must not be
reached at an IP an old engine still answers on. Prometheus finds the pods itself, by Kubernetes pod
discovery against the same cluster (prometheus.py).

A container whose exec liveness probe compares the role label with `XPYD_ROLE` (switchMethod InPlace) is
restarted as the kubelet measured in docs/kind.md restarts it: once the pod's role label no longer names
the role its process started with, the process is stopped as above (preStop, SIGTERM) and started again
from the pod as it is then (env from the labels re-resolved). The pod's status then says so, as a
kubelet's would: `restartCount` one higher and Ready False, Ready True once the new process answers its
readiness probe (kwok itself marks a pod Ready once, when it starts).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from e2e.harness.cluster import LocalCluster
from e2e.harness.procs import kill_pid
from xpyd_api.names import LABEL_ROLE
from xpyd_operator.core.render import ROLE_ENV

logger = logging.getLogger(__name__)

POLL_S = 0.5
VENV_BIN = Path(sys.executable).parent
RUNNABLE_BINARIES = ("vllm-router", "xpyd-engine-standin")  # from the venv (dev extra, console script)
RUNNABLE_MODULES = ("xpyd_controller.standin", "sglang_router.launch_router")  # `python -m ...`
ANY_ADDRESS = "0.0.0.0"
RUNNER_FINALIZER = "xpyd.dev/e2e-pod-runner"
_REFERENCE = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")
_FIELD = re.compile(r"metadata\.(labels|annotations)\['([^']+)'\]")


@dataclass
class PodProcess:
    """A pod's container run here: which pod (name and uid), its pid, argv and log."""

    pod: str
    uid: str
    pod_ip: str
    argv: list[str]
    log_path: Path
    process: subprocess.Popen[bytes]
    pre_stop_s: float = 0.0  # the container's preStop sleep
    grace_s: float = 30.0  # the pod's terminationGracePeriodSeconds (Kubernetes' default 30)
    role: str | None = None  # XPYD_ROLE as the process got it
    restarts: int = 0  # the container's restartCount when this process started
    role_probe: bool = False  # its liveness probe restarts it when the role label changes (InPlace)
    ready_url: str | None = None  # its readiness probe's URL while the pod is not Ready after a restart

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


def local_argv(container: Mapping[str, Any], binaries: Mapping[str, Path] | None = None) -> list[str] | None:
    """The container's command with its executable replaced by this machine's copy (`binaries` adds
    executables outside the venv, e.g. the cached vLLM's `vllm`); None if not runnable."""
    command = list(container.get("command") or [])
    if not command:
        return None
    name = Path(command[0]).name
    if binaries and name in binaries:
        return [str(binaries[name]), *command[1:]]
    if name in ("python", "python3"):
        if len(command) < 3 or command[1] != "-m" or command[2] not in RUNNABLE_MODULES:
            return None
        return [sys.executable, *command[1:]]
    if name in RUNNABLE_BINARIES and (VENV_BIN / name).exists():
        return [str(VENV_BIN / name), *command[1:]]
    return None


def runnable_pods(pods: list[Any]) -> dict[str, Any]:
    """By uid, the pods a kubelet would run now: Running, with a pod IP, not being deleted."""
    return {
        pod.metadata.uid: pod
        for pod in pods
        if pod.status
        and pod.status.pod_ip
        and pod.status.phase == "Running"
        and not pod.metadata.deletion_timestamp
    }


def field_value(pod: Any, path: str) -> str | None:
    """A downward-API `fieldRef.fieldPath` of `pod` (the fields instance and router pods use)."""
    simple: dict[str, str | None] = {
        "metadata.name": pod.metadata.name,
        "metadata.namespace": pod.metadata.namespace,
        "metadata.uid": pod.metadata.uid,
        "spec.nodeName": pod.spec.node_name,
        "status.podIP": pod.status.pod_ip,
        "status.hostIP": pod.status.host_ip,
    }
    if path in simple:
        return simple[path]
    match = _FIELD.fullmatch(path)
    if match:
        kind, key = match.groups()
        values: dict[str, str] = (pod.metadata.labels if kind == "labels" else pod.metadata.annotations) or {}
        return values.get(key)
    return None


def container_env(pod: Any, container: Mapping[str, Any]) -> dict[str, str]:
    """The container's env entries with literal values or field references (others are left out)."""
    env: dict[str, str] = {}
    for entry in container.get("env") or []:
        value = entry.get("value")
        field_ref = (entry.get("valueFrom") or {}).get("fieldRef")
        if value is None and field_ref:
            value = field_value(pod, field_ref.get("fieldPath", ""))
        if value is not None:
            env[entry["name"]] = _REFERENCE.sub(lambda m: env.get(m.group(1), m.group(0)), str(value))
    return env


def pod_argv(
    pod: Any, container: Mapping[str, Any], env: Mapping[str, str], binaries: Mapping[str, Path] | None = None
) -> list[str] | None:
    """What the kubelet would exec for `container`, run here on the pod's IP."""
    command = local_argv(container, binaries)
    if command is None:
        return None
    args = [
        _REFERENCE.sub(lambda m: env.get(m.group(1), m.group(0)), str(a)) for a in container.get("args") or []
    ]
    return [pod.status.pod_ip if part == ANY_ADDRESS else part for part in [*command, *args]]


class PodRunner:
    """Keeps one process per runnable pod of `namespace` (optionally narrowed by a label selector)."""

    def __init__(
        self,
        cluster: LocalCluster,
        namespace: str,
        log_dir: Path,
        selector: str = "",
        binaries: Mapping[str, Path] | None = None,
    ) -> None:
        self.cluster = cluster
        self.binaries = dict(binaries or {})  # executables outside the venv (see local_argv)
        self.namespace = namespace
        self.selector = selector
        self.log_dir = log_dir
        log_dir.mkdir(parents=True, exist_ok=True)
        self.running: dict[str, PodProcess] = {}  # by pod uid
        self.stopping: dict[str, PodProcess] = {}  # terminating (preStop, then SIGTERM), by pod uid
        self.exited: list[tuple[PodProcess, int]] = []  # processes that ended by themselves, and how
        self._restarts: dict[str, int] = {}  # restartCount of containers restarted here, by pod uid
        self._api = client.CoreV1Api(config.new_client_from_config(config_file=str(cluster.kubeconfig)))
        self._lock = threading.Lock()
        self._stop = threading.Event()  # close(): stop polling, and terminating processes skip preStop
        self._thread = threading.Thread(target=self._run, name="pod-runner", daemon=True)

    def start(self) -> PodRunner:
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        with self._lock:
            for uid in list(self.running):
                self._stop_pod(uid)
            stopping = list(self.stopping.values())
        for started in stopping:
            kill_pid(started.process.pid, grace=2.0)
            with contextlib.suppress(subprocess.TimeoutExpired):
                started.process.wait(timeout=10)
        with contextlib.suppress(Exception):  # the cluster may be gone already
            for pod in self._api.list_namespaced_pod(self.namespace, label_selector=self.selector).items:
                self._release(pod)

    def processes(self) -> dict[str, PodProcess]:
        """Every process of this runner by pod uid, terminating ones included (each holds its pod IP)."""
        with self._lock:
            return {**self.stopping, **self.running}

    def process_of(self, pod: str) -> PodProcess | None:
        with self._lock:
            return next((p for p in self.running.values() if p.pod == pod), None)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.sync(self._api.list_namespaced_pod(self.namespace, label_selector=self.selector).items)
            except Exception:  # an API blip: the next poll catches up (level-based)
                logger.exception("pod runner: sync failed")
            self._stop.wait(POLL_S)

    def sync(self, pods: list[Any]) -> None:
        """Start processes for new runnable pods, stop those of pods that are gone or terminating."""
        wanted = runnable_pods(pods)
        with self._lock:
            for uid in [uid for uid in self.running if uid not in wanted]:
                self._stop_pod(uid)
            for pod in pods:  # a deleted pod whose process has ended may go now
                gone = pod.metadata.uid not in self.running and pod.metadata.uid not in self.stopping
                if pod.metadata.deletion_timestamp and gone:
                    self._release(pod)
            for uid, started in list(self.running.items()):
                code = started.process.poll()
                if code is not None:
                    logger.warning(
                        "pod runner: %s exited with %s:\n%s", started.pod, code, started.log_tail()
                    )
                    self.exited.append((started, code))
                    del self.running[uid]
            for uid, started in list(self.running.items()):
                if started.role_probe and (wanted[uid].metadata.labels or {}).get(LABEL_ROLE) != started.role:
                    logger.info("pod runner: %s's role label changed: restarting it", started.pod)
                    self._restarts[uid] = started.restarts + 1
                    self._stop_pod(uid)
            known = {started.uid for started, _ in self.exited}
            held = {started.pod_ip for started in self.stopping.values()}
            for uid, pod in wanted.items():
                if uid not in self.running and uid not in known and pod.status.pod_ip not in held:
                    self._start_pod(pod)
            restarted = [(uid, p) for uid, p in self.running.items() if p.ready_url]
        for uid, started in restarted:
            if _answers(started.ready_url or ""):
                started.ready_url = None
                self._report_container(wanted[uid], started, ready=True)

    def _start_pod(self, pod: Any) -> None:
        container = self._api.api_client.sanitize_for_serialization(pod.spec.containers[0])
        env = container_env(pod, container)
        argv = pod_argv(pod, container, env, self.binaries)
        if argv is None:
            return
        log_path = self.log_dir / f"{pod.metadata.name}.{pod.metadata.uid[:8]}.log"
        process_env = {**os.environ, **env, "KUBECONFIG": str(self.cluster.kubeconfig)}
        with log_path.open("ab") as log:
            process = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, env=process_env, start_new_session=True
            )
        self._hold(pod)
        pre_stop = ((container.get("lifecycle") or {}).get("preStop") or {}).get("sleep") or {}
        grace = pod.spec.termination_grace_period_seconds
        liveness = ((container.get("livenessProbe") or {}).get("exec") or {}).get("command") or []
        started = PodProcess(
            pod.metadata.name,
            pod.metadata.uid,
            pod.status.pod_ip,
            argv,
            log_path,
            process,
            pre_stop_s=float(pre_stop.get("seconds") or 0),
            grace_s=30.0 if grace is None else float(grace),
            role=env.get(ROLE_ENV),
            restarts=self._restarts.get(pod.metadata.uid, 0),
            role_probe=any(f"${ROLE_ENV}" in part for part in liveness),
        )
        self.running[pod.metadata.uid] = started
        if started.restarts:
            started.ready_url = _readiness_url(pod.status.pod_ip, container)
            self._report_container(pod, started, ready=started.ready_url is None)

    def _report_container(self, pod: Any, started: PodProcess, *, ready: bool) -> None:
        """The pod's Ready condition and its container's restartCount, as a kubelet reports them."""
        flag = "True" if ready else "False"
        container = {"name": pod.spec.containers[0].name, "ready": ready, "restartCount": started.restarts}
        status = {
            "conditions": [{"type": "Ready", "status": flag}, {"type": "ContainersReady", "status": flag}],
            "containerStatuses": [{**container, "image": pod.spec.containers[0].image, "imageID": ""}],
        }
        try:
            self._api.patch_namespaced_pod_status(pod.metadata.name, self.namespace, {"status": status})
        except ApiException as error:
            logger.warning("pod runner: cannot report %s's restart: %s", pod.metadata.name, error.reason)

    def _hold(self, pod: Any) -> None:
        """Keep the pod (and so its IP) until its process has ended, as a kubelet does."""
        try:
            self._api.patch_namespaced_pod(
                pod.metadata.name, self.namespace, {"metadata": {"finalizers": [RUNNER_FINALIZER]}}
            )
        except ApiException as error:  # deleted meanwhile: nothing may be added to it any more
            logger.info("pod runner: cannot hold %s: %s", pod.metadata.name, error.reason)

    def _release(self, pod: Any) -> None:
        if RUNNER_FINALIZER not in (pod.metadata.finalizers or []):
            return
        patch = {"metadata": {"$deleteFromPrimitiveList/finalizers": [RUNNER_FINALIZER]}}
        try:
            self._api.patch_namespaced_pod(pod.metadata.name, self.namespace, patch)
        except ApiException as error:
            if error.status != 404:
                raise

    def _stop_pod(self, uid: str) -> None:
        """Terminate in the background, as a kubelet would (the sync loop goes on meanwhile)."""
        started = self.running.pop(uid)
        self.stopping[uid] = started
        threading.Thread(target=self._terminate, args=(started,), name=f"stop-{started.pod}").start()

    def _terminate(self, started: PodProcess) -> None:
        pre_stop = 0.0 if self._stop.is_set() else min(started.pre_stop_s, started.grace_s)
        self._stop.wait(pre_stop)
        kill_pid(started.process.pid, grace=max(2.0, started.grace_s - pre_stop))
        with contextlib.suppress(subprocess.TimeoutExpired):
            started.process.wait(timeout=10)
        with self._lock:
            self.stopping.pop(started.uid, None)


def _readiness_url(pod_ip: str, container: Mapping[str, Any]) -> str | None:
    """The URL of the container's HTTP readiness probe on the pod's IP (a named or numbered port)."""
    http = (container.get("readinessProbe") or {}).get("httpGet") or {}
    port = http.get("port")
    named = {p.get("name"): p.get("containerPort") for p in container.get("ports") or []}
    number = named.get(port, port)
    return f"http://{pod_ip}:{number}{http.get('path', '/')}" if number else None


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2.0) as response:
            return bool(200 <= response.status < 300)
    except (urllib.error.URLError, OSError, ValueError):
        return False


@contextlib.contextmanager
def running_pods(
    cluster: LocalCluster,
    namespace: str,
    log_dir: Path,
    selector: str = "",
    binaries: Mapping[str, Path] | None = None,
) -> Iterator[PodRunner]:
    """A started `PodRunner`; every process it started is stopped by pid on exit."""
    runner = PodRunner(cluster, namespace, log_dir, selector, binaries)
    runner.start()
    try:
        yield runner
    finally:
        runner.close()
