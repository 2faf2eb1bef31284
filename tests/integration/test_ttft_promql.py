"""The controller's TTFT query under vllm-router, evaluated by a real Prometheus over exporters whose
histograms grow at known rates: the answer is the two-leg formula (both means plus the root of the
summed squared p90 excesses) plus the router's mean time outside prefill's clock, and each fallback
answers when its inputs are missing."""

from __future__ import annotations

import bisect
import contextlib
import math
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest
from e2e.harness import PrometheusServer
from e2e.harness.loopback import exposition_handler, loopback_server
from e2e.harness.procs import wait_until
from e2e.harness.prometheus import start_prometheus

from xpyd_api.engines import VLLM_METRICS as VLLM
from xpyd_controller.adapters.prometheus import PrometheusSource
from xpyd_controller.control.promql import VLLM_ROUTER, Scope, Signal, build_queries

pytestmark = pytest.mark.prometheus

BOUNDS = (0.1, 0.25, 0.5, 1.0, 1.5, 2.0, 3.0, 5.0, 8.0)
PREFILL_TTFT = (0.3, 0.6, 0.9, 1.2, 1.4, 1.8, 2.2, 2.6, 4.0, 6.5)  # seconds, one window's requests
DECODE_TTFT = (0.15, 0.2, 0.2, 0.3, 0.3, 0.4, 0.4, 0.6, 0.9, 1.2)
ROUTER_UNTIL_DECODE = tuple(t + 0.25 for t in PREFILL_TTFT)  # prefill's leg + 0.25 s outside its clock
# decode's API process answering late: its first step lies inside the router's clock
ROUTER_UNTIL_LATE_DECODE = tuple(t + 3.0 for t in PREFILL_TTFT)
START = time.time()


def _histogram(name: str, observations: Sequence[float], per_second: float) -> str:
    """A histogram whose counts grow linearly from START: its rates are the observations' counts and
    sum times `per_second`, so Prometheus's rate() reads them exactly."""
    elapsed = (time.time() - START) * per_second
    lines = [f"# TYPE {name} histogram"]
    for bound in BOUNDS:
        below = sum(1 for value in observations if value <= bound)
        lines.append(f'{name}_bucket{{le="{bound}"}} {below * elapsed}')
    lines.append(f'{name}_bucket{{le="+Inf"}} {len(observations) * elapsed}')
    lines.append(f"{name}_sum {sum(observations) * elapsed}")
    lines.append(f"{name}_count {len(observations) * elapsed}")
    return "\n".join(lines) + "\n"


def _histogram_quantile(observations: Sequence[float], q: float = 0.9) -> float:
    """Prometheus's histogram_quantile over BOUNDS (linear within the bucket holding the rank)."""
    counts = [sum(1 for value in observations if value <= bound) for bound in BOUNDS]
    rank = q * len(observations)
    index = bisect.bisect_left(counts, rank)
    lower, below = (BOUNDS[index - 1], counts[index - 1]) if index else (0.0, 0)
    return lower + (BOUNDS[index] - lower) * (rank - below) / (counts[index] - below)


def _two_legs(prefill: Sequence[float], decode: Sequence[float]) -> float:
    mean_p, mean_d = sum(prefill) / len(prefill), sum(decode) / len(decode)
    excess_p, excess_d = _histogram_quantile(prefill) - mean_p, _histogram_quantile(decode) - mean_d
    return mean_p + mean_d + math.hypot(excess_p, excess_d)


TTFT = "vllm:time_to_first_token_seconds"
ROUTER = "vllm_router_pd_request_duration_seconds"
# pdd -> (role or None for the router, what that target exports)
TARGETS: dict[str, list[tuple[str | None, Callable[[], str]]]] = {
    "full": [
        ("prefill", lambda: _histogram(TTFT, PREFILL_TTFT, 1.0)),
        ("decode", lambda: _histogram(TTFT, DECODE_TTFT, 1.0)),
        (None, lambda: _histogram(ROUTER, ROUTER_UNTIL_DECODE, 1.0)),
    ],
    "late-decode-answer": [
        ("prefill", lambda: _histogram(TTFT, PREFILL_TTFT, 1.0)),
        ("decode", lambda: _histogram(TTFT, DECODE_TTFT, 1.0)),
        (None, lambda: _histogram(ROUTER, ROUTER_UNTIL_LATE_DECODE, 1.0)),
    ],
    "unscraped-router": [
        ("prefill", lambda: _histogram(TTFT, PREFILL_TTFT, 1.0)),
        ("decode", lambda: _histogram(TTFT, DECODE_TTFT, 1.0)),
    ],
    "decode-holds-it": [  # xpyd's simulator: prefill records no TTFT, decode the users'
        ("prefill", lambda: _histogram(TTFT, (), 1.0)),
        ("decode", lambda: _histogram(TTFT, DECODE_TTFT, 1.0)),
        (None, lambda: _histogram(ROUTER, ROUTER_UNTIL_DECODE, 1.0)),
    ],
}


@pytest.fixture(scope="module")
def answers_by_pdd() -> Iterator[dict[str, float | None]]:
    with contextlib.ExitStack() as stack:
        static_configs: list[dict[str, Any]] = []
        for pdd, targets in TARGETS.items():
            for role, render in targets:
                address = stack.enter_context(loopback_server(exposition_handler(render)))
                labels = {"namespace": "serving", "pdd": pdd} | ({"role": role} if role else {})
                static_configs.append({"targets": [address], "labels": labels})
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "scrape_configs": [{"job_name": "ttft", "static_configs": static_configs}],
        }
        prometheus: PrometheusServer = stack.enter_context(start_prometheus(config))
        source = PrometheusSource(prometheus.url)
        queries = {pdd: build_queries(VLLM, Scope("serving", pdd, 10), VLLM_ROUTER) for pdd in TARGETS}

        def answers() -> dict[str, float | None]:
            return {pdd: source.query_all({0: q[Signal.TTFT_P90]})[0] for pdd, q in queries.items()}

        # enough scrapes for every rate(): each answer is there and steady
        wait_until(lambda: all(v is not None for v in answers().values()), 60, "TTFT answers for every pdd")
        time.sleep(3)
        yield answers()


def test_two_legs_plus_the_routers_time_outside_prefills_clock(
    answers_by_pdd: dict[str, float | None],
) -> None:
    assert answers_by_pdd["full"] == pytest.approx(_two_legs(PREFILL_TTFT, DECODE_TTFT) + 0.25, rel=1e-3)


def test_a_late_decode_answer_adds_its_time_outside_prefills_clock(
    answers_by_pdd: dict[str, float | None],
) -> None:
    assert answers_by_pdd["late-decode-answer"] == pytest.approx(
        _two_legs(PREFILL_TTFT, DECODE_TTFT) + 3.0, rel=1e-3
    )


def test_without_router_series_the_two_legs(answers_by_pdd: dict[str, float | None]) -> None:
    assert answers_by_pdd["unscraped-router"] == pytest.approx(_two_legs(PREFILL_TTFT, DECODE_TTFT), rel=1e-3)


def test_without_prefill_samples_decodes_own(answers_by_pdd: dict[str, float | None]) -> None:
    assert answers_by_pdd["decode-holds-it"] == pytest.approx(_histogram_quantile(DECODE_TTFT), rel=1e-3)
