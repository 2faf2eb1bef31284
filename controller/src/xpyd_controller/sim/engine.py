"""The event loop: instances, routing, KV handoff, admission, lifecycles and the policy in the loop.

Speed comes from never simulating one decode step at a time when nothing changes: a batch runs a
*run* of identical steps up to its next departure in one event (co-located GPUs run *cycles*, a
chunk then a step, alike until the prefill head's last chunk or the next departure). An arrival or
admission that lands mid-run settles the steps already done; the step in flight keeps the length
fixed when it started (as in the seed), and a newcomer extends it into the next run. A FIFO prefill
instance knows each job's completion when the job is assigned, so prefills need no events at all.
Seed semantics kept exactly: least-loaded routing with ties to the lowest index, strict chunk/step
alternation on co-located GPUs, and a request admitted during a decode step takes part in that
step (its first token comes at that step's end).

Its parts, compiled together into one build by hack/native (every `engine*.py`):
- engine.py: the loop, its events and handlers (timing, lifecycle, routing, batch operations,
  applying a policy's decision by the shared resize rule);
- engine_instance.py: an instance's lifecycle and engine state, its token-gap stack;
- engine_link.py: the shared link KV transfers divide (processor sharing);
- engine_observe.py: what a policy in the loop reads (pool samples, windowed statistics);
- engine_records.py: what a run returns (RawRun, PoolSample).
"""

from __future__ import annotations

import gc
import math
from bisect import bisect_left
from collections import defaultdict, deque
from heapq import heappop, heappush
from itertools import accumulate
from typing import Any, Final

from xpyd_api.names import Role
from xpyd_api.resize import Member, Moves, resize
from xpyd_controller.model.roofline import decode_step_times, kv_transfer_times, prefill_times
from xpyd_controller.policy.types import Decision, Limits, Observation, Policy, PoolState
from xpyd_controller.sim.config import SimConfig, SimConfigError
from xpyd_controller.sim.engine_instance import (
    CHUNK,
    CONVERTING,
    CYCLE,
    DECODE,
    DRAINING,
    IDLE,
    PREFILL,
    READY,
    RUN,
    STARTING,
    Instance,
    record_gap,
    smallest_batch,
)
from xpyd_controller.sim.engine_link import SharedLink
from xpyd_controller.sim.engine_observe import sample_pools, window_mean, window_p90
from xpyd_controller.sim.engine_records import PoolSample, ProgressFn, RawRun
from xpyd_controller.sim.stats import gap_bin
from xpyd_controller.sim.traces import Trace

__all__ = ["PoolSample", "ProgressFn", "RawRun", "run_events"]

# Event kinds (ints: compared in the hot loop).
_OP_END: Final = 0
_ADMIT: Final = 1
_XFER_START: Final = 2
_LINK_DONE: Final = 3
_TICK: Final = 4
_READY: Final = 5
_PREFILL_IDLE: Final = 6
_RETIRE: Final = 7
# Context bucket (tokens) for step times that read the batch's resident KV.
_CONTEXT_BUCKET: Final = 256
_HISTOGRAM_FOLD_AT: Final = 100_000  # distinct exact gap values kept before folding into log bins


