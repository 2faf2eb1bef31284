"""One simulated vLLM instance taking requests one at a time, timed by the roofline (pure; the core of the
engine stand-in, `xpyd_controller.standin`).

A vLLM instance with a KV connector such as NIXL (`kv_role: kv_both`) has no role of its own: each request
says what to do with it, and the router decides. A prefill job (the router's `do_remote_decode`) computes
the prompt, emits one token and keeps the prompt's KV blocks for the decode side to pull, for at most the
KV lease; a decode job (`do_remote_prefill`) first pulls those blocks over the link, then joins the
continuous batch; a local job (no transfer parameters) does both here. Prefill runs one prompt at a time
(FIFO); decode steps run the whole batch within the KV cache. The two do not slow each other down: an
instance serving one role only ever does one of them.

The clock is the caller's: `advance(now)` runs everything due up to `now` and returns the progress of each
job, `next_due()` says when something is due next. Series are vLLM's (sim/exposition.py) and follow
vLLM's meaning: a request's prompt and generation lengths are observed when it finishes on this instance,
and TTFT runs from its arrival here to its first token here.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass, field
from enum import StrEnum

from xpyd_api.engines import NIXL_DEFAULT_KV_LEASE_S
from xpyd_api.errors import InputError
from xpyd_controller.model.roofline import decode_step_seconds, kv_transfer_seconds, prefill_seconds
from xpyd_controller.sim.config import Hardware
from xpyd_controller.sim.exposition import EngineSeries, render

KV_BLOCK_TOKENS = 16  # vLLM's default block size


class InstanceError(InputError):
    """A rejected job or setting; names the field, value and rule."""


class JobKind(StrEnum):
    """What a request asks of this instance."""

    PREFILL = "prefill"  # compute the prompt, keep its KV for a decode instance (do_remote_decode)
    DECODE = "decode"  # pull the prompt's KV from a prefill instance, then generate (do_remote_prefill)
    LOCAL = "local"  # both, here


@dataclass
class Job:
    """One request on this instance."""

    id: str
    kind: JobKind
    prompt_tokens: int
    output_tokens: int
    received_s: float
    generated: int = 0
    first_token_s: float | None = None
    finished_s: float | None = None
    blocks: tuple[int, ...] = ()  # prefill: the KV blocks kept for the decode side

    @property
    def resident_tokens(self) -> int:
        return self.prompt_tokens + self.generated


@dataclass(frozen=True)
class Progress:
    """A job's state after an `advance`: tokens generated so far, and whether it has finished."""

    job: Job
    generated: int
    finished: bool


@dataclass
class _Lease:
    tokens: int
    expires_s: float


