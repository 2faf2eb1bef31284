"""The engine table (xpyd_api.engines) against the modules that read it: the names the controller's
PromQL and the operator's drain read are the ones the simulated exposition exports, every flag xpyd
renders that an image may reject is explained, and the CRD's switch path default is the table's."""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path

import pytest
import yaml

from xpyd_api import engines
from xpyd_api.engines import ENGINES, FLAG_PURPOSES, ROLE_SWITCH, VLLM, Engine, EngineType, MetricNames
from xpyd_api.models import parse_pdd
from xpyd_api.names import Role
from xpyd_controller.sim.exposition import EngineSeries, render
from xpyd_operator.adapters import engine_client
from xpyd_operator.core.render import instance_pod_spec

METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
CRD = Path(__file__).parents[2] / "crds" / "pddeployments.xpyd.dev.yaml"


def _exported_names(text: str) -> set[str]:
    return {line.split("{", 1)[0].split(" ", 1)[0] for line in text.splitlines() if line and line[0] != "#"}


def _all_names(names: MetricNames) -> list[str]:
    return [name for field in fields(names) for name in getattr(names, field.name)]


def test_every_engine_type_has_an_entry() -> None:
    assert set(ENGINES) == set(EngineType)


@pytest.mark.parametrize("engine", list(EngineType))
def test_names_are_prometheus_names(engine: EngineType) -> None:
    entry = ENGINES[engine]
    drain_names = [name for families in (entry.in_flight, entry.finished) for f in families for name in f]
    for name in _all_names(entry.metrics) + drain_names:
        assert METRIC_NAME.fullmatch(name), name


def test_the_simulated_exposition_exports_the_newest_vllm_name_of_every_metric() -> None:
    """xpyd's simulated instances (live fleet, stand-in) must answer every query the controller sends
    a vLLM pool with its first alternative: a histogram by its _bucket, _sum and _count series."""
    exported = _exported_names(render(EngineSeries(), "m"))
    for field in fields(VLLM.metrics):
        alternatives = getattr(VLLM.metrics, field.name)
        if not alternatives:
            continue
        newest = alternatives[0]
        histogram = {f"{newest}_bucket", f"{newest}_sum", f"{newest}_count"}
        assert newest in exported or histogram <= exported, (field.name, newest)


@pytest.mark.parametrize("engine", [EngineType.VLLM, EngineType.CUSTOM])
def test_the_drain_reads_the_simulated_exposition(engine: EngineType) -> None:
    series = EngineSeries(running=3, waiting=2)
    series.prompt_tokens.observe(100, count=4)
    load = engine_client.parse_load(render(series, "m"), engine)
    assert (load.in_flight, load.finished) == (5, 4)


def test_custom_engines_are_read_with_vllms_names_and_either_in_flight_family() -> None:
    custom, sglang = ENGINES[EngineType.CUSTOM], ENGINES[EngineType.SGLANG]
    assert custom.metrics is VLLM.metrics
    assert custom.in_flight == (*VLLM.in_flight, *sglang.in_flight)
    assert custom.flags is None


def test_the_in_flight_families_are_the_engines_running_and_waiting_gauges() -> None:
    for engine in (EngineType.VLLM, EngineType.SGLANG):
        entry = ENGINES[engine]
        assert entry.in_flight == ((entry.metrics.running[0], entry.metrics.waiting[0]),)


def _rejectable_flags(entry: Engine) -> list[str]:
    """Flags beyond model/host/port/tensor parallelism, which an older image may not know."""
    flags = entry.flags
    assert flags is not None
    named = [flags.kv_transfer_config, flags.disaggregation_mode, flags.transfer_backend, flags.role_switch]
    return [flag for flag in (*named, *flags.metrics) if flag]


@pytest.mark.parametrize("engine", [EngineType.VLLM, EngineType.SGLANG])
def test_every_rejectable_flag_but_the_shutdown_timeout_has_a_purpose(engine: EngineType) -> None:
    assert set(_rejectable_flags(ENGINES[engine])) <= set(FLAG_PURPOSES)