class _Simulation:
    def __init__(
        self,
        config: SimConfig,
        requests: Trace,
        policy: Policy | None,
        limits: Limits,
        progress: ProgressFn | None,
    ) -> None:
        self.cfg = config
        self.policy = policy
        self.limits = limits
        self.progress = progress
        hw, real = config.hardware, config.realism
        self.disagg = config.fleet.mode == "disagg"
        self.n = n = len(requests)
        # Per-request columns as Python lists (the loop indexes them), timed by the roofline's list
        # functions: no numpy here, so a trace drawn in Python (the seed's) runs without loading it.
        columns = requests.columns
        self.arrival: list[float] = list(columns.arrival_s)
        self.requests = requests  # its arrays give the policy's windowed length percentiles
        self.output: list[int] = list(columns.output_tokens)
        prompt = [float(tokens) for tokens in columns.prompt_tokens]
        hits = columns.prefix_hit_tokens if real.prefix_cache else (0,) * n
        self.uncached = uncached = [p - h for p, h in zip(prompt, hits, strict=True)]
        width = hw.gpus_per_instance
        model, link = hw.model, hw.link
        self.prefill_s = prefill_times(model, hw.gpu, uncached, width)
        self.chunk_s = [seconds / hw.prefill_chunks for seconds in self.prefill_s]
        self.xfer_s = kv_transfer_times(model, link, prompt)
        self.xfer_tail_s = [(x - link.overhead) / model.layers + link.overhead for x in self.xfer_s]
        self.kv_bytes = [p * model.kv_bytes_per_token for p in prompt]
        self.kv_need = [p + o for p, o in zip(columns.prompt_tokens, self.output, strict=True)]
        self.ctx = [p + o / 2.0 for p, o in zip(prompt, self.output, strict=True)]
        free_hbm = hw.gpu.hbm_bytes * width * real.kv_memory_fraction - hw.model.weight_footprint_bytes
        self.kv_cap_tokens = max(0, int(free_hbm / hw.model.kv_bytes_per_token))
        self.enforce_kv = real.kv_capacity
        self.layerwise = real.layerwise_transfer
        if self.enforce_kv:
            _check_kv_fits(self.kv_need, self.kv_cap_tokens)
        self.chunks = hw.prefill_chunks
        self.local_threshold = real.local_prefill_threshold if self.disagg else None
        self.step_tables: dict[int, list[float]] = {}
        self.kv_reads = real.decode_kv_reads
        self.flat_steps = self._step_table(0, 256)
        # Per-request outputs.
        self.first_token = [math.nan] * n
        self.finish = [math.nan] * n
        self.max_gap = [0.0] * n
        self.gap_start = [0] * n  # a member's first index on its instance's gap stack
        self.prefill_done = [math.nan] * n
        self.gap_hist: defaultdict[float, int] = defaultdict(int)  # exact token gap (s) -> count
        self.gap_bins: dict[int, int] = {}  # folded: log bin -> count
        self.done_count = 0
        # Windowed signals for the policy: (event time, value) in time order; only a policy reads them.
        self.track_signals = policy is not None
        self.ttft_times: list[float] = []
        self.ttft_values: list[float] = []
        self.tpot_times: list[float] = []
        self.tpot_values: list[float] = []
        self.tpot_tokens: list[float] = []  # the tokens each TPOT value averages (a histogram's weight)
        # Fleet.
        # (time, sequence, kind, instance or request id by kind, version): `Any` so the hot loop
        # dispatches on `kind` without an isinstance check per event.
        self.heap: list[tuple[float, int, int, Any, int]] = []
        self.seq = 0
        self.uid = 0
        self.instances: list[Instance] = []
        self.ready: dict[str, list[Instance]] = {PREFILL: [], DECODE: []}
        self.prefill_wait: deque[int] = deque()
        self.decode_wait: deque[int] = deque()
        self.gpu_seconds = 0.0
        self.scale_ups = self.scale_downs = self.conversions = 0
        self.samples: list[PoolSample] = []
        self.decisions: list[tuple[float, Decision]] = []
        # KV transfers share one link only when the deployment caps its bandwidth.
        self.link_shared = real.shared_link_bandwidth is not None
        self.link = SharedLink(real.shared_link_bandwidth or 0.0, hw.link.bandwidth)
        self.prefix_sum_prompt, self.prefix_sum_output, self.prefix_sum_hits = _prefix_sums(
            prompt, self.output, uncached
        )
        fleet = config.fleet
        for _ in range(fleet.prefill):
            self._add_ready(self._new_instance(PREFILL, READY, 0.0))
        for _ in range(fleet.decode):
            self._add_ready(self._new_instance(DECODE, READY, 0.0))

    # ---- timing -------------------------------------------------------------------------------

    def _step_table(self, bucket: int, size: int) -> list[float]:
        hw = self.cfg.hardware
        context = (bucket + 0.5) * _CONTEXT_BUCKET if self.kv_reads else 0.0
        table = decode_step_times(
            hw.model,
            hw.gpu,
            range(size),
            context,
            gpus=hw.gpus_per_instance,
            step_overhead=hw.step_overhead_s,
        )
        self.step_tables[bucket] = table
        return table

    def _step_time(self, c: int, ctx_sum: float) -> float:
        """One decode step of a batch of c requests holding `ctx_sum` context tokens in all."""
        if not self.kv_reads:
            table = self.flat_steps
            if c >= len(table):
                table = self.flat_steps = self._step_table(0, 2 * c)
            return table[c]
        bucket = int(ctx_sum / c) // _CONTEXT_BUCKET
        table = self.step_tables.get(bucket) or self._step_table(bucket, 256)
        if c >= len(table):
            table = self._step_table(bucket, 2 * c)
        return table[c]

    # ---- events and lifecycle -------------------------------------------------------------------

    def _push(self, t: float, kind: int, obj: Instance | int | None = None, version: int = 0) -> None:
        self.seq += 1
        heappush(self.heap, (t, self.seq, kind, obj, version))

    def _new_instance(self, role: str, state: str, t: float) -> Instance:
        self.uid += 1
        inst = Instance(self.uid, role, state, t)
        self.instances.append(inst)
        return inst

    def _add_ready(self, inst: Instance) -> None:
        inst.state = READY
        ready = self.ready[inst.role]
        ready.append(inst)
        ready.sort(key=lambda i: i.uid)

    def _retire(self, inst: Instance, t: float) -> None:
        self.gpu_seconds += (t - inst.created_s) * self.cfg.hardware.gpus_per_instance
        self.instances.remove(inst)
        inst.version += 1

    def _leave_ready(self, inst: Instance) -> None:
        if inst.state == READY:
            self.ready[inst.role].remove(inst)

    def _check_drained(self, inst: Instance, t: float) -> None:
        """A draining or converting instance with nothing left: retire it or start its switch."""
        if inst.state not in (DRAINING, CONVERTING) or not inst.is_empty(t):
            return
        real = self.cfg.realism
        if inst.state == DRAINING and real.drain_s == 0:
            self._retire(inst, t)
            return
        inst.version += 1
        if inst.state == DRAINING:
            self._push(t + real.drain_s, _RETIRE, inst, inst.version)
        else:
            self._push(t + real.drain_s + real.conversion_s, _READY, inst, inst.version)

    def _on_ready(self, inst: Instance, t: float) -> None:
        if inst.state == CONVERTING:
            inst.reset(inst.target_role)
            self.conversions += 1
        self._add_ready(inst)
        self._admit_waiting(t)

    # ---- routing ----------------------------------------------------------------------------------

    def _arrive(self, rid: int, t: float) -> None:
        if not self.disagg or (
            self.local_threshold is not None and self.uncached[rid] < self.local_threshold
        ):
            if self.decode_wait or not self._enqueue_local(rid, t):
                self.decode_wait.append(rid)
            return
        ready = self.ready[PREFILL]
        if not ready:
            self.prefill_wait.append(rid)
            return
        best = ready[0]
        best_load = best.prefill_load(t)
        for inst in ready:
            if inst is not best:
                load = inst.prefill_load(t)
                if load < best_load:
                    best, best_load = inst, load
        self._assign_prefill(best, rid, t)

    def _assign_prefill(self, inst: Instance, rid: int, t: float) -> None:
        start = inst.free_at if inst.free_at > t else t
        done = start + self.prefill_s[rid]
        inst.free_at = done
        inst.done_times.append(done)
        self.prefill_done[rid] = done
        layerwise = self.layerwise
        if self.link_shared:
            self._push(start if layerwise else done, _XFER_START, rid)
        elif layerwise:
            self._push(max(done + self.xfer_tail_s[rid], start + self.xfer_s[rid]), _ADMIT, rid)
        else:
            self._push(done + self.xfer_s[rid], _ADMIT, rid)

    def _has_room(self, inst: Instance, rid: int) -> bool:
        return not self.enforce_kv or inst.kv_used + self.kv_need[rid] <= self.kv_cap_tokens

    def _enqueue_local(self, rid: int, t: float) -> bool:
        """Queue a prompt for chunked prefill on the least-loaded batch instance with room."""
        best: Instance | None = None
        best_load = 0
        for inst in self.ready[DECODE]:
            load = len(inst.queue) + inst.size
            if (best is None or load < best_load) and self._has_room(inst, rid):
                best, best_load = inst, load
        if best is None:
            return False
        best.queue.append(rid)
        best.kv_used += self.kv_need[rid]
        if best.op == IDLE:
            self._pump(best, t)
        elif best.op == RUN and best.op_n > 1:
            self._truncate(best, t)
            self._reschedule(best)
        return True

    def _admit(self, rid: int, t: float) -> None:
        """KV has arrived: join the decode instance with the smallest batch that has room."""
        if self.decode_wait or not self._join_decode(rid, t):
            self.decode_wait.append(rid)

    def _join_decode(self, rid: int, t: float) -> bool:
        ready = self.ready[DECODE]
        if not ready:
            return False
        if self.enforce_kv:
            roomy = [i for i in ready if self._has_room(i, rid)]
            if not roomy:
                return False
            best = smallest_batch(roomy)
        else:
            best = smallest_batch(ready)
        op = best.op
        best.kv_used += self.kv_need[rid]
        if op == IDLE:
            self._add_member(best, rid)
            self._pump(best, t)
        elif op != RUN and best.op_n == 1:
            self._add_member(best, rid)  # joins the step at the end of the cycle, or the next one
        else:
            self._truncate(best, t)
            self._add_member(best, rid)
            self._reschedule(best)
        return True

    def _admit_waiting(self, t: float) -> None:
        """FIFO admission after capacity freed up (head-of-line blocking, as a real queue has)."""
        wait = self.prefill_wait
        while wait and self.ready[PREFILL]:
            self._arrive(wait.popleft(), t)
        wait = self.decode_wait
        while wait:
            rid = wait[0]
            local = math.isnan(self.prefill_done[rid])
            placed = self._enqueue_local(rid, t) if local else self._join_decode(rid, t)
            if not placed:
                return
            wait.popleft()

    # ---- batch instances ------------------------------------------------------------------------

    def _add_member(self, inst: Instance, rid: int) -> None:
        inst.size += 1
        inst.fresh.append(rid)
        inst.ctx_sum += self.ctx[rid]
        heappush(inst.departures, (inst.steps + self.output[rid], rid))

    def _pump(self, inst: Instance, t: float) -> None:
        """Start the next operation of an idle batch instance (the seed's alternation rule).

        Strict alternation (step, chunk, step, ...) is scheduled in fused pieces: a run of steps up
        to the next departure when nothing waits for prefill; *cycles* (a chunk, then a step) while
        both a batch and a prefill queue exist, all alike until the head's last chunk or the next
        departure; the head's remaining chunks back to back when the batch is empty.
        """
        size, queue = inst.size, inst.queue
        if size and (not queue or not inst.alt):
            step = self._step_time(size, inst.ctx_sum)
            n = 1 if queue else inst.departures[0][0] - inst.steps
            inst.alt = True
            inst.op = RUN
            inst.op_start, inst.op_first, inst.op_step, inst.op_n = t, step, step, n
            inst.op_end = t + n * step
        elif size:
            head = queue[0]
            chunk = self.chunk_s[head]
            left = self.chunks - inst.chunks_done
            if left == 1:  # the head's last chunk: it joins before the step
                n = 1
                period = chunk + self._step_time(size + 1, inst.ctx_sum + self.ctx[head])
            else:  # identical cycles until the chunk before the last, or the next departure
                n = min(left - 1, inst.departures[0][0] - inst.steps)
                period = chunk + self._step_time(size, inst.ctx_sum)
            inst.op = CYCLE
            inst.op_start, inst.op_first, inst.op_step, inst.op_n = t, period, period, n
            inst.op_end = t + n * period
        elif queue:
            chunk = self.chunk_s[queue[0]]
            n = self.chunks - inst.chunks_done
            inst.alt = False
            inst.op = CHUNK
            inst.op_start, inst.op_first, inst.op_step, inst.op_n = t, chunk, chunk, n
            inst.op_end = t + n * chunk
        else:
            inst.op = IDLE
            return
        inst.version += 1
        self.seq += 1
        heappush(self.heap, (inst.op_end, self.seq, _OP_END, inst, inst.version))

    def _truncate(self, inst: Instance, t: float) -> None:
        """The batch or queue changes at t: settle the steps (or chunks) done; the one in flight becomes
        the operation. The caller changes the instance, then calls `_reschedule`."""
        first, step, start = inst.op_first, inst.op_step, inst.op_start
        if t >= start + first:
            done = 1 + min(int((t - start - first) / step), inst.op_n - 2)
            if inst.op != CHUNK:
                self._complete_steps(inst, done, start, first, step)
            if inst.op != RUN:
                inst.chunks_done += done
            inst.op_start = start + first + (done - 1) * step
            inst.op_first = step
        inst.op_n = 1

    def _reschedule(self, inst: Instance) -> None:
        """After `_truncate`: extend a step in flight into the run that follows it (when no prefill
        waits), so a newcomer costs no extra event; then schedule the operation's end."""
        if inst.op == RUN and not inst.queue:
            n = inst.departures[0][0] - inst.steps
            if n > 1:
                inst.op_step = self._step_time(inst.size, inst.ctx_sum)
            inst.op_n = n
        inst.op_end = inst.op_start + inst.op_first + (inst.op_n - 1) * inst.op_step
        inst.version += 1
        self.seq += 1
        heappush(self.heap, (inst.op_end, self.seq, _OP_END, inst, inst.version))

    def _complete_steps(self, inst: Instance, k: int, start: float, first: float, step: float) -> None:
        """Account for k steps from `start` (the first lasting `first`, the rest `step`): first tokens,
        token gaps, step count.

        The gap stack needs one entry per point where newcomers start counting: with no newcomers,
        the first gap and the later steps' gap share one entry (their maximum)."""
        first_end = start + first
        size = inst.size
        fresh = inst.fresh
        hist = self.gap_hist
        settled = size - len(fresh)
        later = (k - 1) * size  # tokens of the steps after the first, all gaps of `step`
        unrecorded = 0.0  # the largest gap since the last stack entry (gaps are > 0)
        if settled:
            gap = first_end - inst.last_step_end
            if not fresh and later and abs(gap - step) <= 1e-12 * step:  # one entry for the lot
                settled += later
                later = 0
            hist[gap] += settled
            unrecorded = gap
        if fresh:
            if unrecorded:
                record_gap(inst, unrecorded)
                unrecorded = 0.0
            start_index = inst.gap_count
            first_token, gap_start = self.first_token, self.gap_start
            for rid in fresh:
                first_token[rid] = first_end
                gap_start[rid] = start_index
            if self.track_signals:
                arrival = self.arrival
                self.ttft_values.extend([first_end - arrival[rid] for rid in fresh])
                self.ttft_times.extend([first_end] * len(fresh))
            fresh.clear()
        if later:
            hist[step] += later
            unrecorded = max(unrecorded, step)
        if unrecorded:
            record_gap(inst, unrecorded)
        inst.steps += k
        inst.last_step_end = first_end + (k - 1) * step

    def _fold_histogram(self) -> None:
        """Move exact gap values into log bins (bounded memory on long co-located runs)."""
        for gap, count in self.gap_hist.items():
            key = gap_bin(gap)
            self.gap_bins[key] = self.gap_bins.get(key, 0) + count
        self.gap_hist.clear()

    def _op_end(self, inst: Instance, t: float) -> None:
        op = inst.op
        inst.op = IDLE
        if op != RUN:  # chunks or cycles: the head's chunks (it joins only at the last)
            inst.chunks_done += inst.op_n
            if inst.chunks_done == self.chunks:
                inst.chunks_done = 0
                self._add_member(inst, inst.queue.popleft())
            if op == CHUNK:
                self._pump(inst, t)
                return
        self._complete_steps(inst, inst.op_n, inst.op_start, inst.op_first, inst.op_step)
        departures = inst.departures
        steps = inst.steps
        departed = False
        while departures and departures[0][0] <= steps:
            self._depart(inst, heappop(departures)[1], t)
            departed = True
        self._pump(inst, t)
        if inst.op == IDLE and inst.state != READY:
            self._check_drained(inst, t)
        if departed and self.decode_wait:
            self._admit_waiting(t)

    def _depart(self, inst: Instance, rid: int, t: float) -> None:
        inst.size -= 1
        inst.kv_used -= self.kv_need[rid]
        inst.ctx_sum -= self.ctx[rid]
        at = inst.gap_max_at
        index = bisect_left(at, self.gap_start[rid])
        if index < len(at):
            self.max_gap[rid] = inst.gap_max_value[index]
        self.finish[rid] = t
        out = self.output[rid]
        if out > 1 and self.track_signals:
            self.tpot_values.append((t - self.first_token[rid]) / (out - 1))
            self.tpot_tokens.append(float(out - 1))
            self.tpot_times.append(t)
        self.done_count += 1

    def _folded_histogram(self) -> dict[int, int]:
        self._fold_histogram()
        return self.gap_bins

    # ---- shared link ------------------------------------------------------------------------------

    def _link_start(self, rid: int, t: float) -> None:
        self.link.start(rid, self.kv_bytes[rid], t)
        self._link_reschedule(t)

    def _link_reschedule(self, t: float) -> None:
        finish = self.link.next_finish(t)
        if finish is not None:
            self._push(max(t, finish), _LINK_DONE, None, self.link.version)

    def _link_done(self, t: float) -> None:
        overhead = self.cfg.hardware.link.overhead
        for rid in self.link.finished(t):
            ready_at = t + overhead
            if self.layerwise:
                ready_at = max(ready_at, self.prefill_done[rid] + self.xfer_tail_s[rid])
            self._push(ready_at, _ADMIT, rid)
        self._link_reschedule(t)

    # ---- policy in the loop -----------------------------------------------------------------------

    def _sample(self, t: float) -> PoolSample:
        return sample_pools(
            self.instances, t, len(self.prefill_wait), len(self.decode_wait), self.kv_cap_tokens
        )

    def _observe(self, t: float, sample: PoolSample) -> Observation:
        """What a Prometheus-fed controller would see at t: windowed rates and lagged gauges."""
        control = self.cfg.control
        end = t - control.lag_s
        start = max(0.0, end - control.window_s)
        lagged = sample
        for previous in reversed(self.samples):
            if previous.time_s <= end + 1e-9:
                lagged = previous
                break
        rate = mean_in = mean_out = p90_in = p90_out = ttft = tpot = tpot_mean = hit_rate = None
        if end > start:
            lo, hi = bisect_left(self.arrival, start), bisect_left(self.arrival, end)
            count = hi - lo
            rate = count / (end - start)
            if count:
                mean_in = (self.prefix_sum_prompt[hi] - self.prefix_sum_prompt[lo]) / count
                mean_out = (self.prefix_sum_output[hi] - self.prefix_sum_output[lo]) / count
                hit_rate = (self.prefix_sum_hits[hi] - self.prefix_sum_hits[lo]) / (mean_in * count)
                import numpy as np  # a policy is in the loop: it has loaded numpy already

                p90_in = float(np.percentile(self.requests.prompt_tokens[lo:hi], 90))
                p90_out = float(np.percentile(self.requests.output_tokens[lo:hi], 90))
            ttft = window_p90(self.ttft_times, self.ttft_values, start, end)
            tpot = window_p90(self.tpot_times, self.tpot_values, start, end)
            tpot_mean = window_mean(self.tpot_times, self.tpot_values, self.tpot_tokens, start, end)
        width = self.cfg.hardware.gpus_per_instance
        return Observation(
            time_s=t,
            window_s=control.window_s,
            prefill=PoolState(sample.prefill_ready, sample.prefill_starting, sample.prefill_draining, width),
            decode=PoolState(sample.decode_ready, sample.decode_starting, sample.decode_draining, width),
            arrival_rate=rate,
            mean_input_tokens=mean_in,
            mean_output_tokens=mean_out,
            prefix_hit_rate=hit_rate,
            p90_input_tokens=p90_in,
            p90_output_tokens=p90_out,
            prefill_queue=lagged.prefill_queue,
            decode_running=lagged.decode_running,
            decode_kv_usage=lagged.decode_kv_usage,
            ttft_p90_s=ttft,
            tpot_p90_s=tpot,
            tpot_mean_s=tpot_mean,
            decode_waiting=lagged.decode_waiting,
        )

    def _tick(self, t: float) -> None:
        if len(self.gap_hist) > _HISTOGRAM_FOLD_AT:  # checked per scrape, not per step: folding is
            self._fold_histogram()  # additive, so when it happens does not change the bins
        sample = self._sample(t)
        if self.policy is not None and self.disagg:
            decision = self.policy.decide(self._observe(t, sample), self.limits)
            self.decisions.append((t, decision))
            self._apply(decision, t)
        self.samples.append(sample)
        if self.progress is not None:
            self.progress(t, self.done_count, self.n)

    def _apply(self, decision: Decision, t: float) -> None:
        """Carry out a decision by the rule the operator follows too (xpyd_api.resize)."""
        members, draining = self._resize_members(t)
        moves = resize(
            self._desired(decision),
            members,
            draining,
            conversion=self.cfg.control.role_conversion and decision.allow_conversion,
            conversion_seconds=self.cfg.realism.conversion_s,
        )
        self._carry_out(moves, t)

    def _desired(self, decision: Decision) -> dict[Role, int | None]:
        """The decision's pool sizes within the limits (None: the policy leaves the pool as it is)."""
        lim = self.limits
        desired: dict[Role, int | None] = {}
        for role, want, low, high in (
            (Role.PREFILL, decision.prefill, lim.prefill_min, lim.prefill_max),
            (Role.DECODE, decision.decode, lim.decode_min, lim.decode_max),
        ):
            desired[role] = None if want is None else min(high, max(low, want))
        return desired

    def _resize_members(self, t: float) -> tuple[list[Member[Instance]], list[Member[Instance]]]:
        """The fleet as the resize rule sees it: the pools' members (a converting instance in its new
        pool, busy) and the instances draining for removal."""
        members: list[Member[Instance]] = []
        draining: list[Member[Instance]] = []
        for inst in self.instances:
            if inst.state == CONVERTING:
                members.append(
                    Member(inst, Role(inst.target_role), ready=False, busy=True, created=inst.created_s)
                )
            elif inst.state == DRAINING:
                draining.append(Member(inst, Role(inst.role), ready=True, created=inst.created_s))
            else:
                ready = inst.state == READY
                members.append(
                    Member(
                        inst,
                        Role(inst.role),
                        ready=ready,
                        load=float(self._load(inst, t)),
                        created=inst.created_s,
                        ready_in=None if ready else inst.ready_at - t,
                    )
                )
        return members, draining

    def _carry_out(self, moves: Moves[Instance], t: float) -> None:
        """The rule's moves, in its order: take back, redirect, convert, cancel, create, remove."""
        for inst in moves.take_back:
            self._add_ready(inst)
            inst.version += 1  # cancels its retirement; an operation in flight ends under the new version
            if inst.op != IDLE:
                self._push(inst.op_end, _OP_END, inst, inst.version)
            self._admit_waiting(t)
        for inst, target in moves.redirect:
            inst.target_role = str(target)
            inst.state = CONVERTING
            if inst.is_empty(t):  # drained already: its retirement is due, a switch replaces it
                inst.version += 1
                self._check_drained(inst, t)
        for inst, target in moves.convert:
            inst.target_role = str(target)
            self._leave(inst, CONVERTING, t)
        for inst in moves.cancel:
            self._retire(inst, t)
        for role, count in moves.create.items():
            for _ in range(count):
                self._start(str(role), t)
        for inst in moves.remove:
            self.scale_downs += 1
            if inst.state == STARTING:
                self._retire(inst, t)
            else:
                self._leave(inst, DRAINING, t)

    def _load(self, inst: Instance, t: float) -> int:
        if inst.role == PREFILL:
            return inst.prefill_load(t)
        return len(inst.queue) + inst.size

    def _leave(self, inst: Instance, state: str, t: float) -> None:
        """Stop routing to a ready instance; it drains, then retires or switches roles."""
        self._leave_ready(inst)
        inst.state = state
        if inst.is_empty(t):
            self._check_drained(inst, t)
        elif inst.role == PREFILL:
            self._push(inst.free_at, _PREFILL_IDLE, inst, inst.version)

    def _start(self, role: str, t: float) -> None:
        """A cold start of a new `role` instance."""
        inst = self._new_instance(role, STARTING, t)
        self.scale_ups += 1
        inst.ready_at = t + self.cfg.realism.cold_start_s
        self._push(inst.ready_at, _READY, inst, inst.version)

    # ---- main loop ----------------------------------------------------------------------------------

    def run(self) -> RawRun:
        heap = self.heap
        n = self.n
        interval = self.cfg.control.scrape_interval_s
        self._push(0.0, _TICK)
        next_arrival = 0
        arrivals = [*self.arrival, math.inf]  # a sentinel: no bounds check per event
        popped = 0
        t = 0.0
        lifecycle = {_READY: self._on_ready, _PREFILL_IDLE: self._check_drained, _RETIRE: self._retire}
        while self.done_count < n:
            ta = arrivals[next_arrival]
            if not heap or ta <= heap[0][0]:
                t = ta
                self._arrive(next_arrival, t)
                next_arrival += 1
                continue
            t, _, kind, obj, version = heappop(heap)
            popped += 1
            if kind == _OP_END:
                if version == obj.version:
                    self._op_end(obj, t)
            elif kind == _ADMIT:
                self._admit(obj, t)
            elif kind == _XFER_START:
                self._link_start(obj, t)
            elif kind == _LINK_DONE:
                if version == self.link.version:
                    self._link_done(t)
            elif kind == _TICK:
                self._tick(t)
                self._push(t + interval, _TICK)
            elif version == obj.version:  # an instance's lifecycle event, unless it is stale
                lifecycle[kind](obj, t)
        end = t
        gpu_seconds = self.gpu_seconds + sum(
            (end - i.created_s) * self.cfg.hardware.gpus_per_instance for i in self.instances
        )
        return RawRun(
            first_token_s=self.first_token,
            finish_s=self.finish,
            max_gap_s=self.max_gap,
            gap_histogram=self._folded_histogram(),
            end_s=end,
            gpu_seconds=gpu_seconds,
            samples=tuple(self.samples),
            decisions=tuple(self.decisions),
            scale_ups=self.scale_ups,
            scale_downs=self.scale_downs,
            conversions=self.conversions,
            events=popped + next_arrival,
        )


