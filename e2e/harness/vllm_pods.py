"""Real vLLM engines for the instance pods of a kwok cluster, run here as a kubelet would run them.

kwok's nodes run nothing; `VllmPodRunner` does a kubelet's part for instance pods whose container is
the `vllm` command (the cached CPU build, vllm_engine.py), on the pod's loopback IP:

- it starts the container from the pod as it is (env from the downward API, `$(VAR)` in args expanded,
  e2e/harness/pods.py resolves both) in its own session, and stops its process group when the pod goes;
- at a lower CPU priority (`ENGINE_NICE`) than the cluster, the operator, the router and the test, as a
  node's kubelet keeps system and control-plane work in reserved cgroups and a control-plane node apart:
  a vLLM worker on CPU does not sleep while requests come (its input queue spins for a second after
  each read, NIXL's UCX progress thread polls), and at equal priority engines starved the API server;
- readiness: the pod's Ready condition is False from the container's (re)start until the engine answers
  its readiness probe's path, then True (kwok marks a pod Ready at once; a vLLM start takes minutes);
- liveness: an `exec` livenessProbe is run every `periodSeconds` with the container's environment and
  the pod's downward-API volumes as files under the runner's directory (their mount paths in the
  command are replaced by those directories), the files rewritten from the pod's labels on every poll;
  `failureThreshold` failures in a row restart the container: its process group is killed and the
  container is started again from the pod as it is now (env and args re-resolved, so a downward-API
  env var from a label takes the label's new value, as measured on a real kubelet in docs/kind.md),
  `restartCount` counts it. An engine that exits by itself is started again the same way
  (`restartPolicy: Always`, without the kubelet's back-off). Every restart is logged and printed with
  its reason (the probe's exit, output and duration, or its timeout).

Not pods.PodRunner, which does the same for the engine stand-in and the router: a vLLM engine is an
API server with an engine-core child, stopped here by its process group; it is Ready only once it
answers, also at its first start (minutes); and it gets a minimal environment, not the test's.
"""

from __future__ import annotations

import contextlib
import json
import logging
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kubernetes import client, config

from e2e.harness.cluster import LocalCluster
from e2e.harness.pods import container_env, field_value, pod_argv, runnable_pods
from e2e.harness.vllm_stack import Running

logger = logging.getLogger(__name__)

POLL_S = 0.5
ENGINE_NICE = 10  # niceness added to engine containers: about a tenth of the cluster's CPU weight
HEALTH_TIMEOUT_S = 2.0
PROBE_TIMEOUT_S = 5.0