@dataclass
class SimulatedInstance:
    """One instance's queues, batch, KV cache and series; every method takes the current time."""

    hardware: Hardware
    kv_lease_s: float = NIXL_DEFAULT_KV_LEASE_S  # how long a prefill keeps KV blocks nobody pulled
    series: EngineSeries = field(default_factory=EngineSeries)
    _prefill_queue: deque[Job] = field(default_factory=deque)
    _prefilling: Job | None = None
    _prefill_done_s: float = math.inf
    _transfers: list[tuple[float, int, Job]] = field(default_factory=list)  # heap by arrival of the KV
    _admission: deque[Job] = field(default_factory=deque)  # decode jobs waiting for KV room
    _batch: list[Job] = field(default_factory=list)
    _step_started_s: float = 0.0
    _step_done_s: float = math.inf
    _leases: dict[int, _Lease] = field(default_factory=dict)  # by first block id
    _next_block: int = 0
    _sequence: int = 0

    def __post_init__(self) -> None:
        hardware = self.hardware
        room = hardware.gpus_per_instance * hardware.gpu.hbm_bytes - hardware.model.weight_footprint_bytes
        self.kv_capacity_tokens = int(room / hardware.model.kv_bytes_per_token)
        if self.kv_capacity_tokens < KV_BLOCK_TOKENS:
            raise InstanceError("gpu.hbm_bytes", hardware.gpu.hbm_bytes, "leaves no room for a KV block")
        if not self.kv_lease_s > 0:
            raise InstanceError("kv_lease_s", self.kv_lease_s, "must be > 0")

    # ---- taking work ---------------------------------------------------------------------------------

    def submit(self, job: Job, now: float) -> list[Progress]:
        """Accept `job` at `now` (after running what was due before); returns what that advance did."""
        if job.prompt_tokens < 1 or job.output_tokens < 1:
            raise InstanceError(
                "job", (job.prompt_tokens, job.output_tokens), "needs >= 1 prompt and output token"
            )
        progress = self.advance(now)
        if job.kind is JobKind.DECODE:
            hardware = self.hardware
            seconds = float(kv_transfer_seconds(hardware.model, hardware.link, job.prompt_tokens))
            self._sequence += 1
            heapq.heappush(self._transfers, (now + seconds, self._sequence, job))
        else:
            self._prefill_queue.append(job)
            self._start_prefill(now)
        return progress

    def release(self, first_block: int) -> bool:
        """The decode side pulled a prefill's KV blocks: free them. False if the lease had already ended."""
        return self._leases.pop(first_block, None) is not None

    # ---- the clock -------------------------------------------------------------------------------------

    def next_due(self) -> float:
        """When the next thing happens (inf when idle)."""
        transfer = self._transfers[0][0] if self._transfers else math.inf
        lease = min((lease.expires_s for lease in self._leases.values()), default=math.inf)
        return min(self._prefill_done_s, self._step_done_s, transfer, lease)

    def advance(self, now: float) -> list[Progress]:
        """Run everything due up to `now`, in time order."""
        progress: list[Progress] = []
        while (due := self.next_due()) <= now:
            if due == self._prefill_done_s:
                progress += self._prefill_done(due)
            elif due == self._step_done_s:
                progress += self._step_done(due)
            elif self._transfers and due == self._transfers[0][0]:
                _, _, job = heapq.heappop(self._transfers)
                self._admission.append(job)
                self._admit_and_step(due)
            else:
                self._leases = {k: v for k, v in self._leases.items() if v.expires_s > due}
        return progress

    # ---- what it exports ----------------------------------------------------------------------------------

    @property
    def in_flight(self) -> int:
        """Requests running or waiting here (vLLM's num_requests_running + num_requests_waiting)."""
        waiting = len(self._prefill_queue) + len(self._transfers) + len(self._admission)
        return waiting + len(self._batch) + (self._prefilling is not None)

    @property
    def leased_blocks(self) -> int:
        """KV blocks kept for decode instances that have not pulled them yet."""
        return sum(math.ceil(lease.tokens / KV_BLOCK_TOKENS) for lease in self._leases.values())

    def metrics_text(self, model_name: str) -> str:
        series = self.series
        series.running = len(self._batch) + (self._prefilling is not None)
        series.waiting = len(self._prefill_queue) + len(self._transfers) + len(self._admission)
        used = sum(job.resident_tokens for job in self._batch)
        used += self._prefilling.prompt_tokens if self._prefilling else 0
        used += sum(lease.tokens for lease in self._leases.values())
        series.kv_usage = min(1.0, used / self.kv_capacity_tokens)
        return render(series, model_name)

    # ---- prefill ----------------------------------------------------------------------------------------

    def _start_prefill(self, now: float) -> None:
        if self._prefilling is not None or not self._prefill_queue:
            return
        job = self._prefill_queue.popleft()
        self._prefilling = job
        self.series.prefix_queries += job.prompt_tokens
        hardware = self.hardware
        seconds = float(
            prefill_seconds(hardware.model, hardware.gpu, job.prompt_tokens, hardware.gpus_per_instance)
        )
        self._prefill_done_s = now + seconds

    def _prefill_done(self, now: float) -> list[Progress]:
        job = self._prefilling
        assert job is not None
        self._prefilling, self._prefill_done_s = None, math.inf
        progress = []
        if job.kind is JobKind.PREFILL:
            blocks = math.ceil(job.prompt_tokens / KV_BLOCK_TOKENS)
            job.blocks = tuple(range(self._next_block, self._next_block + blocks))
            self._next_block += blocks
            self._leases[job.blocks[0]] = _Lease(job.prompt_tokens, now + self.kv_lease_s)
            job.generated = 1
            self._first_token(job, now)
            self._finish(job, now)
            progress.append(Progress(job, 1, True))
        else:  # local: the KV is here already
            self._admission.append(job)
            self._admit_and_step(now)
        self._start_prefill(now)
        return progress

    # ---- decode -----------------------------------------------------------------------------------------

    def _admit_and_step(self, now: float) -> None:
        if self._step_done_s != math.inf:
            return  # admitted at the end of the running step
        used = sum(job.resident_tokens for job in self._batch)
        while self._admission and (
            not self._batch or used + self._admission[0].resident_tokens + 1 <= self.kv_capacity_tokens
        ):
            job = self._admission.popleft()
            self._batch.append(job)
            used += job.resident_tokens
        if not self._batch:
            return
        hardware = self.hardware
        seconds = float(
            decode_step_seconds(
                hardware.model,
                hardware.gpu,
                batch=len(self._batch),
                context_tokens=used / len(self._batch),
                gpus=hardware.gpus_per_instance,
                step_overhead=hardware.step_overhead_s,
            )
        )
        self._step_started_s, self._step_done_s = now, now + seconds

    def _step_done(self, now: float) -> list[Progress]:
        self._step_done_s = math.inf
        progress, remaining, continuing = [], [], 0
        for job in self._batch:
            job.generated += 1
            if job.first_token_s is None:
                self._first_token(job, now)
            else:
                continuing += 1
            finished = job.generated >= job.output_tokens
            if finished:
                self._finish(job, now)
            else:
                remaining.append(job)
            progress.append(Progress(job, job.generated, finished))
        self.series.inter_token.observe(now - self._step_started_s, continuing)
        self._batch = remaining
        used = sum(job.resident_tokens for job in self._batch)
        while used > self.kv_capacity_tokens and len(self._batch) > 1:
            preempted = self._batch.pop()  # the newest waits for room again, as vLLM preempts
            used -= preempted.resident_tokens
            self._admission.appendleft(preempted)
        self._admit_and_step(now)
        return progress

    # ---- series -----------------------------------------------------------------------------------------

    def _first_token(self, job: Job, now: float) -> None:
        job.first_token_s = now
        self.series.ttft.observe(now - job.received_s)

    def _finish(self, job: Job, now: float) -> None:
        job.finished_s = now
        self.series.prompt_tokens.observe(job.prompt_tokens)
        self.series.generation_tokens.observe(job.generated)
