"""PromQL per signal: the exact strings the controller sends, label names and escaping, rename fallbacks."""

from __future__ import annotations

import re

import pytest

from xpyd_api.engines import ENGINES, EngineType
from xpyd_api.engines import SGLANG_METRICS as SGLANG
from xpyd_api.engines import VLLM_METRICS as VLLM
from xpyd_controller.control.promql import (
    VLLM_ROUTER,
    LabelNames,
    RouterMetrics,
    Scope,
    Signal,
    build_queries,
)

SCOPE = Scope("serving", "llama", 30)
P_SEL = '{namespace="serving",pdd="llama",role="prefill"}'
D_SEL = '{namespace="serving",pdd="llama",role="decode"}'
R_SEL = '{namespace="serving",pdd="llama",role=""}'


def _p90(selector: str, name: str = "vllm:time_to_first_token_seconds") -> str:
    return f"histogram_quantile(0.9, sum by (le) (rate({name}_bucket{selector}[30s])))"


def _mean(selector: str, name: str = "vllm:time_to_first_token_seconds") -> str:
    return f"sum(rate({name}_sum{selector}[30s])) / sum(rate({name}_count{selector}[30s]))"


def _arrivals(selector: str, finished: str, waiting: str, running: str) -> str:
    """Requests finished on prefill plus the growth of those waiting and running there, never below 0."""
    growth = f"(sum(deriv({waiting}{selector}[30s]))) + (sum(deriv({running}{selector}[30s])))"
    return f"clamp_min((sum(rate({finished}{selector}[30s]))) + (({growth}) or vector(0)), 0)"


VLLM_ARRIVALS = _arrivals(
    P_SEL, "vllm:request_prompt_tokens_count", "vllm:num_requests_waiting", "vllm:num_requests_running"
)
DECODE_TTFT_P90 = _p90(D_SEL)
# prefill's and decode's TTFT as independent legs: both means + sqrt(sum of squared p90 excesses)
TWO_LEGS = (
    f"({_mean(P_SEL)}) + ({_mean(D_SEL)}) + "
    f"sqrt((({_p90(P_SEL)}) - ({_mean(P_SEL)}))^2 + (({_p90(D_SEL)}) - ({_mean(D_SEL)}))^2)"
)


@pytest.mark.parametrize(
    ("signal", "expected"),
    [
        (Signal.ARRIVAL_RATE, VLLM_ARRIVALS),
        (Signal.PREFILL_FINISHED_RATE, f"sum(rate(vllm:request_prompt_tokens_count{P_SEL}[30s]))"),
        (Signal.INPUT_TOKENS_RATE, f"sum(rate(vllm:request_prompt_tokens_sum{P_SEL}[30s]))"),
        (
            Signal.INPUT_TOKENS_P90,
            f"histogram_quantile(0.9, sum by (le) (rate(vllm:request_prompt_tokens_bucket{P_SEL}[30s])))",
        ),
        (Signal.OUTPUT_REQUESTS_RATE, f"sum(rate(vllm:request_generation_tokens_count{D_SEL}[30s]))"),
        (Signal.OUTPUT_TOKENS_RATE, f"sum(rate(vllm:request_generation_tokens_sum{D_SEL}[30s]))"),
        (Signal.PREFIX_QUERIES_RATE, f"sum(rate(vllm:prefix_cache_queries_total{P_SEL}[30s]))"),
        (Signal.PREFIX_HITS_RATE, f"sum(rate(vllm:prefix_cache_hits_total{P_SEL}[30s]))"),
        (Signal.PREFILL_QUEUE, f"sum(vllm:num_requests_waiting{P_SEL})"),
        (Signal.DECODE_RUNNING, f"sum(vllm:num_requests_running{D_SEL})"),
        (Signal.DECODE_WAITING, f"sum(vllm:num_requests_waiting{D_SEL})"),
        (
            Signal.TPOT_MEAN,
            f"sum(rate(vllm:inter_token_latency_seconds_sum{D_SEL}[30s])) / "
            f"sum(rate(vllm:inter_token_latency_seconds_count{D_SEL}[30s]))"
            " or "
            f"sum(rate(vllm:time_per_output_token_seconds_sum{D_SEL}[30s])) / "
            f"sum(rate(vllm:time_per_output_token_seconds_count{D_SEL}[30s]))",
        ),
        (
            Signal.DECODE_KV_USAGE,
            f"avg(vllm:kv_cache_usage_perc{D_SEL}) or avg(vllm:gpu_cache_usage_perc{D_SEL})",
        ),
        (Signal.TTFT_P90, f"({TWO_LEGS}) >= 0 or {DECODE_TTFT_P90}"),
        (
            Signal.TPOT_P90,
            f"histogram_quantile(0.9, sum by (le) (rate(vllm:inter_token_latency_seconds_bucket{D_SEL}[30s])))"
            " or "
            f"histogram_quantile(0.9, sum by (le) (rate(vllm:time_per_output_token_seconds_bucket{D_SEL}[30s])))",
        ),
    ],
)
def test_vllm_query_per_signal(signal: Signal, expected: str) -> None:
    assert build_queries(VLLM, SCOPE)[signal] == expected


def test_every_signal_has_a_query() -> None:
    assert set(build_queries(VLLM, SCOPE)) == set(Signal)


def test_label_names_are_configurable_and_values_escaped() -> None:
    scope = Scope('we"ird\\ns', "p", 60.4, LabelNames("kubernetes_namespace", "xpyd_pdd", "xpyd_role"))
    query = build_queries(VLLM, scope)[Signal.PREFILL_QUEUE]
    assert (
        query
        == 'sum(vllm:num_requests_waiting{kubernetes_namespace="we\\"ird\\\\ns",xpyd_pdd="p",xpyd_role="prefill"})'
    )
    assert "[60s]" in build_queries(VLLM, scope)[Signal.ARRIVAL_RATE]


