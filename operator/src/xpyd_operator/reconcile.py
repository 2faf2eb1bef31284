"""The imperative shell around the pure plan: observe, plan, act, report. One call = one reconcile pass.

Every action is idempotent or guarded by a precondition (resourceVersion, uid), so a pass interrupted at
any point (crash, conflict, operator restart) is finished by the next pass and never done twice. An
object the API server refuses (a 4xx from a rendered Service, Deployment or Pod) stops only that object:
the rest of the pass goes on, and status says Degraded/ObjectRejected with the server's message.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from xpyd_api.engines import ROLE_SWITCH
from xpyd_api.instances import Instance, Step, Transition, TransitionKind, parse_instance
from xpyd_api.k8s import Kube, KubeError, ObjectRef
from xpyd_api.models import PDDeployment, PDDSpecError, RouterType, SwitchMethod, parse_pdd
from xpyd_api.names import (
    ANNOTATION_CONVERSIONS,
    ANNOTATION_TRANSITION,
    LABEL_SERVING,
    ConditionType,
    Reason,
    Role,
)
from xpyd_operator.adapters import engine_client
from xpyd_operator.adapters.engine_client import EngineLoad
from xpyd_operator.core import render
from xpyd_operator.core.actions import (
    Action,
    AdvanceTransition,
    BeginTransition,
    CancelTransition,
    CreateInstance,
    DeleteInstance,
    SwitchEngine,
    VerifyEngine,
)
from xpyd_operator.core.config import OperatorConfig
from xpyd_operator.core.scaling import PlanInput, plan, prefill_backlog_needed, roles_needing_load
from xpyd_operator.core.status import (
    StatusInput,
    autoscaling_problem,
    blocked_conditions,
    compute_status,
    router_label_problem,
)

log = logging.getLogger(__name__)


def _progressing(status: Mapping[str, Any]) -> bool:
    """Whether the status says Progressing=True: work remains, so the caller polls quickly."""
    return any(c["type"] == ConditionType.PROGRESSING and c["status"] == "True" for c in status["conditions"])


@dataclass
class Reconciler:
    kube: Kube
    config: OperatorConfig
    clock: Callable[[], float] = time.time
    # uid -> generation whose services and router were last applied (re-applied after a restart).
    _applied: dict[str, int] = field(default_factory=dict)
    # uid -> (generation, message) of the permanent error last reported (one Event per error).
    _reported_blocked: dict[str, tuple[int, str]] = field(default_factory=dict)
    # uid -> the unsupported-engine-flag message last posted as an Event (one Event per message).
    _reported_flags: dict[str, str] = field(default_factory=dict)
    # uid -> restarts in progress (mirrors status.pendingRestarts, read at the start of every pass).
    _pending: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    # uid -> (generation, message) of the rejected objects last reported (one Warning Event per change).
    _reported_rejected: dict[str, tuple[int, str]] = field(default_factory=dict)

    def reconcile(self, body: Mapping[str, Any]) -> bool:
        """One pass; returns True while work is in progress (the caller then polls quickly)."""
        pdd = self._admit(body)
        if pdd is None:
            return False
        rejected = self._apply_owned(pdd)
        self._pending[pdd.uid] = list((body.get("status") or {}).get("pendingRestarts") or [])
        self._resume_restarts(pdd)
        instances = self._observe_records(pdd, body)
        if instances is None:
            return False
        hashes = {role: render.template_hash(pdd.spec, role) for role in Role}
        actions = self._plan(pdd, instances, hashes)
        rejected += self._act(pdd, actions)
        if actions:
            instances = self._observe(pdd)
        status = self._status(pdd, body, instances, hashes, sorted(set(rejected)))
        self._write_status(pdd, body, status)
        self._report_unsupported_flags(pdd, status)
        self._report_rejected(pdd, sorted(set(rejected)))
        return bool(actions) or _progressing(status)

    def _admit(self, body: Mapping[str, Any]) -> PDDeployment | None:
        """The parsed object if this operator reconciles it; None after reporting why not (a spec it
        cannot use, or an excluded namespace), which only a person can fix."""
        try:
            pdd = parse_pdd(dict(body))
        except PDDSpecError as error:
            self._report_blocked(body, Reason.INVALID_SPEC, str(error))
            return None
        if pdd.namespace in self.config.excluded_namespaces:
            message = f"namespace {pdd.namespace} is excluded from this operator (XPYD_EXCLUDED_NAMESPACES)"
            self._report_blocked(body, Reason.NAMESPACE_EXCLUDED, message)
            return None
        return pdd

    def _observe_records(self, pdd: PDDeployment, body: Mapping[str, Any]) -> list[Instance] | None:
        """The instances, or None after reporting a corrupt record on a pod: guessing its step could
        repeat a step."""
        try:
            return self._observe(pdd)
        except ValueError as error:
            self._report_blocked(body, Reason.INVALID_RECORD, str(error))
            return None

    def _plan(self, pdd: PDDeployment, instances: list[Instance], hashes: Mapping[Role, str]) -> list[Action]:
        """The pure plan's actions for this pass, from the instances and the loads and router pools it
        needs read."""
        loads = self._read_loads(pdd, instances)
        return plan(
            PlanInput(
                pdd.name,
                pdd.spec,
                instances,
                hashes,
                {name: load.in_flight for name, load in loads.items()},
                self.clock(),
                self.config.max_creates_per_pass,
                {name: load.finished for name, load in loads.items()},
                self._router_listed(pdd, instances),
            )
        )

    def _act(self, pdd: PDDeployment, actions: list[Action]) -> list[str]:
        """Executes the actions in order; returns what the API server refused. A refused object or a
        conflict (our view was stale: the next pass sees more) stops only its action; any other error
        ends the pass."""
        rejected = []
        for action in actions:
            try:
                self._execute(pdd, action)
            except KubeError as error:
                if error.rejected:
                    rejected.append(error.detail)
                elif error.status == 409:
                    log.info("conflict on %s; retrying next pass", action)
                else:
                    raise
        return rejected

    def _status(
        self,
        pdd: PDDeployment,
        body: Mapping[str, Any],
        instances: list[Instance],
        hashes: Mapping[Role, str],
        rejected: list[str],
    ) -> dict[str, Any]:
        """The operator's `.status` from what this pass observed, keeping the previous conditions' times."""
        return compute_status(
            StatusInput(
                generation=pdd.generation,
                spec=pdd.spec,
                instances=instances,
                template_hashes=hashes,
                router_ready_replicas=self.kube.router_ready_replicas(pdd.namespace, f"{pdd.name}-router"),
                previous_conditions=(body.get("status") or {}).get("conditions") or [],
                now=self.clock(),
                rejected=rejected,
                autoscaling_problem=autoscaling_problem(pdd.spec, body.get("status") or {}, pdd.generation),
            )
        )

    def reconcile_latest(self, cached: Mapping[str, Any]) -> bool:
        """One pass on the object as the API server has it now, not as the watch last delivered it.

        After an apiserver or etcd outage a watch can lag for a long time (61 s was measured) while
        reconcile passes keep running; reading the object first bounds acting on a stale spec to one
        pass interval. A 404 means it is gone: nothing to do (Kopf's deletion handling follows).
        """
        metadata = cached.get("metadata") or {}
        fresh = self.kube.get_pdd(metadata.get("namespace", ""), metadata.get("name", ""))
        if fresh is None:
            return False
        if (fresh.get("metadata") or {}).get("uid") != metadata.get("uid"):
            return False  # deleted and recreated under the same name: its own daemon serves it
        return self.reconcile(fresh)

    def forget(self, uid: str) -> None:
        self._applied.pop(uid, None)
        self._pending.pop(uid, None)
        self._reported_blocked.pop(uid, None)
        self._reported_flags.pop(uid, None)
        self._reported_rejected.pop(uid, None)

    # --- observe ---------------------------------------------------------------------------------

    def _observe(self, pdd: PDDeployment) -> list[Instance]:
        pods = self.kube.list_instances(pdd.namespace, pdd.name)
        return [i for i in (parse_instance(p) for p in pods) if i is not None]

    def _router_listed(self, pdd: PDDeployment, instances: list[Instance]) -> frozenset[str] | None:
        """Behind a router: the pod IPs any router replica lists in its pools (GET /workers on each router
        pod), so a drain sees the router drop its instance rather than assume it, and one beginning
        knows whether the router had added it. None when there is nothing to read or not every running
        replica answered."""
        if pdd.spec.router.type is RouterType.NONE or not instances or not self.config.probe_pod_ip:
            return None
        listed: set[str] = set()
        pods = self.kube.list_router_pods(pdd.namespace, pdd.name)
        running = [
            pod
            for pod in pods
            if (pod.get("status") or {}).get("phase") == "Running"
            and not pod["metadata"].get("deletionTimestamp")
        ]
        for pod in running:
            pod_ip = (pod.get("status") or {}).get("podIP")
            if not pod_ip:
                return None
            url = f"http://{pod_ip}:{pdd.spec.router.port}"
            hosts = engine_client.router_worker_hosts(
                url, pdd.spec.engine.port, self.config.engine_timeout_seconds
            )
            if hosts is None:
                return None
            listed |= hosts
        return frozenset(listed) if running else None

    def _read_loads(self, pdd: PDDeployment, instances: list[Instance]) -> dict[str, EngineLoad]:
        """Loads of draining instances, of scale-in candidates, and of every prefill instance while a
        decode instance drains behind vllm-router (nothing else is read). Prefill instances are read
        first: a decode part sent right after their last prefill is then already counted at decode."""
        crowded = roles_needing_load(pdd.spec, instances)
        backlog = prefill_backlog_needed(pdd.spec, instances)
        wanted = [
            i
            for i in instances
            if (i.transition and i.transition.step is Step.DRAINING)
            or (i.ready and i.transition is None and i.effective_role in crowded)
            or (backlog and i.role is Role.PREFILL and not i.deleting)
        ]
        loads: dict[str, EngineLoad] = {}
        for instance in sorted(wanted, key=lambda i: i.role is not Role.PREFILL):
            url = engine_client.metrics_url(
                instance, pdd.spec.engine.type, pdd.spec.engine.port, self.config.probe_pod_ip
            )
            timeout = self.config.engine_timeout_seconds
            loads[instance.name] = (
                engine_client.read_load(url, pdd.spec.engine.type, timeout) if url else EngineLoad(None, None)
            )
        return loads

    # --- act -------------------------------------------------------------------------------------

    def _apply_owned(self, pdd: PDDeployment) -> list[str]:
        """Apply the Services and the router; returns what the API server refused (retried next pass)."""
        if self._applied.get(pdd.uid) == pdd.generation:
            return []
        if problem := router_label_problem(pdd.spec):  # once per generation, like the apply itself
            self._event(pdd, Reason.ROUTER_IGNORES_LABELS, problem, warning=True)
        deployment = render.router_deployment(pdd)
        service = render.router_service(pdd)
        owned = [render.role_service(pdd, role) for role in Role]
        rejected = []
        if deployment and (refusal := self._router_account_refusal(pdd)):
            rejected.append(refusal)
        elif deployment:
            owned.append(deployment)
        if service:
            owned.append(service)
        rejected += self._apply_each(owned)
        if not (deployment and service):
            self.kube.delete_router(pdd.namespace, f"{pdd.name}-router")
        if not rejected:
            self._applied[pdd.uid] = pdd.generation
        return rejected

    def _router_account_refusal(self, pdd: PDDeployment) -> str | None:
        """Why the router Deployment is not applied: the router keeps its API token, so it runs only as
        an account XPYD_ROUTER_SERVICE_ACCOUNTS lists; None if its account is allowed or unset."""
        account = pdd.spec.router.service_account_name
        if not account or account in self.config.router_service_accounts:
            return None
        allowed = ", ".join(self.config.router_service_accounts) or "none configured"
        return (
            f"spec.router.serviceAccountName={account!r} is not a router account this operator allows "
            f"({allowed}); the router Deployment is not applied"
        )

    def _apply_each(self, owned: list[dict[str, Any]]) -> list[str]:
        """Applies each object; returns the API server's refusals, so one refused object does not keep
        the others from being applied. Any other error ends the pass."""
        rejected = []
        for body in owned:
            try:
                self.kube.apply(body)
            except KubeError as error:
                if not error.rejected:
                    raise
                rejected.append(error.detail)
        return rejected

    def _event(self, pdd: PDDeployment, reason: str, message: str, warning: bool = False) -> None:
        try:
            self.kube.event(ObjectRef(pdd.name, pdd.namespace, pdd.uid), reason, message, warning)
        except KubeError as error:  # an Event is a report, never a reason to stop reconciling
            log.warning("could not post event %s: %s", reason, error)

    def _execute(self, pdd: PDDeployment, action: Action) -> None:
        ns = pdd.namespace
        match action:
            case CreateInstance(role=role, name=name, reason=why):
                if self.kube.create(render.instance_pod(pdd, role, name)):
                    self._event(pdd, Reason.CREATED, f"created {role} instance {name} ({why})")
            case DeleteInstance(instance=instance, reason=why):
                self.kube.delete_pod(ns, instance.name, instance.uid)
                self._event(pdd, Reason.DELETED, f"deleted {instance.role} instance {instance.name} ({why})")
            case BeginTransition(instance=instance, transition=transition, reason=why):
                self.kube.patch_pod(
                    ns,
                    instance.name,
                    instance.resource_version,
                    labels={LABEL_SERVING: "false"},
                    annotations={ANNOTATION_TRANSITION: transition.to_json()},
                )
                self._event(
                    pdd, Reason.DRAINING, f"draining {instance.role} instance {instance.name} ({why})"
                )
            case AdvanceTransition(instance=instance, transition=transition):
                annotations = {ANNOTATION_TRANSITION: transition.to_json()}
                self.kube.patch_pod(ns, instance.name, instance.resource_version, annotations=annotations)
                if instance.transition is None or instance.transition.step is not transition.step:
                    self._event(
                        pdd,
                        Reason.CONVERSION_STEP,
                        f"{instance.name}: {transition.step} (drain {transition.drain_result})",
                    )
            case CancelTransition(instance=instance):
                self.kube.patch_pod(
                    ns,
                    instance.name,
                    instance.resource_version,
                    labels={LABEL_SERVING: "true"},
                    annotations={ANNOTATION_TRANSITION: None},
                )
                self._event(pdd, Reason.CONVERSION_STEP, f"{instance.name}: needed again, back in service")
            case SwitchEngine(instance=instance, target=target, method=method):
                self._switch(pdd, instance, target, method)
            case VerifyEngine(instance=instance, target=target, method=method):
                if self._verified(pdd, instance, target, method):
                    self._finish_conversion(pdd, instance, target)

    def _switch(self, pdd: PDDeployment, instance: Instance, target: Role, method: SwitchMethod) -> None:
        assert instance.transition is not None
        verifying = instance.transition.advance(Step.VERIFYING, self.clock())
        if method is SwitchMethod.RESTART:
            self._restart_as(pdd, instance, target, verifying.to_json())
            return
        if method is SwitchMethod.IN_PLACE:
            self._relabel_in_place(pdd, instance, target, verifying)
            return
        version = instance.resource_version
        if method is SwitchMethod.HTTP:
            sent = self._switch_http(pdd, instance, target)
            if sent is None:
                return
            version = sent
        annotations = {ANNOTATION_TRANSITION: verifying.to_json()}
        self.kube.patch_pod(pdd.namespace, instance.name, version, annotations=annotations)

    def _relabel_in_place(
        self, pdd: PDDeployment, instance: Instance, target: Role, verifying: Transition
    ) -> None:
        """The in-place switch: one patch of the role labels and the record, while serving=false. The
        engine's liveness probe then fails (its role file no longer names the role it started with) and
        the kubelet restarts the container with env from the new labels; the record keeps the restart
        count seen now, which the patch's resourceVersion pins, so Verifying waits for a later restart."""
        record = dataclasses.replace(verifying, restarts_before=instance.restarts)
        self.kube.patch_pod(
            pdd.namespace,
            instance.name,
            instance.resource_version,
            labels=render.role_labels(pdd.spec, target),
            annotations={ANNOTATION_TRANSITION: record.to_json()},
        )

    def _switch_http(self, pdd: PDDeployment, instance: Instance, target: Role) -> str | None:
        """POST the switch at most once per need: the intent is recorded on the pod first, and a
        recorded intent (a crash after or during the call) is checked against the engine's reported
        role before the call is repeated. Returns the pod's resourceVersion once the engine has (or is
        asked for) the role; None to try again next pass."""
        transition = instance.transition
        assert transition is not None
        base = engine_client.base_url(instance, pdd.spec.engine.port, self.config.probe_pod_ip)
        if base is None:
            self._event(pdd, Reason.SWITCH_FAILED, f"{instance.name} has no reachable engine URL", True)
            return None
        timeout = self.config.engine_timeout_seconds
        if transition.switch_sent is not None:
            reported = engine_client.reported_role(f"{base}{ROLE_SWITCH.report_path}", timeout)
            if reported == str(target):
                log.info("%s already reports %s: the earlier switch call took effect", instance.name, target)
                return instance.resource_version
            if reported is None:
                return None  # cannot tell whether the call arrived: ask again next pass, never resend blind
        intent = dataclasses.replace(transition, switch_sent=self.clock())
        version = self.kube.patch_pod(
            pdd.namespace,
            instance.name,
            instance.resource_version,
            annotations={ANNOTATION_TRANSITION: intent.to_json()},
        )
        settings = self._decode_graph_settings(pdd) if target is Role.DECODE else {}
        try:
            engine_client.switch_role(base + pdd.spec.conversion.switch_path, target, timeout, settings)
        except engine_client.EngineError as error:
            self._event(pdd, Reason.SWITCH_FAILED, f"{instance.name}: {error}", warning=True)
            return None
        return version or instance.resource_version

    def _decode_graph_settings(self, pdd: PDDeployment) -> dict[str, Any]:
        """The decode graph settings a serving decode peer reports (what its switch to decode reserved),
        as SGLang's own role-switch test does; empty without such a peer (the engine then says why)."""
        for peer in self._observe(pdd):
            if peer.role is not Role.DECODE or not (peer.ready and peer.serving) or peer.transition:
                continue
            base = engine_client.base_url(peer, pdd.spec.engine.port, self.config.probe_pod_ip)
            if base is None:
                continue
            settings = engine_client.decode_graph_settings(
                f"{base}{ROLE_SWITCH.report_path}", self.config.engine_timeout_seconds
            )
            if settings:
                return settings
        return {}

    def _restart_as(self, pdd: PDDeployment, instance: Instance, target: Role, record: str) -> None:
        """Recreate the instance with the same name on the same node, rendered for its new role.

        The pod (and the record on it) disappears in between, so the intent is first written to
        `status.pendingRestarts`; a pass that finds an entry there finishes it (see _resume_restarts).
        """
        entry = {
            "pod": instance.name,
            "uid": instance.uid,
            "node": instance.node or "",
            "to": str(target),
            "record": record,
            "conversions": instance.conversions,
        }
        pending = self._pending.setdefault(pdd.uid, [])
        pending.append(entry)
        self.kube.patch_status(pdd.namespace, pdd.name, {"pendingRestarts": pending})
        self._resume_restarts(pdd)

    def _resume_restarts(self, pdd: PDDeployment) -> None:
        """Finish restarts in progress: delete the old pod, wait until it is gone, create the new one."""
        pending = self._pending.get(pdd.uid) or []
        if not pending:
            return
        remaining = []
        for entry in pending:
            if not self._restart_one(pdd, entry):
                remaining.append(entry)
        self._pending[pdd.uid] = remaining
        self.kube.patch_status(pdd.namespace, pdd.name, {"pendingRestarts": remaining})

    def _restart_one(self, pdd: PDDeployment, entry: dict[str, Any]) -> bool:
        """True once the replacement pod exists; False to try again next pass."""
        self.kube.delete_pod(pdd.namespace, entry["pod"], entry["uid"])
        deadline = self.clock() + self.config.restart_wait_seconds
        while True:
            current = next((i for i in self._observe(pdd) if i.name == entry["pod"]), None)
            if current is not None and current.uid != entry["uid"]:
                return True  # created by an earlier pass
            if current is None:
                break
            if self.clock() > deadline:
                return False  # still terminating
            time.sleep(0.2)
        pod = render.instance_pod(
            pdd,
            Role(entry["to"]),
            entry["pod"],
            serving=False,
            node=entry["node"] or None,
            transition=entry["record"],
        )
        pod["metadata"].setdefault("annotations", {})[ANNOTATION_CONVERSIONS] = str(entry["conversions"])
        self.kube.create(pod)
        return True

    def _verified(self, pdd: PDDeployment, instance: Instance, target: Role, method: SwitchMethod) -> bool:
        if not instance.ready:
            return False
        if method is SwitchMethod.IN_PLACE:
            before = instance.transition.restarts_before if instance.transition else None
            return before is None or instance.restarts > before
        if method is not SwitchMethod.HTTP:
            return True
        base = engine_client.base_url(instance, pdd.spec.engine.port, self.config.probe_pod_ip)
        reported = engine_client.reported_role(
            f"{base}{ROLE_SWITCH.report_path}", self.config.engine_timeout_seconds
        )
        if reported != str(target):
            log.info("%s reports role %r, waiting for %s", instance.name, reported, target)
        return reported == str(target)

    def _finish_conversion(self, pdd: PDDeployment, instance: Instance, target: Role) -> None:
        """Relabel, resume serving, clear the record and count the conversion: one atomic patch."""
        transition = instance.transition
        assert transition is not None and transition.kind is TransitionKind.CONVERT
        self.kube.patch_pod(
            pdd.namespace,
            instance.name,
            instance.resource_version,
            labels={**render.role_labels(pdd.spec, target), LABEL_SERVING: "true"},
            annotations={ANNOTATION_TRANSITION: None, ANNOTATION_CONVERSIONS: str(instance.conversions + 1)},
        )
        took = self.clock() - transition.started
        self._event(
            pdd,
            Reason.CONVERTED,
            f"converted {instance.name} {transition.source}->{target} in {took:.1f}s "
            f"(drain {transition.drain_result})",
        )

    # --- report ----------------------------------------------------------------------------------

    def _write_status(self, pdd: PDDeployment, body: Mapping[str, Any], status: dict[str, Any]) -> None:
        current = body.get("status") or {}
        if all(current.get(key) == value for key, value in status.items()):
            return
        self.kube.patch_status(pdd.namespace, pdd.name, status)

    def _report_unsupported_flags(self, pdd: PDDeployment, status: dict[str, Any]) -> None:
        """One Warning Event per distinct message when the engine image rejects a flag xpyd renders."""
        for condition in status["conditions"]:
            if condition["reason"] != Reason.ENGINE_FLAG_UNSUPPORTED:
                continue
            if self._reported_flags.get(pdd.uid) != condition["message"]:
                self._event(pdd, Reason.ENGINE_FLAG_UNSUPPORTED, condition["message"], warning=True)
                self._reported_flags[pdd.uid] = condition["message"]

    def _report_rejected(self, pdd: PDDeployment, rejected: list[str]) -> None:
        """One Warning Event per new set of refused objects (not one per pass)."""
        if not rejected:
            self._reported_rejected.pop(pdd.uid, None)
            return
        message = "; ".join(rejected)
        if self._reported_rejected.get(pdd.uid) != (pdd.generation, message):
            self._event(pdd, Reason.OBJECT_REJECTED, message, warning=True)
            self._reported_rejected[pdd.uid] = (pdd.generation, message)

    def _report_blocked(self, body: Mapping[str, Any], reason: str, message: str) -> None:
        metadata = body.get("metadata") or {}
        name, namespace, uid = (
            metadata.get("name", ""),
            metadata.get("namespace", ""),
            metadata.get("uid", ""),
        )
        generation = int(metadata.get("generation") or 0)
        previous = (body.get("status") or {}).get("conditions") or []
        conditions = blocked_conditions(reason, message, generation, self.clock(), previous)
        self.kube.patch_status(namespace, name, {"observedGeneration": generation, "conditions": conditions})
        if self._reported_blocked.get(uid) != (generation, message):
            self.kube.event(ObjectRef(name, namespace, uid), reason, message, warning=True)
            self._reported_blocked[uid] = (generation, message)
