"""The controller's Kubernetes adapter: the operator's raw-JSON `Kube` client plus the calls only the
controller makes (list PDDeployments in its namespaces, merge-patch replicas, the leader Lease, and the
token and access reviews that decide who may read its /metrics).

Replicas and status go through JSON merge patches naming only the controller's fields, so the operator's
status fields and everything else in the spec are left as they are.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from kubernetes import client, config

from xpyd_api.k8s import Kube, KubeError, ObjectRef
from xpyd_api.models import PDDeployment
from xpyd_api.names import GROUP, PLURAL, VERSION
from xpyd_controller.control.lease import LeaseRecord, lease_spec, parse_lease

COMPONENT = "xpyd-controller"
WATCH_SECONDS = 60  # the server ends each watch after this; the scope is then relisted
WATCH_RETRY_SECONDS = 2.0
logger = logging.getLogger(__name__)
MERGE_PATCH = "application/merge-patch+json"
LEASES = "/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
TOKEN_REVIEWS = "/apis/authentication.k8s.io/v1/tokenreviews"
ACCESS_REVIEWS = "/apis/authorization.k8s.io/v1/subjectaccessreviews"
ACCESS_CACHE_SECONDS = 10.0  # how long one token's answer is reused (a scrape every few seconds)
ACCESS_CACHE_ENTRIES = 1024  # tokens remembered at most (older answers are dropped first)


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
    """`ClusterPort` and `LeasePort` over one ApiClient; `namespaces` empty means all namespaces.

    `watch` keeps the PDDeployments in scope in memory (list, then watch from that resourceVersion,
    relisting when a watch ends or fails), so a pass reads memory instead of listing every tick; until
    every scope has been listed once, `list_pdds` asks the API server directly.
    """

    def __init__(self, api: client.ApiClient, namespaces: Sequence[str] = ()) -> None:
        super().__init__(api, component=COMPONENT)
        self.namespaces = tuple(namespaces)
        self.paths = [f"/apis/{GROUP}/{VERSION}/namespaces/{ns}/{PLURAL}" for ns in self.namespaces] or [
            f"/apis/{GROUP}/{VERSION}/{PLURAL}"
        ]
        self._cache: dict[str, dict[str, dict[str, Any]]] = {}  # path → uid → object
        self._lock = threading.Lock()

    def list_pdds(self) -> list[dict[str, Any]]:
        with self._lock:
            if len(self._cache) == len(self.paths):
                return [body for objects in self._cache.values() for body in objects.values()]
        return [item for path in self.paths for item in self._call("GET", path).get("items", [])]

    def watch(self, stop: threading.Event) -> list[threading.Thread]:
        """Start one daemon thread per scope that keeps the cache current until `stop` is set."""
        threads = [
            threading.Thread(target=self._watch_scope, args=(path, stop), name=f"watch {path}", daemon=True)
            for path in self.paths
        ]
        for thread in threads:
            thread.start()
        return threads

    def _watch_scope(self, path: str, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                listing = self._call("GET", path)
                with self._lock:
                    self._cache[path] = {item["metadata"]["uid"]: item for item in listing.get("items", [])}
                self._follow(path, listing["metadata"]["resourceVersion"], stop)
            except Exception:  # the API server went away or the watch broke: relist after a pause
                logger.warning("watch of %s failed; relisting", path, exc_info=True)
                stop.wait(WATCH_RETRY_SECONDS)

    def _follow(self, path: str, resource_version: str, stop: threading.Event) -> None:
        """Apply watch events until the server ends the watch (timeout, or an expired version)."""
        query = [
            ("watch", "true"),
            ("resourceVersion", resource_version),
            ("timeoutSeconds", str(WATCH_SECONDS)),
        ]
        params = self._api.param_serialize(
            method="GET",
            resource_path=path,
            query_params=query,
            header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"],
        )
        response = self._api.call_api(*params, _request_timeout=(10, WATCH_SECONDS + 15))
        if response.status >= 400:
            raise KubeError(response.status, (response.read() or b"").decode(errors="replace"))
        for line in response.response:
            if stop.is_set():
                return
            if not line.strip():
                continue
            event = json.loads(line)
            if event.get("type") == "ERROR":
                return  # e.g. 410 Gone: the version is too old, relist
            with self._lock:
                apply_event(self._cache.setdefault(path, {}), event["type"], event["object"])

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

    # --- who may read /metrics -------------------------------------------------------------------

    def review_token(self, token: str) -> dict[str, Any] | None:
        """The user the API server authenticates `token` as (TokenReview), or None."""
        review = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}}
        status = self._call("POST", TOKEN_REVIEWS, review).get("status") or {}
        user = status.get("user")
        return user if status.get("authenticated") and isinstance(user, dict) else None

    def may_get(self, user: dict[str, Any], path: str) -> bool:
        """`user` may `get` the non-resource URL `path` (SubjectAccessReview)."""
        spec = {
            "user": user.get("username", ""),
            "uid": user.get("uid", ""),
            "groups": user.get("groups") or [],
            "extra": user.get("extra") or {},
            "nonResourceAttributes": {"path": path, "verb": "get"},
        }
        review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec}
        return bool((self._call("POST", ACCESS_REVIEWS, review).get("status") or {}).get("allowed"))

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


def apply_event(objects: dict[str, dict[str, Any]], kind: str, body: dict[str, Any]) -> None:
    """One watch event on a uid → object map."""
    uid = body["metadata"]["uid"]
    if kind == "DELETED":
        objects.pop(uid, None)
    elif kind in ("ADDED", "MODIFIED"):
        objects[uid] = body


class MetricsAccess:
    """Who may read the controller's /metrics, decided as controller-runtime's
    WithAuthenticationAndAuthorization filter and kube-rbac-proxy do: the request's bearer token must be
    one the API server authenticates (TokenReview), and its user must be allowed `get` on the
    non-resource URL (SubjectAccessReview; e.g. a ClusterRole with nonResourceURLs ["/metrics"]). The
    answer for a token is reused for ACCESS_CACHE_SECONDS, so a scrape costs two reviews per window."""

    def __init__(
        self, cluster: ControllerCluster, path: str = "/metrics", clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.cluster = cluster
        self.path = path
        self._clock = clock
        self._answers: dict[str, tuple[int, float]] = {}  # sha256(token) → (HTTP status, valid until)
        self._lock = threading.Lock()

    def status(self, authorization: str | None) -> int:
        """The HTTP status for a request with this Authorization header: 200 (may read), 401 (no bearer
        token, or one the API server does not authenticate), 403 (authenticated, not allowed) or 503
        (the API server did not answer; not remembered)."""
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return 401
        key = hashlib.sha256(token.strip().encode()).hexdigest()
        now = self._clock()
        with self._lock:
            known = self._answers.get(key)
        if known is not None and known[1] > now:
            return known[0]
        try:
            user = self.cluster.review_token(token.strip())
            code = 401 if user is None else 200 if self.cluster.may_get(user, self.path) else 403
        except KubeError as error:
            logger.warning("cannot review a /metrics request's token: %s", error)
            return 503
        with self._lock:
            self._answers = {k: v for k, v in self._answers.items() if v[1] > now}
            if len(self._answers) >= ACCESS_CACHE_ENTRIES:
                self._answers.clear()
            self._answers[key] = (code, now + ACCESS_CACHE_SECONDS)
        return code