@pytest.mark.parametrize(
    ("labels", "message"),
    [
        (dict(namespace=""), "label name for namespace = ''"),
        (dict(pdd="xpyd.dev/pdd"), "label name for pdd = 'xpyd.dev/pdd'"),
        (dict(role="1role"), "label name for role = '1role'"),
    ],
)
def test_bad_label_names_are_rejected(labels: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        LabelNames(**labels)


def test_window_below_one_second_is_rejected() -> None:
    with pytest.raises(ValueError, match=r"rate window = 0.5 s: must be at least 1 s"):
        Scope("ns", "p", 0.5)


@pytest.mark.parametrize(
    ("signal", "expected"),
    [
        (
            Signal.ARRIVAL_RATE,
            _arrivals(P_SEL, "sglang:num_requests_total", "sglang:num_queue_reqs", "sglang:num_running_reqs"),
        ),
        (Signal.PREFILL_FINISHED_RATE, f"sum(rate(sglang:num_requests_total{P_SEL}[30s]))"),
        (Signal.INPUT_TOKENS_RATE, f"sum(rate(sglang:prompt_tokens_total{P_SEL}[30s]))"),
        (Signal.OUTPUT_REQUESTS_RATE, f"sum(rate(sglang:num_requests_total{D_SEL}[30s]))"),
        (Signal.OUTPUT_TOKENS_RATE, f"sum(rate(sglang:generation_tokens_total{D_SEL}[30s]))"),
        (Signal.PREFIX_QUERIES_RATE, f"sum(rate(sglang:prompt_tokens_total{P_SEL}[30s]))"),
        (Signal.PREFIX_HITS_RATE, f"sum(rate(sglang:cached_tokens_total{P_SEL}[30s]))"),
        (Signal.PREFILL_QUEUE, f"sum(sglang:num_queue_reqs{P_SEL})"),
        (Signal.DECODE_RUNNING, f"sum(sglang:num_running_reqs{D_SEL})"),
        (Signal.DECODE_KV_USAGE, f"avg(sglang:token_usage{D_SEL})"),
        (
            Signal.TTFT_P90,
            f"histogram_quantile(0.9, sum by (le) (rate(sglang:time_to_first_token_seconds_bucket{D_SEL}[30s])))",
        ),
    ],
)
def test_sglang_query_per_signal(signal: Signal, expected: str) -> None:
    assert build_queries(SGLANG, SCOPE)[signal] == expected


def test_sglang_length_histograms_are_read() -> None:
    """The operator starts SGLang with --collect-tokens-histogram, so every signal has a query."""
    queries = build_queries(SGLANG, SCOPE)
    assert set(queries) == set(Signal)
    assert "sglang:prompt_tokens_histogram_bucket" in queries[Signal.INPUT_TOKENS_P90]
    assert "sglang:generation_tokens_histogram_bucket" in queries[Signal.OUTPUT_TOKENS_P90]


@pytest.mark.parametrize(
    ("engine", "names"), [(EngineType.VLLM, VLLM), (EngineType.SGLANG, SGLANG), (EngineType.CUSTOM, VLLM)]
)
def test_every_engine_type_has_names(engine: EngineType, names: object) -> None:
    assert ENGINES[engine].metrics is names


def test_arrivals_come_from_the_router_first() -> None:
    """The users' side: the router's request counter, then prefill's (finished plus its in-flight growth)
    if it is not scraped."""
    assert build_queries(VLLM, SCOPE, VLLM_ROUTER)[Signal.ARRIVAL_RATE] == (
        f"sum(rate(vllm_router_pd_requests_total{R_SEL}[30s])) or {VLLM_ARRIVALS}"
    )


def test_ttft_from_a_router_that_exports_it_comes_first() -> None:
    router = RouterMetrics(requests=(), ttft=("router:ttft_seconds",))
    query = build_queries(VLLM, SCOPE, router)[Signal.TTFT_P90]
    assert query.startswith(
        f"histogram_quantile(0.9, sum by (le) (rate(router:ttft_seconds_bucket{R_SEL}[30s]))) or "
    )
    assert "vllm_router" not in build_queries(VLLM, SCOPE)[Signal.TTFT_P90]


def test_under_vllm_router_the_legs_gain_the_routers_time_outside_prefills_clock() -> None:
    """vllm-router 0.1.17 exports no TTFT; its request duration ends at decode's response headers,
    which vLLM sends before the first token, so its mean less prefill's mean TTFT is what the engines'
    clocks miss; without router series (nothing scrapes the router) the two legs alone, without prefill
    samples decode's own."""
    outside = f"clamp_min(({_mean(R_SEL, 'vllm_router_pd_request_duration_seconds')}) - ({_mean(P_SEL)}), 0)"
    assert build_queries(VLLM, SCOPE, VLLM_ROUTER)[Signal.TTFT_P90] == (
        f"(({TWO_LEGS}) + {outside}) >= 0 or ({TWO_LEGS}) >= 0 or {DECODE_TTFT_P90}"
    )


def test_sglang_ttft_is_decodes_own() -> None:
    """SGLang's router sends both requests at once: decode's TTFT already spans prefill and transfer."""
    assert build_queries(SGLANG, SCOPE)[Signal.TTFT_P90] == (
        f"histogram_quantile(0.9, sum by (le) (rate(sglang:time_to_first_token_seconds_bucket{D_SEL}[30s])))"
    )
