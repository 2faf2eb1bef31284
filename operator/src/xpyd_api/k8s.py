"""The one raw Kubernetes client: raw JSON calls through the official client's ApiClient.

The operator uses it as it is; the controller's adapter (xpyd_controller.adapters.k8s) adds the calls only
the controller makes. The only I/O module of the shared contract (an import-linter contract says so).

Raw dicts rather than the client's model classes: the pure modules render and parse plain JSON, and this
way nothing is converted twice. Optimistic concurrency (resourceVersion, uid preconditions) guards
every change to an instance, so a stale view can never act twice.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from xpyd_api.names import (
    API_VERSION,
    COMPONENT_INSTANCE,
    COMPONENT_ROUTER,
    GROUP,
    KIND,
    LABEL_COMPONENT,
    LABEL_PDD,
    PLURAL,
    VERSION,
)

FIELD_MANAGER = "xpyd-operator"
REQUEST_TIMEOUT_SECONDS = 30
LIST_PAGE_SIZE = 100  # pods per list call


class KubeError(RuntimeError):
    """A Kubernetes API call failed; `status` is the HTTP status (0 when no answer)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.detail = _status_message(message)

    @property
    def rejected(self) -> bool:
        """The API server refused the request itself (4xx other than a conflict): retrying cannot help."""
        return 400 <= self.status < 500 and self.status != 409


def _status_message(body: str) -> str:
    """The `message` of a metav1.Status body (it names the object and the field), else the body."""
    try:
        parsed = json.loads(body)
    except ValueError:
        return body
    message = parsed.get("message") if isinstance(parsed, dict) else None
    return str(message) if message else body


@dataclass(frozen=True)
class ObjectRef:
    """What an Event is about."""

    name: str
    namespace: str
    uid: str


