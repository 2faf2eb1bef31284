"""Schema, model, rendering and the controller agree: random specs drawn from the CRD's own schema go to
the real API server; every one it accepts must parse in the pydantic model AND render Services, a router
Deployment and instance Pods that the API server accepts too (server-side dry-run, strict field
validation); and when it asks for autoscaling (Advisory or Auto), the controller's loop (its real URL
checks, policy set-up and decision, with in-memory Kubernetes and Prometheus) must decide for it or say
why it cannot (status.autoscaler `invalid_setup` with the reason, which the operator shows as
Degraded=InvalidAutoscaling).

A mismatch is a spec a tenant could apply that the operator or the controller then cannot serve, or
serves silently wrong (the operator would fail on it, the API server would refuse what the operator
renders, a decision would fail without a word). The test fails on any, listing them.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import pytest
from e2e.harness.cluster import LocalCluster
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kubernetes import client, config
from tests.integration.pdd import spec_schema
from tests.unit.test_controller_loop import BUSY, FakeCluster, FakeMetrics, FakeTelemetry

from xpyd_api.models import AutoscalingMode, PDDSpecError, parse_pdd
from xpyd_api.names import BINDING_INVALID_SETUP, Role
from xpyd_controller.control.loop import Controller, Settings
from xpyd_operator.core import render

pytestmark = [pytest.mark.cluster, pytest.mark.usefixtures("pdd_crd")]

EXAMPLES = 1000
# Accepted specs needed for the run to say anything about the model: a floor against a generator that
# stops producing valid specs (a schema change), not a share to hit. The derandomized run has read
# 224 (7cf917d), then 197 and more than 200 on the same tree on one day, unseeded runs 180-303.
MIN_ACCEPTED = 150
# Of those, specs in Advisory or Auto the controller's loop must take (the derandomized run: 48, 23 decided,
# 25 refused with the reason); a floor for the same purpose.
MIN_AUTOSCALED = 15
SMALL = 2  # most items / properties one generated list or map gets (keeps requests small and fast)
# Keys of maps (resources, nodeSelector, matchLabels), some valid for each map and some not; the schema's
# CEL rules decide, the generator only offers.
MAP_KEYS = [
    "cpu",
    "memory",
    "ephemeral-storage",
    "example.com/widget",
    "nvidia.com/gpu",
    "app",
    "topology.kubernetes.io/zone",
    "bad key!",
    "a/b/c",
    "-x",
]


def _string(node: dict[str, Any]) -> st.SearchStrategy[str]:
    longest = node.get("maxLength", 64)
    shortest = node.get("minLength", 0)
    if "pattern" in node:
        base = st.from_regex(re.compile(node["pattern"]), fullmatch=True)
    else:
        base = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=24)
    return base.filter(lambda s: shortest <= len(s) <= longest)


def _number(node: dict[str, Any], integer: bool) -> st.SearchStrategy[Any]:
    low = node.get("minimum")
    high = node.get("maximum")
    if integer:
        return st.integers(
            min_value=int(low) if low is not None else -(2**40),
            max_value=int(high) if high is not None else 2**40,
        )
    return st.floats(
        min_value=low,
        max_value=high if high is not None else 1e300,
        exclude_min=bool(node.get("exclusiveMinimum")),
        allow_nan=False,
        allow_infinity=False,
    )


def from_schema(node: dict[str, Any]) -> st.SearchStrategy[Any]:
    """Values valid for one structural-schema node (types, enums, bounds, patterns; not CEL rules)."""
    if "enum" in node:
        return st.sampled_from(node["enum"])
    kind = node.get("type")
    if kind == "string":
        return _string(node)
    if kind in ("integer", "number"):
        return _number(node, kind == "integer")
    if kind == "boolean":
        return st.booleans()
    if kind == "array":
        most = min(node.get("maxItems", SMALL), SMALL)
        return st.lists(from_schema(node["items"]), min_size=node.get("minItems", 0), max_size=most)
    if kind == "object":
        properties = node.get("properties") or {}
        if "additionalProperties" in node:
            keys = st.one_of(st.sampled_from(MAP_KEYS), st.text("abcXY019._-/ ", min_size=1, max_size=12))
            most = min(node.get("maxProperties", SMALL), SMALL)
            return st.dictionaries(keys, from_schema(node["additionalProperties"]), max_size=most)
        required = set(node.get("required") or ())
        return st.fixed_dictionaries(
            {name: from_schema(child) for name, child in properties.items() if name in required},
            optional={name: from_schema(child) for name, child in properties.items() if name not in required},
        )
    raise AssertionError(f"schema node without a generator: {node}")


SPEC_SCHEMA = spec_schema()
SPEC_STRATEGY = from_schema(SPEC_SCHEMA)
SCHEDULING = ("gpusPerInstance", "resources", "nodeSelector", "tolerations")


def _fix_cross_field_rules(draw: st.DrawFn, spec: dict[str, Any]) -> None:
    """Each CEL rule that spans fields is made to hold with probability 7/8, so the accepted share is
    large enough to say something while every rule is still seen broken too."""

    def often() -> bool:
        return draw(st.integers(0, 7)) > 0

    for role in ("prefill", "decode"):
        pool = spec.get(role)
        if isinstance(pool, dict) and often():
            counts = sorted(
                pool.get(k, d) for k, d in (("minReplicas", 0), ("replicas", 1), ("maxReplicas", 64))
            )
            pool["minReplicas"], pool["replicas"], pool["maxReplicas"] = counts
    if often():  # conversion needs scheduling-compatible roles
        prefill, decode = spec.setdefault("prefill", {}), spec.setdefault("decode", {})
        for key in SCHEDULING:
            if key in prefill:
                decode[key] = prefill[key]
            else:
                decode.pop(key, None)
        prefill.pop("affinity", None)
        decode.pop("affinity", None)
    router = spec.setdefault("router", {})
    if often() and not router.get("image"):
        router["image"] = "router:1"
    model = spec["model"]
    if often() and ("kvLatentDim" in model) != ("ropeDim" in model):
        model.pop("kvLatentDim", None)
        model.pop("ropeDim", None)
    engine = spec["engine"]
    if often() and engine.get("type") == "custom" and not engine.get("command"):
        engine["command"] = ["serve"]
    conversion = spec.get("conversion")
    if often() and isinstance(conversion, dict) and conversion.get("switchMethod") == "Routing":
        engine.pop("version", None)  # Routing renders kv_both: only a version that takes it, or none
    if draw(st.booleans()):  # half the specs ask the controller too (drawn, few would)
        spec.setdefault("autoscaling", {})["mode"] = draw(st.sampled_from(["Advisory", "Auto"]))
    autoscaling = spec.get("autoscaling")
    if isinstance(autoscaling, dict) and often() and "prometheus" not in autoscaling:
        autoscaling["prometheus"] = {"url": "http://prometheus.monitoring.svc:9090"}
    elif isinstance(autoscaling, dict) and "prometheus" in autoscaling and draw(st.booleans()):
        autoscaling["prometheus"]["url"] = (
            "http://prometheus.monitoring.svc:9090"  # drawn ones: mostly refused
        )
    if isinstance(autoscaling, dict) and often() and "preset" not in model:  # autoscaling needs a model
        model["preset"] = "llama-3.1-8b"
    for holder in (spec, spec.get("prefill") or {}, spec.get("decode") or {}):
        if often():  # random affinity trees mostly break an operator rule: keep a few
            holder.pop("affinity", None)
    slo = spec.get("slo")
    if isinstance(slo, dict) and often():
        for key in ("ttftSeconds", "tpotSeconds"):
            if key in slo and slo[key] <= 0:
                slo[key] = 0.5
        slo.pop("transferBudgetSeconds", None)
        if "attainment" in slo and not 0 < slo["attainment"] <= 1:
            slo["attainment"] = 0.9


@st.composite
def pdd_bodies(draw: st.DrawFn) -> dict[str, Any]:
    """A PDDeployment whose spec is drawn from the CRD schema (cross-field rules mostly made to hold)."""
    spec = draw(SPEC_STRATEGY)
    _fix_cross_field_rules(draw, spec)
    name = draw(st.from_regex(r"\A[a-z][-a-z0-9.]{0,20}[a-z0-9]\Z"))
    return {
        "apiVersion": "xpyd.dev/v1alpha1",
        "kind": "PDDeployment",
        "metadata": {"name": name},
        "spec": spec,
    }


@dataclass
class Tally:
    generated: int = 0
    accepted: int = 0
    rejected: int = 0
    autoscaled: int = 0  # accepted specs in Advisory or Auto
    decided: int = 0  # of which the controller decided for
    refused: list[str] = field(default_factory=list)  # and why it could not for the others
    mismatches: list[str] = field(default_factory=list)


class DryRun:
    """Server-side dry-run creates with strict field validation: (HTTP status, message)."""

    def __init__(self, kubeconfig: str) -> None:
        self.api = config.new_client_from_config(config_file=kubeconfig)

    def create(self, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        params = self.api.param_serialize(
            method="POST",
            resource_path=path,
            query_params=[("dryRun", "All"), ("fieldValidation", "Strict")],
            header_params={"Content-Type": "application/json", "Accept": "application/json"},
            body=body,
            auth_settings=["BearerToken"],
        )
        try:
            response = self.api.call_api(*params, _request_timeout=30)
            response.read()
        except client.exceptions.ApiException as error:
            return error.status or 0, json.loads(error.body or "{}")
        return response.status, json.loads(response.data or b"{}")


def _rendered(pdd_body: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    pdd = parse_pdd(pdd_body)
    ns = pdd.namespace
    for role in Role:
        yield f"/api/v1/namespaces/{ns}/services", render.role_service(pdd, role)
        yield f"/api/v1/namespaces/{ns}/pods", render.instance_pod(pdd, role, f"{pdd.name}-{role}-0")
    deployment, service = render.router_deployment(pdd), render.router_service(pdd)
    if deployment and service:
        yield f"/apis/apps/v1/namespaces/{ns}/deployments", deployment
        yield f"/api/v1/namespaces/{ns}/services", service


def check_controller(answer: dict[str, Any], executor: ThreadPoolExecutor, tally: Tally) -> None:
    """One pass of the controller's loop over the accepted object: a decision, or its reason for none."""
    if parse_pdd(answer).spec.autoscaling.mode is AutoscalingMode.OFF:
        return
    tally.autoscaled += 1
    cluster = FakeCluster(answer)
    loop = Controller(
        cluster, lambda url: FakeMetrics(BUSY), FakeTelemetry(), Settings(window_s=30), executor
    )
    decided = loop.run_pass(time.time())
    autoscaler = (answer.get("status") or {}).get("autoscaler") or {}
    if decided:
        tally.decided += 1
    elif autoscaler.get("binding") == BINDING_INVALID_SETUP and autoscaler.get("message"):
        tally.refused.append(str(autoscaler["message"]))
    else:
        tally.mismatches.append(
            f"the controller neither decided nor said why (its log has the error)\n{json.dumps(answer)}"
        )


