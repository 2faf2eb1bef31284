"""What xpyd knows of each engine, in one table (pure data): the command and flags the operator renders,
the endpoints the kubelet, the operator and Prometheus call, the metric names the controller's PromQL,
the operator's drain and xpyd's simulated instances share, and the HTTP role-switch protocol.

Where an engine renamed a metric, its entry lists the names newest first; the PromQL joins them with
`or`, so one controller reads both releases, and the simulated exposition exports the newest.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum


class EngineType(StrEnum):
    VLLM = "vllm"
    SGLANG = "sglang"
    CUSTOM = "custom"


@dataclass(frozen=True)
class MetricNames:
    """An engine's series names; each entry lists alternatives, newest name first, and an empty entry
    means the engine does not export it (that signal then has no data)."""

    requests_in: Sequence[str]  # counter of requests, read on the prefill pool (arrivals)
    prompt_tokens: Sequence[str]  # counter of their prompt tokens
    prompt_histogram: Sequence[str]  # histogram of prompt tokens per request (base name)
    requests_out: Sequence[str]  # counter of requests, read on the decode pool (finished)
    output_tokens: Sequence[str]  # counter of their generated tokens
    output_histogram: Sequence[str]  # histogram of generated tokens per request (base name)
    prefix_queries: Sequence[str]  # counter of prompt tokens looked up in the prefix cache
    prefix_hits: Sequence[str]  # counter of those found
    waiting: Sequence[str]  # gauge: requests queued
    running: Sequence[str]  # gauge: requests in running batches
    kv_usage: Sequence[str]  # gauge: fraction 0..1 of the KV cache in use
    ttft: Sequence[str]  # histogram, seconds (base name), read on the decode pool
    tpot: Sequence[str]  # histogram, seconds between output tokens (base name)
    # histogram read on the prefill pool and added to decode's TTFT, for engines whose decode instance
    # gets the request only after its prefill (so its own TTFT leaves prefill queueing and compute out)
    ttft_prefill_leg: Sequence[str] = ()


@dataclass(frozen=True)
class EngineFlags:
    """The engine's command-line flags xpyd renders (None: the engine has no such flag)."""

    model: str
    tensor_parallel: str
    host: str = "--host"
    port: str = "--port"
    kv_transfer_config: str | None = None  # vLLM: JSON {kv_connector, kv_role}
    shutdown_timeout: str | None = None  # seconds a SIGTERMed engine keeps serving its requests
    disaggregation_mode: str | None = None  # SGLang: prefill | decode
    transfer_backend: str | None = None  # SGLang: the KV transfer backend
    metrics: tuple[str, ...] = ()  # without these, /metrics lacks what the autoscaler reads
    role_switch: str | None = None  # enables the HTTP role-switch endpoint


@dataclass(frozen=True)
class Endpoints:
    """HTTP paths on the engine port: the readiness probe's and the one Prometheus and the drain read."""

    health: str = "/health"
    metrics: str = "/metrics"


@dataclass(frozen=True)
class RoleSwitch:
    """An in-place role switch over HTTP: POST `{role_field: "prefill"|"decode", ...}` to `path` (to decode
    with `decode_settings` read from a decode peer), verified by GET `report_path`, whose every
    `report_states[*][report_role]` must name the new role."""

    path: str
    role_field: str
    decode_settings: tuple[str, ...]
    report_path: str
    report_states: str
    report_role: str


@dataclass(frozen=True)
class Engine:
    """One engine: how it is started, where it answers, what it exports, how it switches roles."""

    command: tuple[str, ...]  # the container command when spec.engine.command is unset
    flags: EngineFlags | None  # None: xpyd renders no arguments (a custom image brings its own)
    endpoints: Endpoints
    metrics: MetricNames  # what the controller's PromQL reads
    # gauge families whose sum is an instance's requests now; the first family present wins
    in_flight: tuple[tuple[str, ...], ...]
    # counters of the requests an instance finished since it started; the first present wins
    finished: tuple[tuple[str, ...], ...]
    # the HTTP role switch, for engines that switch in place by a call (None: by routing or restart)
    role_switch: RoleSwitch | None = None