def _check_kv_fits(kv_need: list[int], kv_cap_tokens: int) -> None:
    """SimConfigError when a request needs more KV than an instance holds: it could never be admitted."""
    largest = int(max(kv_need))
    if largest > kv_cap_tokens:
        raise SimConfigError(
            "kv_capacity",
            kv_cap_tokens,
            f"an instance holds {kv_cap_tokens} tokens of KV after the weights, but a request "
            f"needs {largest}: it could never be admitted (more GPUs per instance or less context)",
        )


def _prefix_sums(
    prompt: list[float], output: list[int], uncached: list[float]
) -> tuple[list[float], list[float], list[float]]:
    """Prefix sums of prompt, output and prefix-hit tokens (a window's means in O(1))."""
    return (
        [0.0, *accumulate(prompt)],
        [0.0, *(float(total) for total in accumulate(output))],
        [0.0, *accumulate(p - u for p, u in zip(prompt, uncached, strict=True))],
    )


def run_events(
    config: SimConfig,
    requests: Trace,
    policy: Policy | None = None,
    limits: Limits | None = None,
    progress: ProgressFn | None = None,
) -> RawRun:
    """Simulate `requests` on the fleet of `config` until every request has finished.

    The cyclic garbage collector is paused meanwhile: the loop allocates many short-lived event
    tuples and no reference cycles, so its collections would only cost time."""
    simulation = _Simulation(config, requests, policy, limits or Limits(), progress)
    collecting = gc.isenabled()
    gc.disable()
    try:
        return simulation.run()
    finally:
        if collecting:
            gc.enable()
