"""The local Kubernetes cluster for integration and e2e tests, chosen by `XPYD_CLUSTER`.

- `kwok` (default): etcd + kube-apiserver + kube-controller-manager + kube-scheduler + kwok, started by
  `kwokctl --runtime binary` on 127.0.0.1 from the binaries `hack/testbin` builds. Nodes are fake: pods
  scheduled to them become Running/Ready but run nothing by themselves. Their pod IPs are loopback
  addresses (each node's pod CIDR is a /24 inside 127.0.0.0/8, unique per cluster), so whatever serves a
  pod's ports on its pod IP (e2e/harness/pods.py) is reached like a pod in a cluster.
- `kind`: a one-node kind cluster whose pods really run, under `hack/kind run` (it provides the engine,
  the node image, the project images and what this host needs worked around; docs/kind.md).
- `existing`: the current KUBECONFIG context, only if its name looks like a test cluster.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from e2e.harness.procs import become_subreaper, free_port, kill_and_reap, pids_in, wait_until
from e2e.harness.testbin import testbin_dir

PROVIDERS = ("kwok", "kind", "existing")
# Context names that may be used by `XPYD_CLUSTER=existing`; anything else could be someone's production.
TEST_CONTEXT_MARKERS = ("kind-", "kwok-", "minikube", "k3d-", "test", "dev", "local")
# Node capacity of every fake node: enough for several GPU instances each.
FAKE_NODE_ALLOCATABLE = {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": "8"}


# Pod CIDRs of fake nodes: 127.<b>.<node>.0/24, with <b> chosen per cluster among these (not 127.0.x.x,
# where other local services usually listen) and not already used by a socket on this machine.
LOOPBACK_SECOND_OCTETS = range(100, 255)


class ClusterError(RuntimeError):
    """The cluster could not be started or used; the message says which step and why."""


@dataclass
class LocalCluster:
    """A running cluster: its kubeconfig, the binaries that drive it, and where its logs live."""

    name: str
    provider: str
    kubeconfig: Path
    bin_dir: Path
    logs_dir: Path | None = None
    nodes: list[str] = field(default_factory=list)
    pod_network: str | None = None  # kwok: the loopback /16 its nodes' pod CIDRs are cut from
    pids_dir: Path | None = None  # kwok: where each control-plane component's pid file is

    def component_pid(self, component: str) -> int:
        """The pid of a control-plane process (`etcd`, `kube-apiserver`, ...) of a kwok cluster, for
        fault tests that pause or kill it."""
        if self.pids_dir is None:
            raise ClusterError(f"{self.provider} cluster {self.name}: its components are not local processes")
        return int((self.pids_dir / f"{component}.pid").read_text().strip())

    def env(self) -> dict[str, str]:
        """Environment for subprocesses that talk to this cluster (kubectl, the operator, helm)."""
        env = dict(os.environ)
        env["KUBECONFIG"] = str(self.kubeconfig)
        env["PATH"] = f"{self.bin_dir}{os.pathsep}{env.get('PATH', '')}"
        return env

    def kubectl(
        self, *args: str, check: bool = True, input: str | None = None, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        """Run the cached kubectl against this cluster; raises ClusterError with stderr when `check` fails."""
        result = subprocess.run(
            [str(self.bin_dir / "kubectl"), *args],
            input=input,
            capture_output=True,
            text=True,
            env=self.env(),
            timeout=timeout,
            check=False,
        )
        if check and result.returncode != 0:
            raise ClusterError(
                f"kubectl {' '.join(args)} failed ({result.returncode}): {result.stderr.strip()}"
            )
        return result

    def install_crd(self, path: Path, timeout: float = 60) -> str:
        """Apply a CRD (server-side) and wait until it is Established; returns its name.

        Polls instead of `kubectl wait`, which fails outright while the CRD has no status conditions yet.
        """
        name = self.kubectl("apply", "--server-side", "-f", str(path), "-o", "name").stdout.strip()
        name = name.removeprefix("customresourcedefinition.apiextensions.k8s.io/")
        established = '{.status.conditions[?(@.type=="Established")].status}'
        wait_until(
            lambda: (
                self.kubectl("get", "crd", name, "-o", f"jsonpath={established}", check=False).stdout
                == "True"
            ),
            timeout,
            f"CRD {name} to be Established",
        )
        return name

    def dump_logs(self, tail: int = 60) -> None:
        """Print the tail of every control-plane component's log to stderr (used when a test failed)."""
        if self.logs_dir is None or not self.logs_dir.exists():
            return
        for log in sorted(self.logs_dir.glob("*.log")):
            lines = log.read_text(errors="replace").splitlines()[-tail:]
            print(f"----- {log.name} (last {len(lines)} lines) -----", file=sys.stderr)
            print("\n".join(lines), file=sys.stderr)


