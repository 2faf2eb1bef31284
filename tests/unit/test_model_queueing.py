"""Erlang C and the M/G/x wait approximation against an independent factorial implementation."""

from __future__ import annotations

import math

import numpy as np
import pytest

from xpyd_controller.model.queueing import erlang_c, mean_wait, min_servers_for_wait_quantile, wait_quantile


def erlang_c_by_factorials(servers: int, load: float) -> float:
    """Textbook Erlang C: (a^x/x!)·x/(x−a) / (Σ_{k<x} a^k/k! + (a^x/x!)·x/(x−a))."""
    top = load**servers / math.factorial(servers) * servers / (servers - load)
    return top / (sum(load**k / math.factorial(k) for k in range(servers)) + top)


@pytest.mark.parametrize(
    ("servers", "load"),
    [(1, 0.5), (2, 1.0), (3, 2.9), (10, 8.0), (25, 20.5), (60, 41.0), (120, 118.2)],
)
def test_erlang_c_matches_textbook(servers: int, load: float) -> None:
    assert float(erlang_c(servers, load)) == pytest.approx(erlang_c_by_factorials(servers, load), rel=1e-9)


def test_erlang_c_edges_and_broadcast() -> None:
    assert float(erlang_c(2, 1.0)) == pytest.approx(1 / 3)
    np.testing.assert_allclose(erlang_c(np.array([1, 1, 3]), np.array([0.25, 0.75, 3.0])), [0.25, 0.75, 1.0])
    assert float(erlang_c(0, 0.0)) == 0.0


def test_mean_wait_is_mm1_for_exponential_service() -> None:
    # M/M/1: E[W] = ρ·E[S]/(1 − ρ); Allen–Cunneen with c_s² = 1 is exact here.
    assert float(mean_wait(1, 0.8, 2.0, 1.0)) == pytest.approx(0.8 * 2.0 / 0.2)
    assert float(mean_wait(4, 4.0, 1.0, 1.0)) == math.inf  # saturated


def test_wait_quantile_zero_when_few_wait() -> None:
    assert float(wait_quantile(50, 10.0, 1.0, 0.0, 0.9)) == 0.0
    assert float(wait_quantile(1, 0.95, 1.0, 0.0, 0.9)) > 0


@pytest.mark.parametrize("budget", [0.0, 0.05, 0.5, 5.0])
def test_min_servers_is_minimal(budget: float) -> None:
    loads = np.array([0.3, 2.5, 7.0, 33.3, 180.0])
    servers, wait = min_servers_for_wait_quantile(loads, 1.0, 0.3, 0.95, budget)
    np.testing.assert_allclose(wait, wait_quantile(servers, loads, 1.0, 0.3, 0.95))
    assert np.all(wait <= budget + 1e-12)
    smaller = servers - 1
    stable = smaller > loads
    assert np.all(wait_quantile(smaller[stable], loads[stable], 1.0, 0.3, 0.95) > budget)
