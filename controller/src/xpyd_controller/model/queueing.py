"""Waiting in a pool of identical servers (M/G/x), vectorised: why a pool at utilisation → 1 misses SLOs.

Approximation (documented in docs/capacity-model.md):
- Erlang C, `C(x, a)`, the probability that an arrival waits in M/M/x with offered load `a = λ·E[S]`.
- Allen–Cunneen for general service times: the mean wait of M/M/x scaled by `(c_a² + c_s²)/2`, with
  `c_a² = 1` (Poisson arrivals) and `c_s²` the squared coefficient of variation of the service time.
- The tail: given that it waits, an arrival's wait is taken as exponential with that mean, so
  `P(W > t) ≈ C · exp(-t · (x − a) / (E[S] · k))` with `k = (1 + c_s²)/2`, and the q-quantile is
  `W_q = 0` when `C ≤ 1 − q`, else `E[S] · k · ln(C / (1 − q)) / (x − a)`.

Erlang B is evaluated without factorials: `1/B(x, a) = Σ_k x!/((x−k)!·a^k)` at the first stable pool
size `x₀ = ⌊a⌋ + 1` (the terms fall off like exp(−k²/2a), so ~9√a terms), then the stable recursion
`B(x+1) = a·B / (x + 1 + a·B)` walks up. Each loop runs only on the scenarios still unresolved.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from xpyd_controller.model.roofline import FloatArray, Numeric

IntArray = npt.NDArray[np.int64]

_SERIES_TOLERANCE = 1e-16


def _erlang_b_at_first_stable_size(load: FloatArray) -> tuple[IntArray, FloatArray]:
    """(x₀, B(x₀, a)) with x₀ = ⌊a⌋ + 1, the smallest pool that is not saturated."""
    servers = np.floor(load).astype(np.int64) + 1
    inverse = np.ones_like(load)
    term = np.ones_like(load)
    active = np.flatnonzero(load > 0)
    k = 1
    while active.size:
        # A vanishing load (≲1e-308) overflows 1/a to inf, i.e. B = 0: the right limit, so no warning.
        with np.errstate(over="ignore"):
            term[active] *= (servers[active] - k + 1) / load[active]
        inverse[active] += term[active]
        finished = (term[active] < _SERIES_TOLERANCE * inverse[active]) | (k >= servers[active])
        active = active[~finished]
        k += 1
    return servers, 1.0 / inverse


def _erlang_c_from_b(servers: FloatArray, load: FloatArray, blocking: FloatArray) -> FloatArray:
    return servers * blocking / (servers - load * (1.0 - blocking))


def erlang_c(servers: Numeric, load: Numeric) -> FloatArray:
    """P(an arrival waits) in M/M/x with `servers` servers and offered load `load` (1 when x ≤ a)."""
    x_target, offered = np.broadcast_arrays(np.asarray(servers, np.int64), np.asarray(load, np.float64))
    x_target = x_target.ravel()
    offered = offered.ravel().copy()
    x, blocking = _erlang_b_at_first_stable_size(offered)
    active = np.flatnonzero(x < x_target)
    while active.size:
        a_b = offered[active] * blocking[active]
        x[active] += 1
        blocking[active] = a_b / (x[active] + a_b)
        active = active[x[active] < x_target[active]]
    waiting = _erlang_c_from_b(x.astype(np.float64), offered, blocking)
    waiting = np.where(offered == 0, 0.0, np.where(x_target <= offered, 1.0, waiting))
    result: FloatArray = waiting.reshape(np.broadcast_shapes(np.shape(servers), np.shape(load)))
    return result


def wait_quantile(
    servers: Numeric, load: Numeric, mean_service: Numeric, service_cv2: Numeric, quantile: float
) -> FloatArray:
    """The q-quantile of the queueing delay (seconds); +inf when the pool is saturated (x ≤ a)."""
    x = np.asarray(servers, np.float64)
    a = np.asarray(load, np.float64)
    waiting = erlang_c(servers, load)
    with np.errstate(divide="ignore", invalid="ignore"):
        tail = (
            np.asarray(mean_service)
            * (1.0 + np.asarray(service_cv2))
            / 2.0
            * np.log(waiting / (1.0 - quantile))
            / (x - a)
        )
    result: FloatArray = np.where(waiting <= 1.0 - quantile, 0.0, np.where(x <= a, np.inf, tail))
    return result


def mean_wait(servers: Numeric, load: Numeric, mean_service: Numeric, service_cv2: Numeric) -> FloatArray:
    """Allen–Cunneen mean queueing delay (seconds); +inf when the pool is saturated (x ≤ a)."""
    x = np.asarray(servers, np.float64)
    a = np.asarray(load, np.float64)
    waiting = erlang_c(servers, load)
    with np.errstate(divide="ignore", invalid="ignore"):
        wait = waiting * np.asarray(mean_service) * (1.0 + np.asarray(service_cv2)) / 2.0 / (x - a)
    result: FloatArray = np.where(waiting == 0, 0.0, np.where(x <= a, np.inf, wait))
    return result


def min_servers_for_wait_quantile(
    load: Numeric, mean_service: Numeric, service_cv2: Numeric, quantile: float, wait_budget: Numeric
) -> IntArray:
    """Smallest pool whose q-quantile wait is within `wait_budget` seconds (≥ ⌊a⌋ + 1).

    Terminates for any budget ≥ 0: once C(x, a) ≤ 1 − q the quantile wait is 0. Callers flag
    budgets < 0 (the SLO is below the service-time floor) themselves; those get ⌊a⌋ + 1 here.
    """
    shape = np.broadcast_shapes(
        np.shape(load), np.shape(mean_service), np.shape(service_cv2), np.shape(wait_budget)
    )
    offered = np.broadcast_to(np.asarray(load, np.float64), shape).ravel().copy()
    service = np.broadcast_to(np.asarray(mean_service, np.float64), shape).ravel()
    spread = (1.0 + np.broadcast_to(np.asarray(service_cv2, np.float64), shape).ravel()) / 2.0
    budget = np.broadcast_to(np.asarray(wait_budget, np.float64), shape).ravel()
    x, blocking = _erlang_b_at_first_stable_size(offered)
    threshold = 1.0 - quantile

    def too_slow(idx: IntArray) -> IntArray:
        xs = x[idx].astype(np.float64)
        a = offered[idx]
        waiting = _erlang_c_from_b(xs, a, blocking[idx])
        with np.errstate(divide="ignore"):
            quantile_wait = service[idx] * spread[idx] * np.log(np.maximum(waiting, threshold) / threshold)
        exceeded = (waiting > threshold) & (quantile_wait > budget[idx] * (xs - a)) & (budget[idx] >= 0)
        return idx[exceeded]

    active = too_slow(np.flatnonzero(offered > 0))
    while active.size:
        a_b = offered[active] * blocking[active]
        x[active] += 1
        blocking[active] = a_b / (x[active] + a_b)
        active = too_slow(active)
    servers: IntArray = np.where(offered > 0, x, 0).reshape(shape)
    return servers
