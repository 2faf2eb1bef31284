"""The reconcile shell with an in-memory stand-in for the Kubernetes adapter: error mapping and idempotence."""

from __future__ import annotations

import json
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler
from typing import Any, ClassVar

import pytest
from e2e.harness.loopback import loopback_server

from xpyd_api import k8s
from xpyd_api.k8s import Kube, KubeError, ObjectRef
from xpyd_operator.core.config import OperatorConfig
from xpyd_operator.reconcile import Reconciler
from xpyd_operator.testing import EngineStub


class MemoryKube(Kube):
    """Records calls; pods live in a dict. `conflict_on_patch` makes every pod patch a 409."""

    def __init__(self, conflict_on_patch: bool = False) -> None:
        self.pods: dict[str, dict[str, Any]] = {}
        self.applied: list[str] = []
        self.statuses: list[dict[str, Any]] = []
        self.status: dict[str, Any] = {}  # merged, as the API server keeps it
        self.events: list[tuple[str, str]] = []
        self.conflict_on_patch = conflict_on_patch

    def list_instances(self, namespace: str, pdd: str) -> list[dict[str, Any]]:
        return list(self.pods.values())

    def list_router_pods(self, namespace: str, pdd: str) -> list[dict[str, Any]]:
        return []

    def create(self, body: dict[str, Any]) -> bool:
        name = body["metadata"]["name"]
        if name in self.pods:
            return False
        body["metadata"].update(uid=f"uid-{name}", resourceVersion="1")
        self.pods[name] = body
        return True

    def delete_pod(self, namespace: str, name: str, uid: str) -> None:
        self.pods.pop(name, None)

    def patch_pod(
        self,
        namespace: str,
        name: str,
        resource_version: str,
        labels: Mapping[str, str] | None = None,
        annotations: Mapping[str, str | None] | None = None,
    ) -> str | None:
        if self.conflict_on_patch:
            raise KubeError(409, "the object has been modified")
        metadata = self.pods[name]["metadata"]
        metadata["labels"].update(labels or {})
        notes = metadata.setdefault("annotations", {})
        for key, value in (annotations or {}).items():
            if value is None:
                notes.pop(key, None)
            else:
                notes[key] = value
        return None

    def apply(self, body: dict[str, Any]) -> None:
        self.applied.append(f"{body['kind']}/{body['metadata']['name']}")

    def delete_router(self, namespace: str, name: str) -> None:
        pass

    def router_ready_replicas(self, namespace: str, name: str) -> int:
        return 1

    def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        self.statuses.append(status)
        self.status.update(status)

    def event(self, about: ObjectRef, reason: str, message: str, warning: bool = False) -> None:
        self.events.append((reason, message))


def body(generation: int = 1, **spec: Any) -> dict[str, Any]:
    raw: dict[str, Any] = {"model": {"name": "m"}, "engine": {"image": "i"}, "router": {"image": "r"}, **spec}
    return {"metadata": {"name": "p", "namespace": "ns", "uid": "u", "generation": generation}, "spec": raw}


def ready(kube: MemoryKube) -> None:
    for pod in kube.pods.values():
        pod["status"] = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}


def test_first_pass_creates_instances_and_owned_objects_once() -> None:
    kube = MemoryKube()
    reconciler = Reconciler(kube, OperatorConfig(), clock=lambda: 100.0)
    assert reconciler.reconcile(body()) is True  # work in progress
    assert sorted(kube.pods) == ["p-0", "p-1"]
    assert [r for r, _ in kube.events] == ["Created", "Created"]
    assert sorted(kube.applied) == [
        "Deployment/p-router",
        "Service/p-decode",
        "Service/p-prefill",
        "Service/p-router",
    ]
    ready(kube)
    assert reconciler.reconcile(body()) is False  # settled: nothing to do, nothing re-applied
    assert len(kube.applied) == 4 and len(kube.events) == 2
    assert kube.statuses[-1]["prefill"]["summary"] == "1/1"


def test_new_generation_reapplies_owned_objects() -> None:
    kube = MemoryKube()
    reconciler = Reconciler(kube, OperatorConfig(), clock=lambda: 100.0)
    reconciler.reconcile(body())
    reconciler.reconcile(body(generation=2))
    assert len(kube.applied) == 8


