"""How far the capacity model is off for this deployment, learned from measured TTFT and KV.

The model predicts a TTFT quantile from Poisson arrivals, normal prompt lengths and the roofline. Live
traffic is burstier, lengths are skewed, engines are slower or faster than the roofline: the same
pool then shows a TTFT p90 above or below the model's. `PrefillCorrection` keeps one factor on the
prefill load: each window in which prefill alone explains the TTFT proposes the factor at which the
model's p90 on the serving pool equals the measured p90, and the factor follows the proposals with
time constant `calibration_s` (four times faster upwards: a miss costs more than a spare instance).
A window is prefill's to explain when its pool served it whole (the same ready count for a window,
nothing draining) and no work was already late when it began (a queue beyond one request per
instance, which the backlog term sizes, or requests waiting on decode: its TTFTs then measure that
wait; a queue that builds within the window is the traffic's burstiness, which the factor is there
to learn), the arrival rates measured over the last window are within `STEADY_RATE` of each other
(each covers a window of its own, so a step in load anywhere in the two, a crowd, a fall to a lull or
a return from it, shows: the TTFTs of such a window are not what its mean rate explains), and no
request waits on decode at its end (decode's misses are decode's).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from xpyd_controller.model.sizing import PoolConfig, Slo, Workload, prefill_ttft_quantile
from xpyd_controller.model.specs import GpuSpec, LinkSpec, ModelSpec
from xpyd_controller.policy.state import JsonMap, StateError, flag, maybe_number, number, vector
from xpyd_controller.policy.types import Observation
from xpyd_controller.policy.xpyd.demand import Lengths

FACTORS = np.geomspace(1.0, 4.0, 13)  # the factors a window is tried at (the model's TTFT rises with them)
MEASURED_QUANTILE = 0.9  # the measured TTFT quantile (the observation's p90) the model is held to
UP_SPEEDUP = 4.0
DECODE_KV_FULL = 0.95  # decode KV usage from which a TTFT is decode's to explain
# A window teaches the factor only where the model's TTFT moves with load: by at least this ratio
# between the lowest and the highest factor tried (else any factor explains the measurement).
LOAD_SENSITIVE = 1.5
STEADY_RATE = 1.5  # a window teaches only if the rates measured over it are within this ratio
MAX_KEPT_RATES = 64  # rates a kept state may hold (one window of observations)


@dataclass(frozen=True)
class Hardware:
    """What the model needs to predict a TTFT."""

    model: ModelSpec
    gpu: GpuSpec
    link: LinkSpec
    slo: Slo
    pools: PoolConfig


def decode_explains_ttft(observation: Observation) -> bool:
    """Requests wait on decode (for KV room or their pull), or its KV cache is full: first tokens then
    wait for decode, and more prefill would only deliver them to the same busy decode pool sooner."""
    waiting, usage = observation.decode_waiting, observation.decode_kv_usage
    waits = waiting is not None and math.isfinite(waiting) and waiting >= 1
    full = usage is not None and math.isfinite(usage) and usage >= DECODE_KV_FULL
    return waits or full


class PrefillCorrection:
    """A factor in [FACTORS[0], FACTORS[-1]] on the prefill load, learned from measured TTFT p90."""

    def __init__(self, calibration_s: float) -> None:
        self.calibration_s = calibration_s
        self.factor = 1.0
        self._time_s: float | None = None
        self._steady: tuple[float, float] | None = None  # (ready prefill instances, since when)
        self._late = False  # the last observation saw work already late (a backlog, or decode's)
        self._rates: list[tuple[float, float]] = []  # (time, arrival rate) over the last window

    def _steady_load(self, observation: Observation) -> bool:
        """Keep this observation's rate; True when every rate measured over the last window (this one
        included) is within `STEADY_RATE` of the others."""
        rate, now = observation.arrival_rate, observation.time_s
        if rate is None or not math.isfinite(rate) or rate <= 0:
            self._rates = []
            return False
        self._rates = [(t, r) for t, r in self._rates if now - t <= observation.window_s][
            -MAX_KEPT_RATES + 1 :
        ]
        self._rates.append((now, rate))
        rates = [r for _, r in self._rates]
        return len(rates) > 1 and max(rates) <= STEADY_RATE * min(rates)

    def _serving_whole_window(self, observation: Observation) -> bool:
        pool, queue = observation.prefill, observation.prefill_queue
        backlog = queue is not None and math.isfinite(queue) and queue > pool.ready
        late, self._late = self._late, backlog or decode_explains_ttft(observation)
        steady_load = self._steady_load(observation)
        steady = pool.draining == 0 and pool.ready > 0  # instances still starting served nothing yet
        if late or not steady_load:  # work already late when it began, or a step in load
            return False
        if not steady:
            self._steady = None
            return False
        if self._steady is None or self._steady[0] != pool.ready:
            self._steady = (float(pool.ready), observation.time_s)
        return observation.time_s - self._steady[1] >= observation.window_s

    def target(self, observation: Observation, lengths: Lengths, hardware: Hardware) -> float | None:
        """The factor this window proposes, or None when it is not prefill's to explain."""
        rate, measured = observation.arrival_rate, observation.ttft_p90_s
        whole = self._serving_whole_window(observation)
        if not whole or rate is None or not rate > 0 or measured is None or not math.isfinite(measured):
            return None
        if decode_explains_ttft(observation):
            return None
        predicted = prefill_ttft_quantile(
            hardware.model,
            hardware.gpu,
            hardware.link,
            Workload(
                rate * FACTORS, lengths.isl, lengths.osl, lengths.hit_rate, lengths.isl_std, lengths.osl_std
            ),
            hardware.slo,
            instances=observation.prefill.ready,
            quantile=MEASURED_QUANTILE,
            pools=hardware.pools,
        )
        finite = np.isfinite(predicted)
        if not finite[0]:
            return float(FACTORS[0])  # saturated even at the lowest factor: nothing to learn from
        if finite[-1] and predicted[-1] < LOAD_SENSITIVE * predicted[0]:
            return None  # a lightly loaded pool: its TTFT is the prefill itself and says nothing of load
        top = int(np.flatnonzero(finite)[-1])
        if measured >= predicted[top]:
            return float(FACTORS[top + 1] if top + 1 < len(FACTORS) else FACTORS[-1])
        return float(np.interp(measured, predicted[: top + 1], FACTORS[: top + 1]))

    def update(self, time_s: float, target: float | None) -> None:
        """Follow `target` (None: nothing learned this window; only the clock moves)."""
        last, self._time_s = self._time_s, time_s
        if target is None or last is None:
            return
        tau = self.calibration_s / UP_SPEEDUP if target > self.factor else self.calibration_s
        weight = 1.0 - math.exp(-max(time_s - last, 0.0) / tau)
        self.factor = float(np.clip(self.factor + weight * (target - self.factor), FACTORS[0], FACTORS[-1]))

    def state(self) -> dict[str, Any]:
        return {
            "factor": self.factor,
            "timeS": self._time_s,
            "steady": None if self._steady is None else list(self._steady),
            "late": self._late,
            "rates": [list(pair) for pair in self._rates],
        }

    def restore(self, data: JsonMap, latest_s: float) -> None:
        """Continue from `state()`'s output (a `StateError` leaves this unchanged)."""
        factor = number(data, "factor", float(FACTORS[0]), float(FACTORS[-1]))
        time_s = maybe_number(data, "timeS", high=latest_s)
        steady = None
        if data.get("steady") is not None:
            ready, since = vector(data, "steady", 2)
            if ready < 1 or ready != int(ready) or since > latest_s:
                raise StateError(
                    "steady",
                    data["steady"],
                    f"must be a whole number of instances >= 1 since no later than {latest_s:g}",
                )
            steady = (ready, since)
        late, rates = flag(data, "late"), _kept_rates(data, latest_s)
        self.factor, self._time_s, self._steady, self._late = factor, time_s, steady, late
        self._rates = rates