def check(
    dry: DryRun, namespace: str, body: dict[str, Any], tally: Tally, executor: ThreadPoolExecutor
) -> None:
    tally.generated += 1
    status, answer = dry.create(f"/apis/xpyd.dev/v1alpha1/namespaces/{namespace}/pddeployments", body)
    if status >= 400:
        assert status in (400, 422), f"unexpected HTTP {status}: {answer}"
        tally.rejected += 1
        return
    tally.accepted += 1
    answer["metadata"].setdefault("uid", "00000000-0000-0000-0000-000000000000")
    try:
        objects = list(_rendered(answer))
    except PDDSpecError as error:
        tally.mismatches.append(f"model refused an accepted spec: {error}\n{json.dumps(body)}")
        return
    for path, obj in objects:
        status, refusal = dry.create(path, obj)
        if status >= 400:
            message = refusal.get("message", refusal)
            tally.mismatches.append(
                f"API server refused the rendered {obj['kind']}: {message}\n{json.dumps(body)}"
            )
    check_controller(answer, executor, tally)


def test_accepted_specs_parse_and_render_accepted_objects(kube_cluster: LocalCluster, namespace: str) -> None:
    dry = DryRun(str(kube_cluster.kubeconfig))
    tally = Tally()
    executor = ThreadPoolExecutor(1, thread_name_prefix="decide")

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        # The same 1000 specs every run: unseeded runs accepted from 180 to 303 of them, so the share
        # check below was a coin toss, and a mismatch found once must be found again.
        derandomize=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
    )
    @given(pdd_bodies())
    def one(body: dict[str, Any]) -> None:
        check(dry, namespace, body, tally, executor)

    try:
        one()
    finally:
        executor.shutdown()
    reasons = sorted({re.sub(r"'[^']*'", "'…'", message)[:120] for message in tally.refused})
    print(
        f"\nCRD fuzz: {tally.generated} generated, {tally.accepted} accepted, {tally.rejected} rejected, "
        f"{len(tally.mismatches)} mismatches; {tally.autoscaled} accepted autoscaled: the controller decided "
        f"for {tally.decided}, said why not for {len(tally.refused)}:\n  " + "\n  ".join(reasons)
    )
    assert tally.generated >= EXAMPLES
    assert tally.accepted >= MIN_ACCEPTED, "too few accepted specs to say anything about the model"
    assert tally.autoscaled >= MIN_AUTOSCALED and tally.decided > 0, (
        "too few to say anything about the controller"
    )
    assert not tally.mismatches, "\n\n".join(tally.mismatches[:10])