def test_invalid_spec_is_a_permanent_error_reported_once_per_generation() -> None:
    kube = MemoryKube()
    reconciler = Reconciler(kube, OperatorConfig(), clock=lambda: 100.0)
    bad = body(prefill={"replicas": 9, "maxReplicas": 2})
    assert reconciler.reconcile(bad) is False
    assert reconciler.reconcile(bad) is False
    assert not kube.pods
    assert [r for r, _ in kube.events] == ["InvalidSpec"]
    assert "spec.prefill.replicas=9" in kube.events[0][1]
    reasons = {c["type"]: c["reason"] for c in kube.statuses[-1]["conditions"]}
    assert reasons == {"Ready": "InvalidSpec", "Degraded": "InvalidSpec"}


def test_conflicts_are_left_to_the_next_pass_other_errors_propagate() -> None:
    kube = MemoryKube()
    reconciler = Reconciler(kube, OperatorConfig(), clock=lambda: 100.0)
    reconciler.reconcile(body())
    ready(kube)
    kube.conflict_on_patch = True
    # a conversion starts with a pod patch: the 409 is swallowed, nothing is half-done
    assert reconciler.reconcile(body(prefill={"replicas": 2}, decode={"replicas": 0})) is True
    assert not [r for r, _ in kube.events if r == "Draining"]

    class Broken(MemoryKube):
        def list_instances(self, namespace: str, pdd: str) -> list[dict[str, Any]]:
            raise KubeError(500, "etcd unavailable")

    with pytest.raises(KubeError, match="500"):
        Reconciler(Broken(), OperatorConfig()).reconcile(body())


class CrashOnRecreate(MemoryKube):
    """Dies (like a killed operator) right after deleting a pod for a Restart switch, before recreating it."""

    crash = True

    def create(self, body: dict[str, Any]) -> bool:
        if self.crash and body["metadata"].get("annotations"):
            raise RuntimeError("operator killed")
        return super().create(body)


def test_restart_switch_survives_a_crash_between_delete_and_create() -> None:
    kube = CrashOnRecreate()
    now = [100.0]
    custom = {
        "engine": {"image": "i", "type": "custom", "command": ["serve"]},
        "conversion": {"drainTimeoutSeconds": 5},
    }
    start = body(prefill={"replicas": 1}, decode={"replicas": 2}, **custom)
    reconciler = Reconciler(kube, OperatorConfig(), clock=lambda: now[0])
    reconciler.reconcile(start)
    ready(kube)
    for pod in kube.pods.values():
        pod["spec"]["nodeName"] = "node-7"
    converting = body(generation=2, prefill={"replicas": 2}, decode={"replicas": 1}, **custom)
    reconciler.reconcile(converting)  # Draining (no engine data: waits for the timeout)
    now[0] += 6
    reconciler.reconcile(converting)  # drain timed out: Switching
    with pytest.raises(RuntimeError, match="killed"):
        reconciler.reconcile(converting)  # Restart: pod deleted, operator dies before the create
    name = kube.status["pendingRestarts"][0]["pod"]
    assert name not in kube.pods

    kube.crash = False
    restarted = Reconciler(kube, OperatorConfig(), clock=lambda: now[0])  # a fresh operator process
    restarted.reconcile({**converting, "status": kube.status})
    pod = kube.pods[name]
    assert pod["spec"]["nodeName"] == "node-7"
    assert pod["metadata"]["labels"]["xpyd.dev/role"] == "prefill"
    assert kube.status["pendingRestarts"] == []
    ready(kube)
    restarted.reconcile({**converting, "status": kube.status})  # Verifying -> relabel
    assert pod["metadata"]["annotations"]["xpyd.dev/conversions"] == "1"
    assert sorted(p["metadata"]["labels"]["xpyd.dev/role"] for p in kube.pods.values()) == [
        "decode",
        "prefill",
        "prefill",
    ]
    assert [m for r, m in kube.events if r == "Converted"] and len(kube.pods) == 3