# vLLM's V1 names (docs.vllm.ai "Production Metrics"); the older names are the V0 ones.
VLLM_METRICS = MetricNames(
    requests_in=("vllm:request_prompt_tokens_count",),
    prompt_tokens=("vllm:request_prompt_tokens_sum",),
    prompt_histogram=("vllm:request_prompt_tokens",),
    requests_out=("vllm:request_generation_tokens_count",),
    output_tokens=("vllm:request_generation_tokens_sum",),
    output_histogram=("vllm:request_generation_tokens",),
    prefix_queries=("vllm:prefix_cache_queries_total",),
    prefix_hits=("vllm:prefix_cache_hits_total",),
    waiting=("vllm:num_requests_waiting",),
    running=("vllm:num_requests_running",),
    kv_usage=("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    ttft=("vllm:time_to_first_token_seconds",),
    tpot=("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
    # a PD router (vllm-router, vLLM's proxies) sends decode a second request once prefill answered
    ttft_prefill_leg=("vllm:time_to_first_token_seconds",),
)

# SGLang's names (docs.sglang.io "Production Metrics"; the operator starts it with `--enable-metrics`
# and `--collect-tokens-histogram`, without which there are no per-request length histograms); the
# prefix-cache hit rate is cached prompt tokens over all prompt tokens.
SGLANG_METRICS = MetricNames(
    requests_in=("sglang:num_requests_total",),
    prompt_tokens=("sglang:prompt_tokens_total",),
    prompt_histogram=("sglang:prompt_tokens_histogram",),
    requests_out=("sglang:num_requests_total",),
    output_tokens=("sglang:generation_tokens_total",),
    output_histogram=("sglang:generation_tokens_histogram",),
    prefix_queries=("sglang:prompt_tokens_total",),
    prefix_hits=("sglang:cached_tokens_total",),
    waiting=("sglang:num_queue_reqs",),
    running=("sglang:num_running_reqs",),
    kv_usage=("sglang:token_usage",),
    ttft=("sglang:time_to_first_token_seconds",),
    tpot=("sglang:inter_token_latency_seconds", "sglang:time_per_output_token_seconds"),
)

VLLM_IN_FLIGHT = (VLLM_METRICS.running[0], VLLM_METRICS.waiting[0])
SGLANG_IN_FLIGHT = (SGLANG_METRICS.running[0], SGLANG_METRICS.waiting[0])
# vLLM observes a request's prompt length when it finishes, so the histogram's count is its finished
# requests (prefill parts included).
VLLM_FINISHED = (VLLM_METRICS.requests_in[0],)

# SGLang's `/pd_role_switch` (and the live per-scheduler state in `/server_info` → `internal_states`;
# its top level holds the launch arguments, which a role switch does not change). A prefill-launched
# engine must be told the decode graph settings to reserve.
SGLANG_ROLE_SWITCH = RoleSwitch(
    path="/pd_role_switch",
    role_field="new_role",
    decode_settings=("decode_cuda_graph_memory_gb", "decode_cuda_graph_bs"),
    report_path="/server_info",
    report_states="internal_states",
    report_role="disaggregation_mode",
)

# vLLM's NixlConnector: the prefill side hands its host to decode as `remote_host`, and vLLM's default
# is localhost, so across pods it must be the pod IP. Each pod has its own IP, so one port serves all.
NIXL_CONNECTOR = "NixlConnector"
NIXL_HOST_ENV = "VLLM_NIXL_SIDE_CHANNEL_HOST"
NIXL_PORT_ENV = "VLLM_NIXL_SIDE_CHANNEL_PORT"
NIXL_SIDE_CHANNEL_PORT = 5600
# How long a NIXL prefill keeps a finished request's KV for decode to pull; decode's heartbeats, every
# sixth of it, keep it while the request waits at decode.
NIXL_EXTRA_CONFIG = "kv_connector_extra_config"
NIXL_KV_LEASE = "kv_lease_duration"
NIXL_DEFAULT_KV_LEASE_S = 30.0  # vLLM 0.32's, when kv_lease_duration is not given
# vLLM's kv_role conventions with NixlConnector, by version (docs/operator.md, "vLLM's kv_role conventions
# and versions"): every release read up to this one takes kv_both (from 0.23 with a deprecation warning that
# announces its removal). A later release is not known to take it, so xpyd gives it explicit roles
# (kv_producer on prefill, kv_consumer on decode) and never kv_both; so does a version it cannot read.
VLLM_KV_BOTH_READ_THROUGH = (0, 34)
VLLM_KV_BOTH_READ_THROUGH_TEXT = ".".join(map(str, VLLM_KV_BOTH_READ_THROUGH))
# A version as `spec.engine.version` or an image tag writes it: MAJOR.MINOR, an optional `v` before it and
# anything after a `.`, `+` or `-` (`0.32.0`, `v0.34.1`, `0.32.0-cu128`). The CRD's pattern is this one.
VERSION_PATTERN = r"^v?([0-9]+)\.([0-9]+)([.+-][0-9A-Za-z.+-]*)?$"
# Image repositories whose tag is read as the vLLM version when spec.engine.version is unset (vllm/vllm-
# openai, the vllm-cpu images): the last path component names vLLM. Other images give no version.
VLLM_IMAGE_HINT = "vllm"


class KvBoth(StrEnum):
    """Whether a vLLM version takes `kv_role: kv_both` with NixlConnector."""

    ACCEPTED = "accepted"  # read to take it: Auto converts by routing
    EXPLICIT = "explicit"  # a version past the ones read: roles must be explicit, Routing is refused
    UNKNOWN = "unknown"  # no version to read: Auto restarts in place, an explicit Routing is the user's


def parse_version(text: str) -> tuple[int, int] | None:
    """(MAJOR, MINOR) of a version written as VERSION_PATTERN says, else None."""
    match = re.fullmatch(VERSION_PATTERN, text)
    return (int(match.group(1)), int(match.group(2))) if match else None


def image_tag_version(image: str) -> str | None:
    """The tag of an image whose repository names vLLM (`vllm/vllm-openai:v0.32.0` -> `v0.32.0`); None for
    another repository, no tag, or a digest only (a digest names no version)."""
    reference = image.split("@", 1)[0]
    repository, colon, tag = reference.rpartition(":")
    if not colon or "/" in tag or VLLM_IMAGE_HINT not in repository.rsplit("/", 1)[-1]:
        return None
    return tag


def vllm_kv_both(version: str | None) -> KvBoth:
    """What a vLLM version (spec.engine.version, else the image tag) does with kv_both."""
    parsed = parse_version(version) if version else None
    if parsed is None:
        return KvBoth.UNKNOWN
    return KvBoth.ACCEPTED if parsed <= VLLM_KV_BOTH_READ_THROUGH else KvBoth.EXPLICIT


SGLANG_DEFAULT_TRANSFER_BACKEND = "mooncake"
# What SGLang's `/pd_role_switch` can switch: the transfer backends whose KV manager supports a runtime
# role switch (the rest answer 400), and one data-, expert- and pipeline-parallel rank (its server
# refuses --enable-pd-role-switch with more, and with DP attention).
SGLANG_ROLE_SWITCH_BACKENDS = ("mooncake", "mori")
SGLANG_PARALLEL_FLAGS = (
    "--data-parallel-size",
    "--dp-size",
    "--dp",
    "--expert-parallel-size",
    "--ep-size",
    "--ep",
    "--pipeline-parallel-size",
    "--pp-size",
    "--pp",
)
SGLANG_DP_ATTENTION_FLAG = "--enable-dp-attention"


def parallelism_beyond_one(args: Sequence[str]) -> str | None:
    """The first data/expert/pipeline-parallel setting above 1 in SGLang arguments (as written), else None.

    A flag's value is the token after it or after its `=`; a flag given twice is read at each place,
    so a later 1 does not hide an earlier 2 (refusing what the engine might accept is the safe side)."""
    for index, arg in enumerate(args):
        if arg == SGLANG_DP_ATTENTION_FLAG:
            return arg
        flag, equals, value = arg.partition("=")
        if flag not in SGLANG_PARALLEL_FLAGS:
            continue
        if not equals:
            value = args[index + 1] if index + 1 < len(args) else ""
        if value.lstrip("0") != "1":
            return f"{flag} {value}".rstrip()
    return None


# Flags a Degraded message explains (FLAG_PURPOSES) when an engine image rejects them.
KV_TRANSFER_CONFIG_FLAG = "--kv-transfer-config"
DISAGGREGATION_MODE_FLAG = "--disaggregation-mode"
TRANSFER_BACKEND_FLAG = "--disaggregation-transfer-backend"
# SGLang serves /metrics only with the first, and its length histograms only with the second
SGLANG_METRICS_FLAGS = ("--enable-metrics", "--collect-tokens-histogram")
ROLE_SWITCH_FLAG = "--enable-pd-role-switch"

VLLM = Engine(
    command=("vllm", "serve"),
    flags=EngineFlags(
        model="--model",
        tensor_parallel="--tensor-parallel-size",
        kv_transfer_config=KV_TRANSFER_CONFIG_FLAG,
        shutdown_timeout="--shutdown-timeout",  # vLLM 0.32; its default 0 aborts in-flight requests
    ),
    endpoints=Endpoints(),
    metrics=VLLM_METRICS,
    in_flight=(VLLM_IN_FLIGHT,),
    finished=(VLLM_FINISHED,),
)

SGLANG = Engine(
    command=("python3", "-m", "sglang.launch_server"),
    flags=EngineFlags(
        model="--model-path",
        tensor_parallel="--tp-size",
        disaggregation_mode=DISAGGREGATION_MODE_FLAG,
        transfer_backend=TRANSFER_BACKEND_FLAG,
        metrics=SGLANG_METRICS_FLAGS,
        role_switch=ROLE_SWITCH_FLAG,
    ),
    endpoints=Endpoints(),
    metrics=SGLANG_METRICS,
    in_flight=(SGLANG_IN_FLIGHT,),
    finished=(),
    role_switch=SGLANG_ROLE_SWITCH,
)

# A custom image: no rendered arguments, read with vLLM's names (a custom image can export them), its
# in-flight requests with vLLM's or SGLang's, and an HTTP switch (if asked for) with SGLang's protocol.
CUSTOM = Engine(
    command=VLLM.command,
    flags=None,
    endpoints=Endpoints(),
    metrics=VLLM_METRICS,
    in_flight=(VLLM_IN_FLIGHT, SGLANG_IN_FLIGHT),
    finished=(VLLM_FINISHED,),
    role_switch=SGLANG_ROLE_SWITCH,
)

ENGINES: Mapping[EngineType, Engine] = {
    EngineType.VLLM: VLLM,
    EngineType.SGLANG: SGLANG,
    EngineType.CUSTOM: CUSTOM,
}

# The one HTTP role-switch protocol xpyd speaks (spec.conversion.switchMethod HTTP, any engine type);
# spec.conversion.switchPath defaults to its path.
ROLE_SWITCH = SGLANG_ROLE_SWITCH

# xpyd's engine stand-in (xpyd_controller.standin) runs as engine type vllm with this command: it takes
# vLLM's flags, answers vLLM's endpoints and exports vLLM's newest metric names, and also serves its
# request log at STANDIN_REQUESTS_PATH.
STANDIN_MODULE = "xpyd_controller.standin"
STANDIN_COMMAND = ("python", "-m", STANDIN_MODULE)
STANDIN_REQUESTS_PATH = "/xpyd/requests"

# Why xpyd renders each engine flag, so a Degraded message says which setting needs the newer image.
FLAG_PURPOSES: Mapping[str, str] = {
    ROLE_SWITCH_FLAG: "spec.conversion.switchMethod HTTP needs it",
    SGLANG_METRICS_FLAGS[0]: "rendered for the autoscaler's metrics (SGLang /metrics)",
    SGLANG_METRICS_FLAGS[1]: "rendered for the autoscaler's prompt and output length quantiles",
    KV_TRANSFER_CONFIG_FLAG: (
        "rendered for prefill/decode KV transfer (spec.engine.kvConnector); its kv_role is kv_both "
        "under spec.conversion.switchMethod Routing (Auto picks it for vLLM with NixlConnector up to "
        f"{VLLM_KV_BOTH_READ_THROUGH_TEXT}), kv_producer/kv_consumer under Restart and InPlace (Auto picks "
        "InPlace for a later vLLM version or one it cannot read: set spec.engine.version)"
    ),
    DISAGGREGATION_MODE_FLAG: "rendered for prefill/decode disaggregation",
    TRANSFER_BACKEND_FLAG: "rendered for KV transfer (spec.engine.kvConnector)",
}
