"""The controller's Kubernetes adapter: the operator's raw-JSON `Kube` client plus the calls only the
controller makes (list PDDeployments in its namespaces, merge-patch replicas, the leader Lease).

Replicas and status go through JSON merge patches naming only the controller's fields, so the operator's
status fields and everything else in the spec are left as they are.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from kubernetes import client, config

from xpyd_api.models import PDDeployment
from xpyd_api.names import GROUP, PLURAL, VERSION
from xpyd_controller.control.lease import LeaseRecord, lease_spec, parse_lease
from xpyd_operator.k8s import Kube, KubeError, ObjectRef

COMPONENT = "xpyd-controller"
MERGE_PATCH = "application/merge-patch+json"
LEASES = "/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"


def connect(kubeconfig: str | None = None) -> client.ApiClient:
    """In-cluster service account when running in a pod, else the given (or default) kubeconfig.

    Raises ValueError naming where it looked when neither gives credentials.
    """
    if kubeconfig is None:
        try:
            config.load_incluster_config()
            return client.ApiClient()
        except config.ConfigException:
            pass
    try:
        config.load_kube_config(config_file=kubeconfig)
    except (config.ConfigException, OSError) as error:
        where = kubeconfig or "the in-cluster service account and $KUBECONFIG (~/.kube/config)"
        raise ValueError(f"no Kubernetes credentials in {where}: {error}") from None
    return client.ApiClient()


class ControllerCluster(Kube):
    """`ClusterPort` and `LeasePort` over one ApiClient; `namespaces` empty means all namespaces."""

    def __init__(self, api: client.ApiClient, namespaces: Sequence[str] = ()) -> None:
        super().__init__(api, component=COMPONENT)
        self.namespaces = tuple(namespaces)

    def list_pdds(self) -> list[dict[str, Any]]:
        paths = [f"/apis/{GROUP}/{VERSION}/namespaces/{ns}/{PLURAL}" for ns in self.namespaces] or [
            f"/apis/{GROUP}/{VERSION}/{PLURAL}"
        ]
        items: list[dict[str, Any]] = []
        for path in paths:
            items.extend(self._call("GET", path).get("items", []))
        return items

    def patch_replicas(self, namespace: str, name: str, prefill: int, decode: int) -> None:
        body = {"spec": {"prefill": {"replicas": prefill}, "decode": {"replicas": decode}}}
        self._call(
            "PATCH", f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}/{name}", body, MERGE_PATCH
        )

    def post_event(self, pdd: PDDeployment, reason: str, message: str, warning: bool = False) -> None:
        self.event(ObjectRef(pdd.name, pdd.namespace, pdd.uid), reason, message, warning)

    # --- the leader Lease ------------------------------------------------------------------------

    def read_lease(self, namespace: str, name: str) -> LeaseRecord | None:
        try:
            return parse_lease(self._call("GET", f"{LEASES.format(namespace=namespace)}/{name}"))
        except KubeError as error:
            if error.status == 404:
                return None
            raise

    def create_lease(self, namespace: str, name: str, record: LeaseRecord) -> bool:
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": name, "namespace": namespace},
            "spec": lease_spec(record),
        }
        return self._won(lambda: self._call("POST", LEASES.format(namespace=namespace), body))

    def update_lease(self, namespace: str, name: str, record: LeaseRecord) -> bool:
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": name, "namespace": namespace, "resourceVersion": record.resource_version},
            "spec": lease_spec(record),
        }
        return self._won(lambda: self._call("PUT", f"{LEASES.format(namespace=namespace)}/{name}", body))

    @staticmethod
    def _won(write: Callable[[], object]) -> bool:
        """True when the write went through; False when another candidate wrote first (409)."""
        try:
            write()
        except KubeError as error:
            if error.status == 409:
                return False
            raise
        return True