class PatchLog(MemoryKube):
    """Keeps every pod patch: (pod, labels, the record's step)."""

    def __init__(self) -> None:
        super().__init__()
        self.patches: list[tuple[str, dict[str, str], str | None]] = []

    def patch_pod(
        self,
        namespace: str,
        name: str,
        resource_version: str,
        labels: Mapping[str, str] | None = None,
        annotations: Mapping[str, str | None] | None = None,
    ) -> str | None:
        record = (annotations or {}).get("xpyd.dev/transition")
        self.patches.append((name, dict(labels or {}), json.loads(record)["step"] if record else None))
        return super().patch_pod(namespace, name, resource_version, labels, annotations)


def test_in_place_switch_is_one_relabel_then_waits_for_the_container_restart() -> None:
    kube = PatchLog()
    now = [100.0]
    in_place = {"engine": {"image": "vllm:0.40.0"}, "conversion": {"drainTimeoutSeconds": 5}}
    reconciler = Reconciler(kube, OperatorConfig(), clock=lambda: now[0])
    reconciler.reconcile(body(prefill={"replicas": 1}, decode={"replicas": 2}, **in_place))
    ready(kube)
    uids = {name: pod["metadata"]["uid"] for name, pod in kube.pods.items()}
    converting = body(generation=2, prefill={"replicas": 2}, decode={"replicas": 1}, **in_place)
    reconciler.reconcile(converting)  # Draining (no engine data: waits for the timeout)
    name = next(n for n, _, step in kube.patches if step == "Draining")
    assert kube.pods[name]["metadata"]["labels"]["xpyd.dev/kv-role"] == "kv_consumer"
    now[0] += 6
    reconciler.reconcile(converting)  # drain timed out: Switching
    kube.patches.clear()
    reconciler.reconcile(converting)  # the switch: one patch of both role labels and the record
    relabel = {"xpyd.dev/role": "prefill", "xpyd.dev/kv-role": "kv_producer"}
    assert kube.patches == [(name, relabel, "Verifying")]
    labels = kube.pods[name]["metadata"]["labels"]
    assert labels["xpyd.dev/serving"] == "false" and labels["xpyd.dev/role"] == "prefill"
    record = json.loads(kube.pods[name]["metadata"]["annotations"]["xpyd.dev/transition"])
    assert record["restartsBefore"] == 0
    kube.patches.clear()
    reconciler.reconcile(converting)  # Ready, but its container has not restarted yet: no traffic
    assert kube.patches == [] and labels["xpyd.dev/serving"] == "false"
    status = kube.pods[name]["status"]
    status["containerStatuses"] = [{"name": "engine", "restartCount": 1, "ready": False}]
    status["conditions"] = [{"type": "Ready", "status": "False"}]
    reconciler.reconcile(converting)  # restarted, not Ready yet
    assert labels["xpyd.dev/serving"] == "false"
    status["conditions"] = [{"type": "Ready", "status": "True"}]
    reconciler.reconcile(converting)  # restarted in its new role and Ready: back in service
    assert labels["xpyd.dev/serving"] == "true" and labels["xpyd.dev/kv-role"] == "kv_producer"
    assert kube.pods[name]["metadata"]["annotations"]["xpyd.dev/conversions"] == "1"
    assert {n: p["metadata"]["uid"] for n, p in kube.pods.items()} == uids  # no pod deleted or created
    assert [m for r, m in kube.events if r == "Converted"]


def test_corrupt_record_blocks_with_a_condition_instead_of_guessing() -> None:
    kube = MemoryKube()
    reconciler = Reconciler(kube, OperatorConfig(), clock=lambda: 100.0)
    reconciler.reconcile(body())
    kube.pods["p-1"]["metadata"]["annotations"] = {"xpyd.dev/transition": "{not json"}
    assert reconciler.reconcile(body()) is False
    assert reconciler.reconcile(body()) is False
    warnings = [m for r, m in kube.events if r == "InvalidRecord"]
    assert len(warnings) == 1 and "xpyd.dev/transition" in warnings[0]
    assert {c["reason"] for c in kube.statuses[-1]["conditions"]} == {"InvalidRecord"}