def cluster_provider() -> str:
    provider = os.environ.get("XPYD_CLUSTER", "kwok")
    if provider not in PROVIDERS:
        raise ClusterError(f"XPYD_CLUSTER={provider!r} is not one of {', '.join(PROVIDERS)}")
    return provider


ComponentArgs = Mapping[str, Mapping[str, str]]  # component name -> flag (without "--") -> value
# Every kwok cluster runs one replica of each: leader election only lets a CPU-starved process die.
# Measured: while the real-vLLM group loaded both cores, kube-controller-manager missed its lease
# renewal ("leaderelection lost"), exited, and new namespaces got no default ServiceAccount any more.
DEFAULT_COMPONENT_ARGS: ComponentArgs = {
    component: {"leader-elect": "false"} for component in ("kube-controller-manager", "kube-scheduler")
}


@contextlib.contextmanager
def start_cluster(
    nodes: int = 3, name: str | None = None, component_args: ComponentArgs | None = None
) -> Iterator[LocalCluster]:
    """Start a cluster of the provider named by XPYD_CLUSTER; always tears it down on exit.
    `component_args` adds flags to control-plane components (kwok only: a test that owns its cluster)."""
    provider = cluster_provider()
    name = name or f"xpyd-{uuid.uuid4().hex[:8]}"
    if component_args and provider != "kwok":
        raise ClusterError(f"component_args need XPYD_CLUSTER=kwok, not {provider}")
    if provider == "kwok":
        with _kwok_cluster(name, nodes, component_args or {}) as cluster:
            yield cluster
    elif provider == "kind":
        with _kind_cluster(name) as cluster:
            yield cluster
    else:
        yield _existing_cluster()


def _loopback_octets_in_use() -> set[int]:
    """Second octets of 127.x.y.z addresses that sockets on this machine are bound to (IPv4 TCP/UDP)."""
    used = set()
    for table in ("/proc/net/tcp", "/proc/net/udp"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                address = int(line.split()[1].split(":")[0], 16).to_bytes(4, "little")
                if address[0] == 127:
                    used.add(address[1])
    return used


def loopback_pod_network() -> str:
    """A 127.<b>.0.0/16 no local socket uses, for one cluster's pod IPs (other clusters may run too)."""
    free = sorted(set(LOOPBACK_SECOND_OCTETS) - _loopback_octets_in_use())
    if not free:
        raise ClusterError("no free 127.<b>.0.0/16 for pod IPs: every candidate has a bound socket")
    return f"127.{random.choice(free)}.0.0/16"


def _node_pod_cidr(pod_network: str, index: int) -> str:
    prefix = pod_network.split(".")[:2]
    return ".".join([*prefix, str(index), "0"]) + "/24"


def _fake_node_manifest(name: str, index: int, pod_network: str) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "type": "kwok",
                "nvidia.com/gpu.present": "true",
            },
        },
        "spec": {
            "podCIDR": _node_pod_cidr(pod_network, index),
            "podCIDRs": [_node_pod_cidr(pod_network, index)],
        },
        "status": {
            # Loopback, never a routable address: nothing may send traffic to a fake node by accident.
            "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
            "allocatable": FAKE_NODE_ALLOCATABLE,
            "capacity": FAKE_NODE_ALLOCATABLE,
        },
    }