def finite(value: Any) -> Any:
    """`value` with every NaN or ±Inf float (at any depth) replaced by None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [finite(item) for item in value]
    return value


def connect() -> client.ApiClient:
    """An ApiClient from the in-cluster service account, or from KUBECONFIG outside a cluster."""
    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    return client.ApiClient()


class Kube:
    """Thin wrapper: one method per call the reconcile loop makes."""

    def __init__(self, api: client.ApiClient, component: str = FIELD_MANAGER) -> None:
        self._api = api
        self._component = component  # the Events' source (the controller reuses this class)

    def _call(
        self,
        method: str,
        path: str,
        body: Any = None,
        content_type: str = "application/json",
        query: list[tuple[str, str]] | None = None,
    ) -> Any:
        params = self._api.param_serialize(
            method=method,
            resource_path=path,
            query_params=query or [],
            header_params={"Content-Type": content_type, "Accept": "application/json"},
            body=body,
            auth_settings=["BearerToken"],
        )
        try:
            response = self._api.call_api(*params, _request_timeout=REQUEST_TIMEOUT_SECONDS)
            response.read()
        except ApiException as error:
            raise KubeError(error.status or 0, str(error.body or error.reason)) from None
        if response.status >= 400:
            raise KubeError(response.status, (response.data or b"").decode(errors="replace"))
        return json.loads(response.data) if response.data else None

    # --- instance pods -------------------------------------------------------------------------

    def list_instances(self, namespace: str, pdd: str) -> Iterable[dict[str, Any]]:
        """The PDDeployment's instance pods, LIST_PAGE_SIZE per call (one consistent snapshot through
        continue tokens). A pod decodes to ~25 KiB of dicts: 1024 pods listed whole took ~25 MiB per
        list and the allocator kept much of it, so the operator grew with the pool. A caller that keeps
        only what it parses holds one page of raw pods at a time."""
        selector = f"{LABEL_PDD}={pdd},{LABEL_COMPONENT}={COMPONENT_INSTANCE}"
        items, token = self._pod_page(namespace, selector, "")
        while True:
            yield from items
            if not token:
                return
            items = []  # let go of this page before the next one is decoded
            items, token = self._pod_page(namespace, selector, token)

    def _pod_page(self, namespace: str, selector: str, token: str) -> tuple[list[dict[str, Any]], str]:
        query = [("labelSelector", selector), ("limit", str(LIST_PAGE_SIZE))]
        if token:
            query.append(("continue", token))
        page = self._call("GET", f"/api/v1/namespaces/{namespace}/pods", query=query)
        items: list[dict[str, Any]] = page.get("items") or []
        return items, str((page.get("metadata") or {}).get("continue") or "")

    def list_router_pods(self, namespace: str, pdd: str) -> list[dict[str, Any]]:
        """The router Deployment's pods: one page (spec.router.replicas is at most 64)."""
        selector = f"{LABEL_PDD}={pdd},{LABEL_COMPONENT}={COMPONENT_ROUTER}"
        items, _ = self._pod_page(namespace, selector, "")
        return items

    def create(self, body: dict[str, Any]) -> bool:
        """Create a namespaced core/v1 object; False when it already exists (a retried create)."""
        namespace = body["metadata"]["namespace"]
        plural = {"Pod": "pods", "Service": "services"}[body["kind"]]
        try:
            self._call("POST", f"/api/v1/namespaces/{namespace}/{plural}", body)
        except KubeError as error:
            if error.status == 409:
                return False
            raise
        return True

    def delete_pod(self, namespace: str, name: str, uid: str) -> None:
        """Delete exactly that pod (uid precondition): a same-named successor is never hit."""
        body = {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": uid}}
        try:
            self._call("DELETE", f"/api/v1/namespaces/{namespace}/pods/{name}", body)
        except KubeError as error:
            if error.status not in (404, 409):
                raise

    def patch_pod(
        self,
        namespace: str,
        name: str,
        resource_version: str,
        labels: Mapping[str, str] | None = None,
        annotations: Mapping[str, str | None] | None = None,
    ) -> str | None:
        """Merge-patch labels/annotations (None removes one); 409 if the pod changed since it was read.
        Returns the pod's new resourceVersion (for a second guarded patch in the same pass)."""
        metadata: dict[str, Any] = {"resourceVersion": resource_version}
        if labels:
            metadata["labels"] = dict(labels)
        if annotations:
            metadata["annotations"] = dict(annotations)
        body = {"metadata": metadata}
        patched = self._call(
            "PATCH", f"/api/v1/namespaces/{namespace}/pods/{name}", body, "application/merge-patch+json"
        )
        version = ((patched or {}).get("metadata") or {}).get("resourceVersion")
        return str(version) if version else None

    # --- services, router, status, events -------------------------------------------------------

    def apply(self, body: dict[str, Any]) -> None:
        """Server-side apply of a Service or Deployment we own (creates it or fixes drift)."""
        namespace = body["metadata"]["namespace"]
        name = body["metadata"]["name"]
        prefix = "/apis/apps/v1" if body["kind"] == "Deployment" else "/api/v1"
        plural = "deployments" if body["kind"] == "Deployment" else "services"
        self._call(
            "PATCH",
            f"{prefix}/namespaces/{namespace}/{plural}/{name}",
            body,
            "application/apply-patch+yaml",
            query=[("fieldManager", FIELD_MANAGER), ("force", "true")],
        )

    def delete_router(self, namespace: str, name: str) -> None:
        """Remove the router Deployment and Service (after `spec.router.type` became none)."""
        for path in (
            f"/apis/apps/v1/namespaces/{namespace}/deployments/{name}",
            f"/api/v1/namespaces/{namespace}/services/{name}",
        ):
            self._delete_if_present(path)

    def _delete_if_present(self, path: str) -> None:
        try:
            self._call("DELETE", path)
        except KubeError as error:
            if error.status != 404:
                raise

    def router_ready_replicas(self, namespace: str, name: str) -> int:
        try:
            deployment = self._call("GET", f"/apis/apps/v1/namespaces/{namespace}/deployments/{name}")
        except KubeError as error:
            if error.status == 404:
                return 0
            raise
        return int((deployment.get("status") or {}).get("readyReplicas") or 0)

    def get_pdd(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The PDDeployment as stored now (None once it is gone): a quorum read, not a watch cache."""
        try:
            body: dict[str, Any] = self._call(
                "GET", f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}/{name}"
            )
        except KubeError as error:
            if error.status == 404:
                return None
            raise
        return body

    def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        """Merge-patch status; a non-finite number becomes null (JSON has no NaN: the API server would
        refuse the whole patch and leave the status stale)."""
        path = f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}/{name}/status"
        self._call("PATCH", path, {"status": finite(status)}, "application/merge-patch+json")

    def event(self, about: ObjectRef, reason: str, message: str, warning: bool = False) -> None:
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{about.name}.", "namespace": about.namespace},
            "involvedObject": {
                "apiVersion": API_VERSION,
                "kind": KIND,
                "name": about.name,
                "namespace": about.namespace,
                "uid": about.uid,
            },
            "reason": reason,
            "message": message,
            "type": "Warning" if warning else "Normal",
            "source": {"component": self._component},
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        self._call("POST", f"/api/v1/namespaces/{about.namespace}/events", body)
