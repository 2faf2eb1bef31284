"""What a policy in the loop reads: the fleet's composition and load at a scrape, and statistics over
the time windows a Prometheus-fed controller would query (percentiles, weighted means).
"""

from __future__ import annotations

from bisect import bisect_left

from xpyd_controller.sim.engine_instance import (
    CONVERTING,
    DECODE,
    DRAINING,
    PREFILL,
    READY,
    STARTING,
    Instance,
)
from xpyd_controller.sim.engine_records import PoolSample


def sample_pools(
    instances: list[Instance], t: float, prefill_waiting: int, decode_waiting: int, kv_cap_tokens: int
) -> PoolSample:
    """Fleet composition and load at t, as a scrape sees it (converting instances count as draining
    in their old role and starting in their new one)."""
    counts = {(r, s): 0 for r in (PREFILL, DECODE) for s in (STARTING, READY, DRAINING)}
    queued = float(prefill_waiting)
    running = 0
    waiting = float(decode_waiting)
    kv = []
    for inst in instances:
        role, state = inst.role, inst.state
        if state == CONVERTING:
            counts[(role, DRAINING)] += 1
            counts[(inst.target_role, STARTING)] += 1
            continue
        counts[(role, state)] += 1
        if role == PREFILL:
            queued += max(0, inst.prefill_load(t) - 1)
        else:
            running += inst.size
            queued += len(inst.queue)
            waiting += len(inst.queue)
            kv.append(inst.kv_used / kv_cap_tokens if kv_cap_tokens else 1.0)
    return PoolSample(
        time_s=t,
        prefill_ready=counts[(PREFILL, READY)],
        prefill_starting=counts[(PREFILL, STARTING)],
        prefill_draining=counts[(PREFILL, DRAINING)],
        decode_ready=counts[(DECODE, READY)],
        decode_starting=counts[(DECODE, STARTING)],
        decode_draining=counts[(DECODE, DRAINING)],
        prefill_queue=queued,
        decode_running=float(running),
        decode_kv_usage=numpy_mean(kv) if kv else 0.0,
        decode_waiting=waiting,
    )


def window_p90(times: list[float], values: list[float], start: float, end: float) -> float | None:
    lo, hi = bisect_left(times, start), bisect_left(times, end)
    if hi <= lo:
        return None
    import numpy as np  # only a policy in the loop reads windowed percentiles

    return float(np.percentile(values[lo:hi], 90))


def numpy_mean(values: list[float]) -> float:
    """`numpy.mean` to the last bit (its pairwise summation), without numpy: the decode KV usage
    that policies read stays what the benchmark tables were measured with."""
    return pairwise_sum(values, 0, len(values)) / len(values)


def pairwise_sum(values: list[float], start: int, count: int) -> float:
    """numpy's float64 pairwise sum of values[start:start + count]: sequential below 8 values,
    8 interleaved partial sums up to 128, halves (at a multiple of 8) beyond."""
    if count < 8:
        total = 0.0
        for i in range(start, start + count):
            total += values[i]
        return total
    if count <= 128:
        partial = values[start : start + 8]
        end = start + count - count % 8
        i = start + 8
        while i < end:
            for j in range(8):
                partial[j] += values[i + j]
            i += 8
        total = ((partial[0] + partial[1]) + (partial[2] + partial[3])) + (
            (partial[4] + partial[5]) + (partial[6] + partial[7])
        )
        while i < start + count:
            total += values[i]
            i += 1
        return total
    half = count // 2
    half -= half % 8
    return pairwise_sum(values, start, half) + pairwise_sum(values, start + half, count - half)


def window_mean(
    times: list[float], values: list[float], weights: list[float], start: float, end: float
) -> float | None:
    """The weighted mean of the values timed in [start, end) (a histogram's sum over its count)."""
    lo, hi = bisect_left(times, start), bisect_left(times, end)
    total = sum(weights[lo:hi])
    if total <= 0:
        return None
    return sum(v * w for v, w in zip(values[lo:hi], weights[lo:hi], strict=True)) / total