def _kept_rates(data: JsonMap, latest_s: float) -> list[tuple[float, float]]:
    """The kept (time, rate) pairs: at most `MAX_KEPT_RATES`, none later than `latest_s`, rates > 0."""
    kept = data.get("rates", [])
    if not isinstance(kept, list) or len(kept) > MAX_KEPT_RATES:
        raise StateError("rates", kept, f"must be a list of at most {MAX_KEPT_RATES} [time, rate] pairs")
    pairs = [vector({"rates": pair}, "rates", 2) for pair in kept]
    if any(t > latest_s or r <= 0 for t, r in pairs):
        raise StateError("rates", kept, f"needs times no later than {latest_s:g} and rates > 0")
    return [(t, r) for t, r in pairs]


KV_FACTORS = (0.25, 2.0)  # the range of the KV correction
KV_MEASURABLE = 0.5  # decode KV usage from which the batch at full KV is read from the running requests


class DecodeCorrection:
    """A factor on decode's KV room: the sessions an instance holds at full KV, measured, over the
    model's cap. The model holds a session's mean context (prompt + half the answer) in HBM after the
    weights; an engine reserves blocks, keeps a memory margin, holds long tails: where decode's KV is
    at least half full, the requests running per full instance measure what it really holds. The
    factor follows the measurements with `calibration_s` (four times faster downwards: a full KV cache
    stalls every request behind it)."""

    def __init__(self, calibration_s: float) -> None:
        self.calibration_s = calibration_s
        self.factor = 1.0
        self._time_s: float | None = None

    @staticmethod
    def target(observation: Observation, model_cap: float) -> float | None:
        """The factor this window measures (`model_cap`: the model's KV-bound batch without the
        factor), or None when decode's KV is too empty to say."""
        pool, usage, running = observation.decode, observation.decode_kv_usage, observation.decode_running
        if pool.ready == 0 or usage is None or running is None or not model_cap > 0:
            return None
        if not (math.isfinite(usage) and math.isfinite(running)) or running < pool.ready:
            return None
        serving = usage * (pool.ready + pool.starting) / pool.ready  # a starting instance holds no KV yet
        if serving < KV_MEASURABLE:
            return None
        full_batch = running / pool.ready / min(serving, 1.0)
        return float(np.clip(full_batch / model_cap, *KV_FACTORS))

    def update(self, time_s: float, target: float | None) -> None:
        last, self._time_s = self._time_s, time_s
        if target is None or last is None:
            return
        tau = self.calibration_s / UP_SPEEDUP if target < self.factor else self.calibration_s
        weight = 1.0 - math.exp(-max(time_s - last, 0.0) / tau)
        self.factor = float(np.clip(self.factor + weight * (target - self.factor), *KV_FACTORS))

    def state(self) -> dict[str, Any]:
        return {"factor": self.factor, "timeS": self._time_s}

    def restore(self, data: JsonMap, latest_s: float) -> None:
        """Continue from `state()`'s output (a `StateError` leaves this unchanged)."""
        factor = number(data, "factor", *KV_FACTORS)
        self.factor, self._time_s = factor, maybe_number(data, "timeS", high=latest_s)