def test_an_engine_image_without_a_rendered_flag_is_degraded_with_one_event() -> None:
    """An old SGLang image exits on --enable-pd-role-switch: the condition and one Event name the flag."""
    kube = MemoryKube()
    reconciler = Reconciler(kube, OperatorConfig(), clock=lambda: 100.0)
    sglang = body(engine={"image": "sglang:old", "type": "sglang"})
    reconciler.reconcile(sglang)
    exit_message = "launch_server: error: unrecognized arguments: --enable-pd-role-switch\n"
    for pod in kube.pods.values():
        terminated = {"exitCode": 2, "message": exit_message}
        pod["status"] = {
            "phase": "Running",
            "containerStatuses": [
                {
                    "name": "engine",
                    "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                    "lastState": {"terminated": terminated},
                }
            ],
        }
    reconciler.reconcile(sglang)
    reconciler.reconcile(sglang)
    degraded = next(c for c in kube.status["conditions"] if c["type"] == "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "EngineFlagUnsupported")
    assert "sglang:old does not accept --enable-pd-role-switch" in degraded["message"]
    assert "switchMethod HTTP" in degraded["message"]
    assert [r for r, _ in kube.events].count("EngineFlagUnsupported") == 1
    assert sorted(kube.pods) == ["p-0", "p-1"]  # reported, not replaced over and over


def test_a_router_that_ignores_labels_is_warned_about_once_per_generation() -> None:
    kube = MemoryKube()
    reconciler = Reconciler(kube, OperatorConfig(), clock=lambda: 100.0)
    sglang = {"type": "sglang-router", "image": "s:1"}
    reconciler.reconcile(body(router=sglang))
    reconciler.reconcile(body(router=sglang))
    warned = [m for r, m in kube.events if r == "RouterIgnoresLabels"]
    assert len(warned) == 1 and "sglang-router 0.3.2 (measured)" in warned[0]
    reconciler.reconcile(body(generation=2, router=sglang))
    assert len([r for r, _ in kube.events if r == "RouterIgnoresLabels"]) == 2


class RejectsDecodePods(MemoryKube):
    """The API server refuses every decode pod (say, an env name it does not accept) with a 422."""

    def create(self, body: dict[str, Any]) -> bool:
        if body["metadata"]["labels"]["xpyd.dev/role"] == "decode":
            message = f'Pod "{body["metadata"]["name"]}" is invalid: spec.containers[0].env[1].name: Invalid'
            raise KubeError(422, json.dumps({"kind": "Status", "message": message}))
        return super().create(body)


def test_a_refused_object_degrades_with_one_event_while_the_rest_of_the_pass_goes_on() -> None:
    kube = RejectsDecodePods()
    reconciler = Reconciler(kube, OperatorConfig(), clock=lambda: 100.0)
    for _ in range(3):
        reconciler.reconcile({**body(generation=4), "status": kube.status})
        ready(kube)
    assert sorted(kube.pods) == ["p-0"]  # the prefill instance was created (and is kept healthy)
    assert len(kube.applied) == 4  # Services and router applied despite the refusal
    conditions = {c["type"]: c for c in kube.status["conditions"]}
    assert conditions["Degraded"]["status"] == "True" and conditions["Degraded"]["reason"] == "ObjectRejected"
    assert "spec.containers[0].env[1].name" in conditions["Degraded"]["message"]
    assert conditions["Ready"]["status"] == "False" and conditions["Ready"]["observedGeneration"] == 4
    assert [r for r, _ in kube.events].count("ObjectRejected") == 1
    del kube.pods["p-0"]  # self-healing goes on for the healthy sibling
    reconciler.reconcile({**body(generation=4), "status": kube.status})
    assert "p-0" in kube.pods or "p-1" in kube.pods


def test_a_refused_service_is_retried_and_reported_but_pods_still_come() -> None:
    class RejectsService(MemoryKube):
        def apply(self, body: dict[str, Any]) -> None:
            if body["metadata"]["name"] == "p-prefill":
                raise KubeError(422, json.dumps({"message": 'Service "p-prefill" is invalid: spec.ports'}))
            super().apply(body)

    kube = RejectsService()
    reconciler = Reconciler(kube, OperatorConfig(), clock=lambda: 100.0)
    reconciler.reconcile(body())
    reconciler.reconcile({**body(), "status": kube.status})
    assert sorted(kube.pods) == ["p-0", "p-1"]
    assert kube.applied.count("Service/p-decode") == 2  # not marked applied: tried again next pass
    degraded = next(c for c in kube.status["conditions"] if c["type"] == "Degraded")
    assert degraded["reason"] == "ObjectRejected" and 'Service "p-prefill"' in degraded["message"]
    assert [r for r, _ in kube.events].count("ObjectRejected") == 1


def test_a_router_account_outside_the_allow_list_is_refused_and_the_rest_applied() -> None:
    kube = MemoryKube()
    reconciler = Reconciler(kube, OperatorConfig(router_service_accounts=("xpyd-router",)), clock=lambda: 1.0)
    reconciler.reconcile(body(router={"image": "r", "serviceAccountName": "cluster-admin-sa"}))
    assert "Deployment/p-router" not in kube.applied and "Service/p-prefill" in kube.applied
    assert sorted(kube.pods) == ["p-0", "p-1"]
    degraded = next(c for c in kube.status["conditions"] if c["type"] == "Degraded")
    assert "spec.router.serviceAccountName='cluster-admin-sa'" in degraded["message"]
    allowed = MemoryKube()
    Reconciler(allowed, OperatorConfig(router_service_accounts=("xpyd-router",))).reconcile(
        body(router={"image": "r", "serviceAccountName": "xpyd-router"})
    )
    assert "Deployment/p-router" in allowed.applied


def test_an_excluded_namespace_gets_no_pods() -> None:
    kube = MemoryKube()
    pdd = body()
    pdd["metadata"]["namespace"] = "kube-system"
    assert Reconciler(kube, OperatorConfig()).reconcile(pdd) is False
    assert not kube.pods and not kube.applied
    assert [r for r, _ in kube.events] == ["NamespaceExcluded"]


class CrashAfterSwitchCall(MemoryKube):
    """Dies (like a killed operator) right after the switch POST, before recording the Verifying step."""

    crash = True

    def patch_pod(
        self,
        namespace: str,
        name: str,
        resource_version: str,
        labels: Mapping[str, str] | None = None,
        annotations: Mapping[str, str | None] | None = None,
    ) -> str | None:
        record = (annotations or {}).get("xpyd.dev/transition") or ""
        if self.crash and '"step":"Verifying"' in record:
            raise RuntimeError("operator killed")
        return super().patch_pod(namespace, name, resource_version, labels, annotations)


def test_http_switch_is_sent_once_across_an_operator_crash_mid_call() -> None:
    kube = CrashAfterSwitchCall()
    now = [100.0]
    sglang = {"engine": {"image": "i", "type": "sglang"}, "conversion": {"drainTimeoutSeconds": 5}}
    config = OperatorConfig(probe_pod_ip=False)
    with EngineStub() as stub:
        reconciler = Reconciler(kube, config, clock=lambda: now[0])
        reconciler.reconcile(body(prefill={"replicas": 1}, decode={"replicas": 2}, **sglang))
        ready(kube)
        for name, pod in kube.pods.items():
            pod["metadata"].setdefault("annotations", {})["xpyd.dev/engine-url"] = stub.url(name)
            stub.roles[name] = pod["metadata"]["labels"]["xpyd.dev/role"]
        converting = body(generation=2, prefill={"replicas": 2}, decode={"replicas": 1}, **sglang)
        reconciler.reconcile(converting)  # Draining
        now[0] += 6
        reconciler.reconcile(converting)  # drain timed out: Switching
        with pytest.raises(RuntimeError, match="killed"):
            reconciler.reconcile(converting)  # intent recorded, POST sent, operator dies
        assert len(stub.switch_calls) == 1
        kube.crash = False
        restarted = Reconciler(kube, config, clock=lambda: now[0])  # a fresh operator process
        restarted.reconcile({**converting, "status": kube.status})  # asks the engine, does not resend
        restarted.reconcile({**converting, "status": kube.status})  # Verifying -> relabel
        assert len(stub.switch_calls) == 1
        assert [m for r, m in kube.events if r == "Converted"]


def test_a_pass_acts_on_the_stored_object_not_on_a_stale_watch_copy() -> None:
    class Stored(MemoryKube):
        stored: dict[str, Any] | None = None

        def get_pdd(self, namespace: str, name: str) -> dict[str, Any] | None:
            return self.stored

    kube = Stored()
    reconciler = Reconciler(kube, OperatorConfig(), clock=lambda: 1.0)
    kube.stored = body(generation=2, prefill={"replicas": 3})
    reconciler.reconcile_latest(body(generation=1))  # the watch still shows generation 1
    assert len(kube.pods) == 4 and kube.status["observedGeneration"] == 2
    kube.stored = None  # deleted meanwhile: nothing is done
    assert reconciler.reconcile_latest(body(generation=1)) is False and len(kube.pods) == 4


def test_instances_are_listed_page_by_page_through_continue_tokens() -> None:
    """A pass never decodes a whole large pool at once: each call asks for one page, the next page
    resumes the same snapshot from its continue token, and every pod arrives exactly once."""

    class PagedKube(Kube):
        def __init__(self, pods: int) -> None:
            self.names = [f"p-{n}" for n in range(pods)]
            self.queries: list[dict[str, str]] = []

        def _call(self, method: str, path: str, *_: Any, query: Any = None, **__: Any) -> Any:
            asked = dict(query)
            self.queries.append(asked)
            start = int(asked.get("continue", "0"))
            end = start + int(asked["limit"])
            more = {"continue": str(end)} if end < len(self.names) else {}
            return {"metadata": more, "items": [{"metadata": {"name": n}} for n in self.names[start:end]]}

    size = k8s.LIST_PAGE_SIZE
    kube = PagedKube(2 * size + 1)
    listed = [pod["metadata"]["name"] for pod in kube.list_instances("ns", "v")]
    assert listed == kube.names
    assert [q.get("continue") for q in kube.queries] == [None, str(size), str(2 * size)]
    assert {q["labelSelector"] for q in kube.queries} == {"xpyd.dev/pdd=v,xpyd.dev/component=instance"}


class _Router(BaseHTTPRequestHandler):
    """A router's GET /workers (vllm-router 0.1.17's shape) listing the hosts in `listed`."""

    listed: ClassVar[set[str]] = set()

    def do_GET(self) -> None:
        workers = [{"url": f"http://{host}:8000", "worker_type": "decode"} for host in sorted(self.listed)]
        payload = json.dumps({"workers": workers}).encode()
        self.send_response(200)
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args: Any) -> None:
        pass