def _run_step(step: str, argv: Sequence[str], env: dict[str, str], timeout: float) -> str:
    try:
        result = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as err:
        raise ClusterError(f"{step}: `{' '.join(argv)}` timed out after {timeout:.0f}s") from err
    if result.returncode != 0:
        raise ClusterError(
            f"{step}: `{' '.join(argv)}` failed ({result.returncode}):\n{result.stderr[-3000:]}"
        )
    return result.stdout


def _with_defaults(component_args: ComponentArgs) -> dict[str, dict[str, str]]:
    """DEFAULT_COMPONENT_ARGS with the caller's flags over them."""
    merged = {component: dict(flags) for component, flags in DEFAULT_COMPONENT_ARGS.items()}
    for component, flags in component_args.items():
        merged.setdefault(component, {}).update(flags)
    return merged


def _write_kwokctl_config(workdir: Path, bin_dir: Path, component_args: ComponentArgs) -> Path:
    """kwokctl's configuration: binary runtime on 127.0.0.1, a fresh API server port, our binaries."""
    config = workdir / "kwokctl.yaml"
    config.write_text(
        json.dumps(
            {
                "apiVersion": "config.kwok.x-k8s.io/v1alpha1",
                "kind": "KwokctlConfiguration",
                "options": {
                    "runtime": "binary",
                    "bindAddress": "127.0.0.1",
                    "kubeApiserverPort": free_port(),
                    "kubeApiserverBinary": str(bin_dir / "kube-apiserver"),
                    "kubeControllerManagerBinary": str(bin_dir / "kube-controller-manager"),
                    "kubeSchedulerBinary": str(bin_dir / "kube-scheduler"),
                    "kwokControllerBinary": str(bin_dir / "kwok"),
                    "etcdBinary": str(bin_dir / "etcd"),
                    "kubectlBinary": str(bin_dir / "kubectl"),
                    "cacheDir": str(workdir / "cache"),
                },
                "componentsPatches": [
                    {"name": component, "extraArgs": [{"key": k, "value": v} for k, v in flags.items()]}
                    for component, flags in _with_defaults(component_args).items()
                ],
            }
        )
    )
    return config


# kwokctl picks the ports of etcd, kube-controller-manager and kwok itself; another cluster starting at
# the same moment can take one first ("bind: address already in use"), and a start on two saturated cores
# can miss kwokctl's wait. Both are the machine's, not the code under test: one more attempt from scratch.
# kwokctl's create can also succeed while its kwok controller lost the port race (a CI run's nodes then
# never became Ready), so an attempt includes the caller's check that the cluster is usable.
KWOK_CREATE_ATTEMPTS = 2


def _create_kwok_cluster(
    name: str,
    workdir: Path,
    env: dict[str, str],
    bin_dir: Path,
    component_args: ComponentArgs,
    *,
    usable: Callable[[], None] = lambda: None,
) -> None:
    """kwokctl's create and then `usable()` (raising ClusterError when not), retried from a clean slate."""
    kwokctl = str(bin_dir / "kwokctl")
    for attempt in range(1, KWOK_CREATE_ATTEMPTS + 1):
        config = _write_kwokctl_config(workdir, bin_dir, component_args)
        try:
            _run_step(
                "create the kwok cluster",
                [
                    kwokctl,
                    "--config",
                    str(config),
                    "create",
                    "cluster",
                    "--name",
                    name,
                    "--kubeconfig",
                    str(workdir / "user-kubeconfig.yaml"),
                    "--wait",
                    "3m",
                ],
                env,
                timeout=300,
            )
            usable()
            return
        except ClusterError as error:
            if attempt == KWOK_CREATE_ATTEMPTS:
                raise
            print(f"kwok cluster {name}: attempt {attempt} failed, retrying: {error}", file=sys.stderr)
            _delete_kwok_cluster(kwokctl, name, workdir, env)