@pytest.mark.parametrize(
    ("engine", "method"),
    [(EngineType.VLLM, "Routing"), (EngineType.SGLANG, "HTTP"), (EngineType.CUSTOM, "Auto")],
)
def test_render_starts_the_tables_command_with_its_flags(engine: EngineType, method: str) -> None:
    body = {
        "metadata": {"name": "p", "namespace": "n", "uid": "u"},
        "spec": {
            "model": {"name": "m"},
            "engine": {"type": engine.value, "image": "i"},
            "conversion": {"switchMethod": method},
            "router": {"type": "none"},
        },
    }
    container = instance_pod_spec(parse_pdd(body).spec, Role.PREFILL)["containers"][0]
    entry = ENGINES[engine]
    assert tuple(container["command"]) == entry.command
    assert container["readinessProbe"]["httpGet"]["path"] == entry.endpoints.health
    if entry.flags is None:
        assert container["args"] == []
        return
    assert container["args"][:6] == [
        entry.flags.model,
        "m",
        entry.flags.host,
        "0.0.0.0",
        entry.flags.port,
        "8000",
    ]
    assert set(_rejectable_flags(entry)) <= set(container["args"])


def test_the_crd_defaults_the_switch_path_to_the_tables() -> None:
    crd = yaml.safe_load(CRD.read_text())
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert spec["properties"]["conversion"]["properties"]["switchPath"]["default"] == ROLE_SWITCH.path


def test_engines_that_switch_in_place_by_http_name_the_protocol() -> None:
    sglang = ENGINES[EngineType.SGLANG]
    assert sglang.role_switch is ROLE_SWITCH
    assert sglang.flags is not None and sglang.flags.role_switch
    assert VLLM.role_switch is None  # vLLM switches by routing (NixlConnector) or by restart


def test_the_standin_is_started_as_a_python_module() -> None:
    assert engines.STANDIN_COMMAND[-2:] == ("-m", engines.STANDIN_MODULE)


@pytest.mark.parametrize(
    ("args", "found"),
    [
        ([], None),
        (["--tp-size", "8", "--dp-size", "1", "--ep-size=01"], None),
        (["--dp-size", "2"], "--dp-size 2"),
        (["--data-parallel-size=4"], "--data-parallel-size 4"),
        (["--ep", "8"], "--ep 8"),
        (["--pp-size", "2", "--pp-size", "1"], "--pp-size 2"),  # each place is read, not only the last
        (["--pp-size"], "--pp-size"),  # no value: refused, the engine would refuse it too
        (["--enable-dp-attention"], "--enable-dp-attention"),
        (["--dp-sizes", "4", "--tp", "2"], None),  # other flags are not parallelism
    ],
)
def test_sglang_parallelism_beyond_one_names_the_setting(args: list[str], found: str | None) -> None:
    assert engines.parallelism_beyond_one(args) == found


@pytest.mark.parametrize(
    ("version", "kv_both"),
    [
        ("0.22.1", engines.KvBoth.ACCEPTED),
        ("v0.32.0", engines.KvBoth.ACCEPTED),
        ("0.34", engines.KvBoth.ACCEPTED),
        ("0.34.9-cu128", engines.KvBoth.ACCEPTED),
        ("0.35.0", engines.KvBoth.EXPLICIT),
        ("v0.100.0", engines.KvBoth.EXPLICIT),
        ("1.0", engines.KvBoth.EXPLICIT),
        ("latest", engines.KvBoth.UNKNOWN),
        ("1", engines.KvBoth.UNKNOWN),
        ("nightly-0.35.0", engines.KvBoth.UNKNOWN),
        (None, engines.KvBoth.UNKNOWN),
    ],
)
def test_vllm_versions_read_to_take_kv_both(version: str | None, kv_both: engines.KvBoth) -> None:
    assert engines.vllm_kv_both(version) is kv_both


def test_the_crd_refuses_routing_for_exactly_the_versions_the_table_reads_as_explicit() -> None:
    """The CRD's CEL rule spells the table's bound as a regular expression; both agree on every minor
    version around it and on each form a version is written in."""
    crd = yaml.safe_load(CRD.read_text())
    version_node = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"][
        "properties"
    ]["engine"]["properties"]["version"]
    assert version_node["pattern"] == engines.VERSION_PATTERN
    rules = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["x-kubernetes-validations"]
    rule = next(r["rule"] for r in rules if "self.spec.engine.version.matches" in r["rule"])
    explicit = re.search(r"self\.spec\.engine\.version\.matches\('([^']+)'\)", rule)
    assert explicit is not None
    pattern = explicit.group(1)
    for major in range(3):
        for minor in (*range(40), 99, 100, 340):
            for text in (f"{major}.{minor}", f"v{major}.{minor}.1", f"{major}.{minor}+cpu"):
                refused = re.search(pattern, text) is not None
                assert refused is (engines.vllm_kv_both(text) is engines.KvBoth.EXPLICIT), text
