"""HTTP I/O with engine instances: in-flight and finished requests from /metrics, the role-switch call,
verification.

A failed read is `None` ("no data"), never 0: draining waits for a known 0 or the timeout.
"""

from __future__ import annotations

import json
import math
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from xpyd_api.engines import ENGINES, ROLE_SWITCH, EngineType
from xpyd_api.instances import Instance
from xpyd_api.names import Role


@dataclass(frozen=True)
class EngineLoad:
    """One /metrics read: requests in the engine now, and finished since it started (None: not known)."""

    in_flight: int | None
    finished: int | None


class EngineError(RuntimeError):
    """An engine endpoint did not do what was asked; the message names the URL and the answer."""


def parse_in_flight(text: str, families: Sequence[tuple[str, ...]]) -> int | None:
    """Sum of the first metric family whose every series appears in `text` (all label sets); else None."""
    return _first_family_sum(_values(text), families)


def _values(text: str) -> dict[str, float]:
    """Each metric name's value, summed over its label sets (finite samples only)."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        if "{" in line:
            name, _, labelled = line.partition("{")
            rest = labelled.rsplit("}", 1)[-1]
        else:
            name, _, rest = line.partition(" ")
        fields = rest.split()
        if not fields:
            continue
        try:
            value = float(fields[0])
        except ValueError:
            continue
        if math.isfinite(value):
            values[name] = values.get(name, 0.0) + value
    return values


def _first_family_sum(values: Mapping[str, float], families: Sequence[tuple[str, ...]]) -> int | None:
    for family in families:
        if all(name in values for name in family):
            return round(sum(values[name] for name in family))
    return None


def base_url(instance: Instance, port: int, probe_pod_ip: bool) -> str | None:
    """Where the engine answers: the pod's annotation override, else its pod IP (when allowed)."""
    if instance.engine_url:
        return instance.engine_url.rstrip("/")
    if probe_pod_ip and instance.pod_ip:
        return f"http://{instance.pod_ip}:{port}"
    return None


def metrics_url(instance: Instance, engine: EngineType, port: int, probe_pod_ip: bool) -> str | None:
    base = base_url(instance, port, probe_pod_ip)
    return f"{base}{ENGINES[engine].endpoints.metrics}" if base else None


def parse_load(text: str, engine: EngineType) -> EngineLoad:
    values = _values(text)
    return EngineLoad(
        _first_family_sum(values, ENGINES[engine].in_flight),
        _first_family_sum(values, ENGINES[engine].finished),
    )


def read_load(url: str, engine: EngineType, timeout: float) -> EngineLoad:
    """In-flight and finished requests of one instance; None parts when the endpoint does not say."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            text = response.read().decode(errors="replace")
    except (urllib.error.URLError, OSError, ValueError):
        return EngineLoad(None, None)
    return parse_load(text, engine)


def read_in_flight(url: str, engine: EngineType, timeout: float) -> int | None:
    """In-flight requests of one instance, or None when the endpoint does not answer with them."""
    return read_load(url, engine, timeout).in_flight


def switch_role(url: str, target: Role, timeout: float, settings: Mapping[str, Any] | None = None) -> None:
    """POST the engine's role-switch endpoint (engines.ROLE_SWITCH: SGLang's `/pd_role_switch` takes
    `new_role`), plus (to decode) the decode graph settings a prefill-launched engine must reserve;
    HTTP 400 names why."""
    body = json.dumps({ROLE_SWITCH.role_field: str(target), **(settings or {})}).encode()
    request = urllib.request.Request(
        url, data=body, method="POST", headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            response.read()
    except urllib.error.HTTPError as error:
        raise EngineError(
            f"POST {url} {ROLE_SWITCH.role_field}={target}: HTTP {error.code} {error.read()[:200]!r}"
        ) from None
    except (urllib.error.URLError, OSError) as error:
        raise EngineError(f"POST {url} {ROLE_SWITCH.role_field}={target}: {error}") from None


# A router's pools: vllm-router and sglang-router answer `{"workers": [{"url": ..., "worker_type": ...}]}`.
ROUTER_WORKERS_PATH = "/workers"


def router_worker_hosts(router_url: str, engine_port: int, timeout: float) -> frozenset[str] | None:
    """The hosts (pod IPs) of the engines a router lists on `engine_port`, or None when unreadable."""
    try:
        with urllib.request.urlopen(router_url + ROUTER_WORKERS_PATH, timeout=timeout) as response:
            body = json.loads(response.read())
        urls = [str(worker["url"]) for worker in body["workers"]]
    except (urllib.error.URLError, OSError, ValueError, KeyError, TypeError):
        return None
    hosts = set()
    for url in urls:
        parsed = urllib.parse.urlsplit(url)
        try:
            port = parsed.port
        except ValueError:
            return None
        if parsed.hostname and port == engine_port:
            hosts.add(parsed.hostname)
    return frozenset(hosts)


def _internal_states(url: str, timeout: float) -> list[dict[str, Any]] | None:
    """The engine's live per-scheduler state (engines.ROLE_SWITCH: SGLang's `/server_info` →
    `internal_states`), or None when unreadable."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            info = json.loads(response.read())
    except (urllib.error.URLError, OSError, ValueError):
        return None
    states = info.get(ROLE_SWITCH.report_states) if isinstance(info, dict) else None
    if not isinstance(states, list) or not states or not all(isinstance(s, dict) for s in states):
        return None
    return states


def reported_role(url: str, timeout: float) -> str | None:
    """The role every scheduler of an engine reports (SGLang: `internal_states[*].disaggregation_mode`),
    or None when unknown or when they disagree (a switch still in progress)."""
    states = _internal_states(url, timeout)
    modes = {state.get(ROLE_SWITCH.report_role) for state in states or []}
    if len(modes) != 1 or None in modes:
        return None
    return str(modes.pop())


def decode_graph_settings(url: str, timeout: float) -> dict[str, Any]:
    """What a prefill→decode switch must send, read from a decode peer's state (SGLang:
    `decode_cuda_graph_memory_gb` and `decode_cuda_graph_bs`; empty when the peer does not report them)."""
    states = _internal_states(url, timeout) or [{}]
    settings = ROLE_SWITCH.decode_settings
    return {key: states[0][key] for key in settings if states[0].get(key) is not None}