def _delete_kwok_cluster(kwokctl: str, name: str, workdir: Path, env: dict[str, str]) -> None:
    """kwokctl's delete, then by pid whatever it did not stop (and the zombies of what it did)."""
    components = pids_in(workdir)
    with contextlib.suppress(Exception):
        subprocess.run(
            [
                kwokctl,
                "delete",
                "cluster",
                "--name",
                name,
                "--kubeconfig",
                str(workdir / "user-kubeconfig.yaml"),
            ],
            env=env,
            capture_output=True,
            timeout=120,
            check=False,
        )
    kill_and_reap(components)


@contextlib.contextmanager
def _kwok_cluster(name: str, nodes: int, component_args: ComponentArgs) -> Iterator[LocalCluster]:
    bin_dir = testbin_dir()
    workdir = Path(tempfile.mkdtemp(prefix="xpyd-kwok-"))
    env = dict(os.environ)
    env.update(
        KWOK_WORKDIR=str(workdir),
        PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}",  # kwokctl shells out to kubectl
    )
    cluster_dir = workdir / "clusters" / name
    kubeconfig = cluster_dir / "kubeconfig.yaml"
    cluster = LocalCluster(
        name=name,
        provider="kwok",
        kubeconfig=kubeconfig,
        bin_dir=bin_dir,
        logs_dir=cluster_dir / "logs",
        pids_dir=cluster_dir / "pids",
    )
    kwokctl = str(bin_dir / "kwokctl")
    become_subreaper()
    cluster.nodes = [f"kwok-node-{i}" for i in range(nodes)]
    cluster.pod_network = loopback_pod_network()
    manifests = [_fake_node_manifest(node, i, cluster.pod_network) for i, node in enumerate(cluster.nodes)]

    def nodes_ready() -> None:
        try:
            wait_until(kubeconfig.exists, 30, f"{kubeconfig} to be written")
        except TimeoutError as error:
            raise ClusterError(str(error)) from error
        cluster.kubectl(
            "apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": manifests})
        )
        cluster.kubectl("wait", "--for=condition=Ready", "node", "--all", "--timeout=120s", timeout=150)

    try:
        _create_kwok_cluster(name, workdir, env, bin_dir, component_args, usable=nodes_ready)
        yield cluster
    except BaseException:
        cluster.dump_logs()
        raise
    finally:
        _delete_kwok_cluster(kwokctl, name, workdir, env)
        shutil.rmtree(workdir, ignore_errors=True)


# What hack/kind detected about this host (XPYD_KIND_WORKAROUNDS) -> the kind config that works around it.
KIND_WORKAROUNDS = ("restrict-oom-score-adj", "kubelet-cgroup-v1", "static-cni")


def kind_config(node_image: str, workarounds: Sequence[str]) -> dict[str, object]:
    """The kind Cluster config: one node, plus each workaround hack/kind found needed (docs/kind.md).

    The offline node image (`node_image` set) holds no CoreDNS image and nothing here needs cluster DNS
    (clients get ClusterIPs), so kubeadm skips its CoreDNS addon there.
    """
    unknown = sorted(set(workarounds) - set(KIND_WORKAROUNDS))
    if unknown:
        raise ClusterError(f"XPYD_KIND_WORKAROUNDS has {unknown}; known: {', '.join(KIND_WORKAROUNDS)}")
    patches: list[str] = []
    if node_image:
        patches.append("kind: InitConfiguration\nskipPhases: [addon/coredns]\n")
    if "kubelet-cgroup-v1" in workarounds:  # kubelet >= 1.35 and kubeadm's preflight refuse cgroup v1
        patches.append("kind: KubeletConfiguration\nfailCgroupV1: false\n")
        patches.append(
            "kind: InitConfiguration\nnodeRegistration:\n  ignorePreflightErrors: [SystemVerification]\n"
        )
    config: dict[str, object] = {
        "kind": "Cluster",
        "apiVersion": "kind.x-k8s.io/v1alpha4",
        "nodes": [{"role": "control-plane", **({"image": node_image} if node_image else {})}],
        "networking": {"disableDefaultCNI": "static-cni" in workarounds},
        "kubeadmConfigPatches": patches,
    }
    if "restrict-oom-score-adj" in workarounds:  # runc may not lower oom_score_adj without CAP_SYS_RESOURCE
        config["containerdConfigPatches"] = [
            '[plugins."io.containerd.grpc.v1.cri"]\n  restrict_oom_score_adj = true\n'
        ]
    return config


