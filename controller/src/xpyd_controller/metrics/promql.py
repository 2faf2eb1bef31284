"""PromQL for every signal the policy reads, per engine family (pure: strings in, strings out).

Each signal is measured on the pool where it means what the policy needs: request arrivals and prompt
lengths on the prefill pool (a request leaves a prefill instance right after its prefill, so these are
admissions to prefill, not decode completions), output lengths, latencies, running requests and KV usage
on the decode pool, which serves the request to the client. Where an engine renamed a metric, the newer
name is tried first and the older one is joined with `or`, so one controller reads both releases.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from xpyd_api.models import EngineType
from xpyd_api.names import Role

QUANTILE = 0.9  # the Observation's p90 fields
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")


class Signal(StrEnum):
    """One number the controller asks Prometheus for; the Observation is computed from them."""

    ARRIVAL_RATE = "arrival_rate"  # requests/s admitted to prefill
    INPUT_TOKENS_RATE = "input_tokens_rate"  # prompt tokens/s of those requests (÷ arrivals = mean)
    INPUT_TOKENS_P90 = "input_tokens_p90"
    OUTPUT_REQUESTS_RATE = "output_requests_rate"  # requests/s finishing decode
    OUTPUT_TOKENS_RATE = "output_tokens_rate"  # generated tokens/s of those requests
    OUTPUT_TOKENS_P90 = "output_tokens_p90"
    PREFIX_QUERIES_RATE = "prefix_queries_rate"  # prompt tokens/s looked up in the prefix cache
    PREFIX_HITS_RATE = "prefix_hits_rate"  # of which found
    PREFILL_QUEUE = "prefill_queue"
    DECODE_RUNNING = "decode_running"
    DECODE_KV_USAGE = "decode_kv_usage"
    TTFT_P90 = "ttft_p90"
    TPOT_P90 = "tpot_p90"


@dataclass(frozen=True)
class LabelNames:
    """Labels the scrape attaches to every engine series (relabelled from the pods' xpyd.dev labels)."""

    namespace: str = "namespace"
    pdd: str = "pdd"
    role: str = "role"

    def __post_init__(self) -> None:
        for field, value in (("namespace", self.namespace), ("pdd", self.pdd), ("role", self.role)):
            if not _LABEL_NAME.fullmatch(value):
                raise ValueError(f"label name for {field} = {value!r}: must match [a-zA-Z_][a-zA-Z0-9_]*")


@dataclass(frozen=True)
class EngineMetrics:
    """An engine family's metric names; each entry lists alternatives, newest name first."""

    running: Sequence[str]  # gauge: requests in running batches
    waiting: Sequence[str]  # gauge: requests queued
    kv_usage: Sequence[str]  # gauge: fraction 0..1 of KV cache blocks in use
    prompt_tokens: Sequence[str]  # histogram of prompt tokens per request
    generation_tokens: Sequence[str]  # histogram of generated tokens per request
    ttft: Sequence[str]  # histogram, seconds
    tpot: Sequence[str]  # histogram, seconds between output tokens
    prefix_queries: Sequence[str]  # counter of prompt tokens looked up in the prefix cache
    prefix_hits: Sequence[str]  # counter of those found


# vLLM's V1 names (docs.vllm.ai "Production Metrics"); the older names are the V0 ones.
VLLM = EngineMetrics(
    running=("vllm:num_requests_running",),
    waiting=("vllm:num_requests_waiting",),
    kv_usage=("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    prompt_tokens=("vllm:request_prompt_tokens",),
    generation_tokens=("vllm:request_generation_tokens",),
    ttft=("vllm:time_to_first_token_seconds",),
    tpot=("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
    prefix_queries=("vllm:prefix_cache_queries_total",),
    prefix_hits=("vllm:prefix_cache_hits_total",),
)

# Engines whose metric names the controller knows. Custom engines are read with vLLM's names (a custom
# image can export them); SGLang is not mapped yet.
ENGINE_METRICS: Mapping[EngineType, EngineMetrics] = {EngineType.VLLM: VLLM, EngineType.CUSTOM: VLLM}


def metrics_for(engine: EngineType) -> EngineMetrics:
    """The metric names of `engine`; a clear error for an engine the controller cannot read yet."""
    known = ENGINE_METRICS.get(engine)
    if known is None:
        supported = ", ".join(sorted(str(e) for e in ENGINE_METRICS))
        raise ValueError(
            f"spec.engine.type = {str(engine)!r}: the controller reads metrics of {supported} only"
        )
    return known


def _quote(value: str) -> str:
    """A PromQL string literal (backslashes and double quotes escaped)."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


@dataclass(frozen=True)
class Scope:
    """Which series belong to one PDDeployment's pools, and the rate window."""

    namespace: str
    pdd: str
    window_s: float
    labels: LabelNames = LabelNames()

    def __post_init__(self) -> None:
        if not self.window_s >= 1:
            raise ValueError(f"rate window = {self.window_s!r} s: must be at least 1 s")

    def selector(self, role: Role) -> str:
        names = self.labels
        pairs = ((names.namespace, self.namespace), (names.pdd, self.pdd), (names.role, str(role)))
        return "{" + ",".join(f"{label}={_quote(value)}" for label, value in pairs) + "}"

    @property
    def window(self) -> str:
        return f"{round(self.window_s)}s"


def _either(queries: Sequence[str]) -> str:
    return " or ".join(queries)


def _rate(names: Sequence[str], suffix: str, scope: Scope, role: Role) -> str:
    """Summed per-second increase of a counter (or a histogram's _sum/_count) over the window."""
    selector = scope.selector(role)
    return _either([f"sum(rate({name}{suffix}{selector}[{scope.window}]))" for name in names])


def _quantile(names: Sequence[str], scope: Scope, role: Role) -> str:
    selector = scope.selector(role)
    return _either(
        [
            f"histogram_quantile({QUANTILE}, sum by (le) (rate({name}_bucket{selector}[{scope.window}])))"
            for name in names
        ]
    )


def _gauge(aggregate: str, names: Sequence[str], scope: Scope, role: Role) -> str:
    selector = scope.selector(role)
    return _either([f"{aggregate}({name}{selector})" for name in names])


def build_queries(engine: EngineMetrics, scope: Scope) -> dict[Signal, str]:
    """One PromQL expression per signal, for the pools of one PDDeployment."""
    prefill, decode = Role.PREFILL, Role.DECODE
    return {
        Signal.ARRIVAL_RATE: _rate(engine.prompt_tokens, "_count", scope, prefill),
        Signal.INPUT_TOKENS_RATE: _rate(engine.prompt_tokens, "_sum", scope, prefill),
        Signal.INPUT_TOKENS_P90: _quantile(engine.prompt_tokens, scope, prefill),
        Signal.OUTPUT_REQUESTS_RATE: _rate(engine.generation_tokens, "_count", scope, decode),
        Signal.OUTPUT_TOKENS_RATE: _rate(engine.generation_tokens, "_sum", scope, decode),
        Signal.OUTPUT_TOKENS_P90: _quantile(engine.generation_tokens, scope, decode),
        Signal.PREFIX_QUERIES_RATE: _rate(engine.prefix_queries, "", scope, prefill),
        Signal.PREFIX_HITS_RATE: _rate(engine.prefix_hits, "", scope, prefill),
        Signal.PREFILL_QUEUE: _gauge("sum", engine.waiting, scope, prefill),
        Signal.DECODE_RUNNING: _gauge("sum", engine.running, scope, decode),
        Signal.DECODE_KV_USAGE: _gauge("avg", engine.kv_usage, scope, decode),
        Signal.TTFT_P90: _quantile(engine.ttft, scope, decode),
        Signal.TPOT_P90: _quantile(engine.tpot, scope, decode),
    }
