"""Specs the controller cannot act on, on the real local cluster: each is said where the tenant looks, in
the PDDeployment's Degraded condition (written by the operator from the controller's status.autoscaler)
and in one InvalidAutoscaling Warning from the controller, naming what is wrong.

The controller loop runs in this process with its real Kubernetes and Prometheus adapters; only the name
resolver is this test's, since no name on this machine resolves to a cloud metadata address (a name that
does is exactly what a tenant's DNS can arrange).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import pytest
from e2e.harness.cluster import LocalCluster
from e2e.harness.procs import wait_until
from tests.integration.pdd import OperatorFactory, apply, events, get_json, manifest

from xpyd_controller.adapters.k8s import ControllerCluster, connect
from xpyd_controller.adapters.telemetry import PrometheusTelemetry
from xpyd_controller.control.loop import Controller, Settings
from xpyd_controller.controller import PrometheusSources

pytestmark = [pytest.mark.cluster, pytest.mark.usefixtures("pdd_crd")]

# What the tenant's names resolve to: one leads to the cloud metadata service, the other somewhere ordinary.
RESOLVED = {"prometheus.tenant.example": ["169.254.169.254"], "prometheus.monitoring.svc": ["10.0.0.9"]}


def resolve(host: str) -> Sequence[str]:
    return RESOLVED.get(host, [])


CASES = [
    (
        "http://prometheus.tenant.example:9090",
        {"name": "m", "preset": "llama-3.1-8b"},
        "spec.autoscaling.prometheus.url: 'http://prometheus.tenant.example:9090': host "
        "prometheus.tenant.example resolves to 169.254.169.254, a cloud metadata service",
    ),
    (
        "http://prometheus.monitoring.svc:9090",
        {"name": "m", "preset": "gpt-9"},
        "spec.model.preset = 'gpt-9': unknown preset; known: ",
    ),
]


@pytest.mark.parametrize("case", CASES, ids=["resolves-to-metadata", "unknown-preset"])
def test_a_spec_the_controller_cannot_act_on_degrades_its_deployment_with_the_reason(
    kube_cluster: LocalCluster,
    namespace: str,
    start_operator: OperatorFactory,
    case: tuple[str, dict[str, Any], str],
) -> None:
    url, model, reason = case
    start_operator()
    body = manifest(
        "tenant",
        model=model,
        autoscaling={"mode": "Auto", "intervalSeconds": 1, "prometheus": {"url": url}},
    )
    apply(kube_cluster, namespace, body)
    applied = time.monotonic()
    cluster = ControllerCluster(connect(str(kube_cluster.kubeconfig)), [namespace])
    loop = Controller(cluster, PrometheusSources(resolve), PrometheusTelemetry(), Settings(window_s=30))

    def said() -> bool:
        loop.run_pass(time.time())
        autoscaler = (get_json(kube_cluster, "pdd", "tenant", "-n", namespace).get("status") or {}).get(
            "autoscaler"
        ) or {}
        return autoscaler.get("binding") == "invalid_setup" and reason in autoscaler.get("message", "")

    wait_until(said, 30, "status.autoscaler to say why the controller cannot act")

    def degraded() -> dict[str, Any]:
        pdd = get_json(kube_cluster, "pdd", "tenant", "-n", namespace)
        conditions = (pdd.get("status") or {}).get("conditions") or []
        return next((c for c in conditions if c["type"] == "Degraded"), {})

    wait_until(lambda: degraded().get("reason") == "InvalidAutoscaling", 30, "Degraded=InvalidAutoscaling")
    condition = degraded()
    assert condition["status"] == "True" and reason in condition["message"], condition
    print(
        f"\nDegraded=InvalidAutoscaling {time.monotonic() - applied:.1f} s after the apply: {condition['message']}"
    )
    for _ in range(3):  # more passes: one Warning, and no replica written
        loop.run_pass(time.time() + 2)
    warnings = events(kube_cluster, namespace, "InvalidAutoscaling")
    assert len(warnings) == 1 and reason in warnings[0], warnings
    spec = get_json(kube_cluster, "pdd", "tenant", "-n", namespace)["spec"]
    assert (spec["prefill"]["replicas"], spec["decode"]["replicas"]) == (1, 1)