@contextlib.contextmanager
def _kind_cluster(name: str) -> Iterator[LocalCluster]:
    """A one-node kind cluster from what `hack/kind run` prepared; deleted on exit, also on failure."""
    kind_bin = os.environ.get("XPYD_KIND_BIN")
    if not kind_bin:
        raise ClusterError(
            "XPYD_CLUSTER=kind runs under hack/kind, which prepares the engine and the images: "
            "`XPYD_CLUSTER=kind make test`, or `hack/kind run env XPYD_CLUSTER=kind .venv/bin/pytest e2e/test_kind.py`"
        )
    kind = str(Path(kind_bin) / "kind")
    env = {**os.environ, "PATH": f"{kind_bin}{os.pathsep}{os.environ.get('PATH', '')}"}
    name = f"xpyd-{os.environ.get('XPYD_KIND_RUN_ID', 'manual')}-{name.removeprefix('xpyd-')[:4]}"
    workarounds = [w for w in os.environ.get("XPYD_KIND_WORKAROUNDS", "").split(",") if w]
    config = kind_config(os.environ.get("XPYD_KIND_NODE_IMAGE", ""), workarounds)
    workdir = Path(tempfile.mkdtemp(prefix="xpyd-kind-"))
    (workdir / "kind.yaml").write_text(json.dumps(config))
    kubeconfig = workdir / "kubeconfig"  # never the user's ~/.kube/config
    cluster = LocalCluster(
        name=name, provider="kind", kubeconfig=kubeconfig, bin_dir=testbin_dir(), logs_dir=workdir / "logs"
    )
    try:
        _run_step(
            "create the kind cluster",
            [
                *(kind, "create", "cluster", "--name", name, "--config", str(workdir / "kind.yaml")),
                *("--kubeconfig", str(kubeconfig), "--wait", "5m", "--retain"),
            ],
            env,
            timeout=600,
        )
        images = os.environ.get("XPYD_KIND_IMAGES", "").split()
        if images:
            _run_step("load the images", [kind, "load", "docker-image", "--name", name, *images], env, 900)
        cluster.nodes = [f"{name}-control-plane"]
        yield cluster
    except BaseException:
        with contextlib.suppress(Exception):
            _run_step(
                "export kind logs", [kind, "export", "logs", str(workdir / "logs"), "--name", name], env, 120
            )
            for log in ("kubelet.log", "containerd.log"):
                found = next((workdir / "logs").rglob(log), None)
                if found is not None:
                    (workdir / "logs" / log).write_text(found.read_text(errors="replace"))
        cluster.dump_logs()
        raise
    finally:
        deleted = subprocess.run(
            [kind, "delete", "cluster", "--name", name, "--kubeconfig", str(kubeconfig)],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
            check=False,
        )
        shutil.rmtree(workdir, ignore_errors=True)
        clusters = subprocess.run(
            [kind, "get", "clusters"], capture_output=True, text=True, env=env, timeout=60, check=False
        )
        if name in clusters.stdout.split():
            raise ClusterError(f"kind cluster {name} is still there after `kind delete`: {deleted.stderr}")


def _existing_cluster() -> LocalCluster:
    kubeconfig = Path(os.environ.get("KUBECONFIG", str(Path.home() / ".kube" / "config")))
    bin_dir = testbin_dir()
    probe = LocalCluster(name="existing", provider="existing", kubeconfig=kubeconfig, bin_dir=bin_dir)
    context = probe.kubectl("config", "current-context").stdout.strip()
    if not any(marker in context for marker in TEST_CONTEXT_MARKERS):
        raise ClusterError(
            f"XPYD_CLUSTER=existing refuses context {context!r}: its name must contain one of "
            f"{', '.join(TEST_CONTEXT_MARKERS)} so tests never run against a real cluster by accident"
        )
    probe.name = context
    return probe