@dataclass
class EngineContainer:
    """The engine container of one pod, as run here: the current process and what it started with."""

    pod: str
    uid: str
    pod_ip: str
    port: int
    health_path: str
    argv: list[str]
    env: dict[str, str]
    running: Running
    labels: dict[str, str]  # the pod's labels when this process started
    started: float = field(default_factory=time.monotonic)
    ready: bool = False
    restarts: int = 0
    probe_failures: int = 0
    next_probe: float = 0.0
    probe_said: str = ""  # how the last liveness probe ended
    exits: list[int] = field(default_factory=list)  # exit codes of processes that ended by themselves

    @property
    def url(self) -> str:
        return f"http://{self.pod_ip}:{self.port}"

    @property
    def pid(self) -> int:
        return self.running.popen.pid


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=HEALTH_TIMEOUT_S) as response:
            return bool(200 <= response.status < 300)
    except (urllib.error.URLError, OSError, ValueError):
        return False


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class VllmPodRunner:
    """Keeps one real vLLM engine per Running instance pod of `namespace` matching `selector`."""

    def __init__(
        self,
        cluster: LocalCluster,
        namespace: str,
        selector: str,
        log_dir: Path,
        *,
        binaries: Mapping[str, Path],
        base_env: Mapping[str, str],
    ) -> None:
        self.namespace = namespace
        self.selector = selector
        self.log_dir = log_dir
        self.binaries = dict(binaries)
        self.base_env = dict(base_env)
        log_dir.mkdir(parents=True, exist_ok=True)
        self.containers: dict[str, EngineContainer] = {}  # by pod uid
        self.restarted: list[tuple[str, str, str]] = []  # (pod, why, role label then) per restart
        self._api = client.CoreV1Api(config.new_client_from_config(config_file=str(cluster.kubeconfig)))
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="vllm-pod-runner", daemon=True)

    def start(self) -> VllmPodRunner:
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=30)
        with self._lock:
            containers = list(self.containers.values())
            self.containers.clear()
        for container in containers:
            container.running.stop()

    def by_pod(self) -> dict[str, EngineContainer]:
        with self._lock:
            return {c.pod: c for c in self.containers.values()}

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                pods = self._api.list_namespaced_pod(self.namespace, label_selector=self.selector).items
                self.sync(pods)
            except Exception:  # an API blip: the next poll catches up (level-based)
                logger.exception("vllm pod runner: sync failed")
            self._stop.wait(POLL_S)

    def sync(self, pods: list[Any]) -> None:
        wanted = runnable_pods(pods)
        with self._lock:
            for uid in [uid for uid in self.containers if uid not in wanted]:
                container = self.containers.pop(uid)
                threading.Thread(target=container.running.stop, name=f"stop-{container.pod}").start()
        for uid, pod in wanted.items():
            with self._lock:
                known = self.containers.get(uid)
            if known is None:
                self._start(pod, restarts=0)
                continue
            container = known
            code = container.running.popen.poll()
            if code is not None:
                logger.warning("%s exited with %s:\n%s", container.pod, code, container.running.log_tail())
                container.exits.append(code)
                self._restart(pod, container, f"exited with {code}")
            elif self._liveness_failed(pod, container):
                self._restart(pod, container, f"liveness probe failed: {container.probe_said}")
            elif not container.ready and _answers(container.url + container.health_path):
                container.ready = True
                self._patch_status(pod, container, ready=True)

    def _spec(self, pod: Any) -> dict[str, Any]:
        return dict(self._api.api_client.sanitize_for_serialization(pod.spec))

    def _start(self, pod: Any, restarts: int) -> EngineContainer | None:
        spec = self._spec(pod)
        container = spec["containers"][0]
        env = container_env(pod, container)
        argv = pod_argv(pod, container, env, self.binaries)
        if argv is None:
            return None
        port = next(p["containerPort"] for p in container.get("ports") or [] if p.get("name") == "http")
        health = ((container.get("readinessProbe") or {}).get("httpGet") or {}).get("path") or "/health"
        name = pod.metadata.name
        log_path = self.log_dir / f"{name}.log"
        with log_path.open("ab") as log:
            log.write(
                f"\n=== start {restarts} of {name} as {env.get('XPYD_ROLE')} at {_now()} ===\n".encode()
            )
            log.flush()
            popen = subprocess.Popen(
                ["nice", "-n", str(ENGINE_NICE), *argv],  # nice runs the engine in its own process
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.base_env | env,
                start_new_session=True,
            )
        started = EngineContainer(
            pod=name,
            uid=pod.metadata.uid,
            pod_ip=pod.status.pod_ip,
            port=int(port),
            health_path=health,
            argv=list(argv),
            env=env,
            running=Running(name, popen, log_path),
            labels=dict(pod.metadata.labels or {}),
            restarts=restarts,
        )
        probe = container.get("livenessProbe") or {}
        started.next_probe = time.monotonic() + float(probe.get("initialDelaySeconds") or 0)
        with self._lock:
            self.containers[pod.metadata.uid] = started
        self._patch_status(pod, started, ready=False)
        return started

    def _restart(self, pod: Any, container: EngineContainer, why: str) -> None:
        """Kill the container's process group and start it again from the pod as it is now."""
        role = (pod.metadata.labels or {}).get("xpyd.dev/role", "")
        said = f"restarting {container.pod} ({why}; role label {role}, started as {container.env.get('XPYD_ROLE')})"
        logger.warning("%s", said)
        print(said, flush=True)
        self.restarted.append((container.pod, why, role))
        container.running.stop(grace=5.0)
        self._start(pod, restarts=container.restarts + 1)

    def _podinfo(self, pod: Any, spec: Mapping[str, Any], container: Mapping[str, Any]) -> dict[str, str]:
        """The container's downward-API volume mounts as directories here (mount path -> directory),
        their files written from the pod as it is now (the kubelet updates them within about a second)."""
        volumes = {v["name"]: v for v in spec.get("volumes") or [] if v.get("downwardAPI")}
        mounts: dict[str, str] = {}
        for mount in container.get("volumeMounts") or []:
            volume = volumes.get(mount["name"])
            if volume is None:
                continue
            directory = self.log_dir / "podinfo" / pod.metadata.name / mount["name"]
            directory.mkdir(parents=True, exist_ok=True)
            for item in volume["downwardAPI"].get("items") or []:
                path = (item.get("fieldRef") or {}).get("fieldPath", "")
                value = field_value(pod, path)
                if value is not None:
                    target = directory / item["path"]
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_text(value)
            mounts[mount["mountPath"]] = str(directory)
        return mounts

    def _liveness_failed(self, pod: Any, container: EngineContainer) -> bool:
        """Run the exec livenessProbe when it is due; True once it failed failureThreshold times."""
        spec = self._spec(pod)
        rendered = spec["containers"][0]
        probe = rendered.get("livenessProbe") or {}
        command = (probe.get("exec") or {}).get("command")
        if not command or time.monotonic() < container.next_probe:
            return False
        container.next_probe = time.monotonic() + float(probe.get("periodSeconds") or 10)
        mounts = self._podinfo(pod, spec, rendered)
        argv = []
        for part in command:
            local = part
            for mount_path, directory in sorted(mounts.items(), key=lambda m: -len(m[0])):
                local = local.replace(mount_path, directory)
            argv.append(local)
        timeout = float(probe.get("timeoutSeconds") or PROBE_TIMEOUT_S)
        began = time.monotonic()
        try:
            result = subprocess.run(
                argv, env=self.base_env | container.env, capture_output=True, timeout=timeout, check=False
            )
            ok = result.returncode == 0
            container.probe_said = (
                f"exit {result.returncode} {result.stdout[-200:]!r} {result.stderr[-200:]!r}"
            )
        except subprocess.TimeoutExpired:
            ok = False
            container.probe_said = f"timed out after {timeout:.0f}s"
        except OSError as error:
            ok = False
            container.probe_said = repr(error)
        container.probe_said += f" in {time.monotonic() - began:.2f}s"
        container.probe_failures = 0 if ok else container.probe_failures + 1
        return container.probe_failures >= int(probe.get("failureThreshold") or 3)

    def _patch_status(self, pod: Any, container: EngineContainer, *, ready: bool) -> None:
        """The pod's Ready condition and its container's status, as a kubelet reports them."""
        now = _now()
        flag = "True" if ready else "False"
        name = pod.spec.containers[0].name
        status = {
            "conditions": [
                {"type": "Ready", "status": flag, "lastTransitionTime": now},
                {"type": "ContainersReady", "status": flag, "lastTransitionTime": now},
            ],
            "containerStatuses": [
                {
                    "name": name,
                    "image": pod.spec.containers[0].image,
                    "imageID": "",
                    "ready": ready,
                    "started": True,
                    "restartCount": container.restarts,
                    "state": {"running": {"startedAt": now}},
                }
            ],
        }
        try:
            self._api.patch_namespaced_pod_status(pod.metadata.name, self.namespace, {"status": status})
        except client.ApiException as error:
            logger.warning("cannot patch %s's status: %s", pod.metadata.name, error.reason)


@contextlib.contextmanager
def running_engines(
    cluster: LocalCluster,
    namespace: str,
    selector: str,
    log_dir: Path,
    *,
    binaries: Mapping[str, Path],
    base_env: Mapping[str, str],
) -> Iterator[VllmPodRunner]:
    """A started `VllmPodRunner`; every engine it started is stopped by its process group on exit."""
    runner = VllmPodRunner(
        cluster, namespace, selector, log_dir, binaries=binaries, base_env=base_env
    ).start()
    try:
        yield runner
    finally:
        runner.close()


def describe(runner: VllmPodRunner) -> str:
    """Each engine's pod, pid, role label at start, restarts and readiness (for failure messages)."""
    return json.dumps(
        {
            c.pod: {
                "pid": c.pid,
                "role": c.labels.get("xpyd.dev/role"),
                "restarts": c.restarts,
                "ready": c.ready,
            }
            for c in runner.by_pod().values()
        }
    )
