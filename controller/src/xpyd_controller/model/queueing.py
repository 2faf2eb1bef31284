"""Waiting in a pool of identical servers (M/G/x), vectorised: why a pool at utilisation → 1 misses SLOs.

Approximation (documented in docs/capacity-model.md):
- Erlang C, `C(x, a)`, the probability that an arrival waits in M/M/x with offered load `a = λ·E[S]`.
- Allen–Cunneen for general service times: the mean wait of M/M/x scaled by `(c_a² + c_s²)/2`, with
  `c_a² = 1` (Poisson arrivals) and `c_s²` the squared coefficient of variation of the service time.
- The tail: given that it waits, an arrival's wait is taken as exponential with that mean, so
  `P(W > t) ≈ C · exp(-t · (x − a) / (E[S] · k))` with `k = (1 + c_s²)/2`, and the q-quantile is
  `W_q = 0` when `C ≤ 1 − q`, else `E[S] · k · ln(C / (1 − q)) / (x − a)`.

Erlang B is evaluated without factorials: `1/B(x, a) = Σ_k x!/((x−k)!·a^k)` at the first stable pool
size `x₀ = ⌊a⌋ + 1` (the terms fall off like exp(−k²/2a), so ~8√a terms to 1e-13), then the stable recursion
`B(x+1) = a·B / (x + 1 + a·B)` walks up. Each loop runs only on the scenarios still unresolved.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    from xpyd_controller.model.roofline import FloatArray, Numeric


IntArray = npt.NDArray[np.int64]

_SERIES_TOLERANCE = 1e-13
_COMPACT_EVERY = 16


def _erlang_b_at_first_stable_size(load: FloatArray) -> tuple[IntArray, FloatArray]:
    """(x₀, B(x₀, a)) with x₀ = ⌊a⌋ + 1, the smallest pool that is not saturated.

    The series runs on dense copies of the unfinished scenarios, compacted every few terms (extra
    terms are harmless: they are below tolerance, or 0 once k > x₀).
    """
    servers = np.floor(load).astype(np.int64) + 1
    # One server (a < 1, often most scenarios): 1/B(1, a) = 1 + 1/a in closed form (inf, B = 0, at a → 0).
    with np.errstate(divide="ignore", over="ignore"):
        inverse = np.where(load < 1, 1 + 1 / load, 1.0)
    index = np.flatnonzero(load >= 1)
    x = servers[index].astype(np.float64)
    per_load = 1.0 / load[index]
    term = np.ones_like(x)
    total = np.ones_like(x)
    factor = x * per_load  # (x₀ − k + 1)/a for k = 1, then lowered by 1/a per term
    k = 1
    while index.size:
        term *= factor
        total += term
        factor -= per_load
        if k % _COMPACT_EVERY == 0:
            done = (term < _SERIES_TOLERANCE * total) | (k >= x)
            if done.any():
                inverse[index[done]] = total[done]
                keep = ~done
                index = index[keep]
                x, per_load, term, total, factor = (
                    x[keep],
                    per_load[keep],
                    term[keep],
                    total[keep],
                    factor[keep],
                )
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


def _quantile_wait(
    waiting: FloatArray, servers: FloatArray, load: FloatArray, scaled_service: FloatArray, quantile: float
) -> FloatArray:
    """W_q = E[S]·k·ln(C/(1−q))/(x − a), 0 when C ≤ 1 − q, +inf when saturated; scaled_service = E[S]·k."""
    with np.errstate(divide="ignore", invalid="ignore"):
        tail = scaled_service * np.log(waiting / (1.0 - quantile)) / (servers - load)
    result: FloatArray = np.where(waiting <= 1.0 - quantile, 0.0, np.where(servers <= load, np.inf, tail))
    return result


def wait_quantile(
    servers: Numeric, load: Numeric, mean_service: Numeric, service_cv2: Numeric, quantile: float
) -> FloatArray:
    """The q-quantile of the queueing delay (seconds); +inf when the pool is saturated (x ≤ a)."""
    scaled = np.asarray(mean_service, np.float64) * (1.0 + np.asarray(service_cv2, np.float64)) / 2.0
    x, a = np.asarray(servers, np.float64), np.asarray(load, np.float64)
    return _quantile_wait(erlang_c(servers, load), x, a, scaled, quantile)


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
) -> tuple[IntArray, FloatArray]:
    """Smallest pool whose q-quantile wait is within `wait_budget` seconds (≥ ⌊a⌋ + 1), and that wait.

    Terminates for any budget ≥ 0 (callers clip): once C(x, a) ≤ 1 − q the quantile wait is 0.
    """
    shape = np.broadcast_shapes(
        np.shape(load), np.shape(mean_service), np.shape(service_cv2), np.shape(wait_budget)
    )

    def flat(value: Numeric) -> FloatArray:
        return np.broadcast_to(np.asarray(value, np.float64), shape).ravel()

    offered = flat(load)
    scaled_service = flat(mean_service) * (1.0 + flat(service_cv2)) / 2.0
    x_start, b_start = _erlang_b_at_first_stable_size(offered.copy())
    servers = np.where(offered > 0, x_start, 0).astype(np.float64)
    blocking = b_start
    threshold = 1.0 - quantile
    # Walk x up on dense copies of the scenarios whose quantile wait is still over budget.
    index = np.flatnonzero(offered > 0)
    x, a, b = servers[index], offered[index], blocking[index]
    scaled, budget = scaled_service[index], flat(wait_budget)[index]
    while index.size:
        waiting = _erlang_c_from_b(x, a, b)
        with np.errstate(divide="ignore"):
            log_ratio = np.log(np.maximum(waiting, threshold) / threshold)
        over = (waiting > threshold) & (scaled * log_ratio > budget * (x - a))
        servers[index], blocking[index] = x, b
        index = index[over]
        x, a, b, scaled, budget = x[over], a[over], b[over], scaled[over], budget[over]
        load_blocked = a * b
        x = x + 1
        b = load_blocked / (x + load_blocked)
    with np.errstate(divide="ignore", invalid="ignore"):  # 0/0 where there is no load; masked out
        waiting = np.where(offered > 0, _erlang_c_from_b(servers, offered, blocking), 0.0)
    wait = _quantile_wait(waiting, servers, offered, scaled_service, quantile)
    return servers.astype(np.int64).reshape(shape), wait.reshape(shape)