def test_a_drain_waits_for_the_routers_pools_to_drop_the_instance() -> None:
    """Read from each running router pod's GET /workers: listed, the drain waits however long it has
    been; dropped (after being listed when the drain began), it goes on at once."""
    now = [100.0]
    with EngineStub() as stub, loopback_server(_Router) as address:
        host, port = address.rsplit(":", 1)
        kube = MemoryKube()
        router_pod = {"metadata": {"name": "p-router-x"}, "status": {"phase": "Running", "podIP": host}}
        kube.list_router_pods = lambda namespace, pdd: [router_pod]  # type: ignore[method-assign]
        reconciler = Reconciler(kube, OperatorConfig(probe_pod_ip=True), clock=lambda: now[0])
        router = {"image": "r", "port": int(port)}
        reconciler.reconcile(body(router=router))
        ready(kube)
        for index, (name, pod) in enumerate(sorted(kube.pods.items())):
            pod["status"]["podIP"] = f"10.0.0.{index}"
            pod["metadata"].setdefault("annotations", {})["xpyd.dev/engine-url"] = stub.url(name)
        _Router.listed = {"10.0.0.0", "10.0.0.1"}
        shrunk = body(generation=2, router=router, decode={"replicas": 0})
        reconciler.reconcile(shrunk)  # p-1 (decode) begins to drain
        record = json.loads(kube.pods["p-1"]["metadata"]["annotations"]["xpyd.dev/transition"])
        assert record["step"] == "Draining" and record["routerListed"] is True
        now[0] += 20
        reconciler.reconcile(shrunk)
        assert "p-1" in kube.pods, "deleted while the router still listed it"
        _Router.listed = {"10.0.0.0"}
        reconciler.reconcile(shrunk)  # dropped: the prefill backlog (none) is recorded
        reconciler.reconcile(shrunk)  # idle: deleted
        assert "p-1" not in kube.pods
