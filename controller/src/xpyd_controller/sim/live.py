"""A live PD fleet: simulated engines that change while the clock runs (pure; the demo's data plane).

The offline engine (sim/engine.py) replays a whole trace against a policy. Here the fleet is driven from
outside, the way a cluster drives real engines: instances appear, disappear and change role or serving
state at any moment (keyed by pod name), and `advance(dt)` moves the clock by `dt` seconds. Requests
arrive as a renewal process over the traffic's rate curve, wait in FIFO order for one prefill, have
their KV cache transferred over the link, and join a decode instance's continuous batch; all times come
from the capacity model's roofline (model/roofline.py), so the controller's model and the simulated
fleet agree on what one instance can do. Routing follows the router's rule: only instances labelled
serving get new work, least loaded first. Each instance exports vLLM-named series (sim/exposition.py);
TTFT ends with the first decode step, so it includes the prefill queue, the transfer and any wait for
KV room on the decode instance, as a client would see it.

Requests are never lost: an instance that is removed or switched while it still holds work (the
operator drains first, so only after a drain timeout) hands its requests back to the router, and the
ones already decoding lose their KV cache and are prefilled again (vLLM's recompute).
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass, field
from enum import IntEnum

import numpy as np

from xpyd_api.errors import InputError
from xpyd_api.names import Role
from xpyd_controller.model.roofline import decode_step_seconds, kv_transfer_seconds, prefill_seconds
from xpyd_controller.sim.config import GoodputSlo, Hardware
from xpyd_controller.sim.exposition import EngineSeries, render
from xpyd_controller.sim.traces.synthetic import Curve, LengthDistribution, Shifted, renewal_arrivals


class LiveFleetError(InputError):
    """A rejected fleet operation or setting; names the field, value and rule."""


@dataclass(frozen=True)
class LiveTraffic:
    """Open-loop load: requests/s over fleet time, a length mix (may drift), a prefix-cache hit fraction."""

    rate: Curve
    lengths: LengthDistribution
    hit_fraction: float = 0.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.hit_fraction < 1.0:
            raise LiveFleetError("hit_fraction", self.hit_fraction, "must be in [0, 1)")


@dataclass
class _Request:
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    hit_tokens: int
    generated: int = 0
    first_token_s: float | None = None
    admitted: bool = False  # counted in a prefill instance's prompt histogram (once, even if recomputed)

    @property
    def resident_tokens(self) -> int:
        """KV-cache tokens the request holds on a decode instance (and prefills again after a recompute)."""
        return self.prompt_tokens + self.generated


@dataclass
class _Instance:
    key: str
    role: Role
    serving: bool
    series: EngineSeries = field(default_factory=EngineSeries)
    epoch: int = 0  # bumped on every switch, so events scheduled before it are recognised as stale
    queue: deque[_Request] = field(default_factory=deque)  # prefill: not started; decode: no KV room yet
    current: _Request | None = None  # prefill: the one in service
    incoming: list[_Request] = field(default_factory=list)  # decode: KV transfers on the way
    batch: list[_Request] = field(default_factory=list)  # decode: the running continuous batch
    kv_tokens: int = 0
    step_started_s: float | None = None

    def load(self) -> int:
        """What least-loaded routing compares (and what a drain waits for: requests in flight)."""
        return len(self.queue) + len(self.incoming) + len(self.batch) + (self.current is not None)

    def take_all(self) -> list[_Request]:
        """Empty the instance (it is being removed or switched); its requests go back to the router."""
        held = [*self.batch, *self.incoming, *self.queue, *([self.current] if self.current else [])]
        self.epoch += 1
        self.queue.clear()
        self.current = None
        self.incoming.clear()
        self.batch.clear()
        self.kv_tokens = 0
        self.step_started_s = None
        return held


class _Event(IntEnum):
    ARRIVAL = 0
    PREFILL_DONE = 1
    TRANSFER_DONE = 2
    DECODE_STEP = 3


@dataclass(frozen=True)
class FleetStats:
    """Cumulative counts since the fleet started; `in_system` is everything arrived and not completed."""

    now_s: float
    arrived: int
    completed: int
    within_slo: int  # completed with TTFT and mean time per output token within the SLO
    recomputed: int  # requests handed back by an instance removed or switched while holding them
    in_system: int
    waiting_for_instance: int  # held by the router: no serving instance of the role they need


class LiveFleet:
    """Instances keyed by an external id (a pod name) serving open-loop traffic in fleet time."""

    def __init__(self, hardware: Hardware, traffic: LiveTraffic, slo: GoodputSlo, seed: int = 0) -> None:
        self.hardware = hardware
        self.traffic = traffic
        self.slo = slo
        self.now_s = 0.0
        per_instance = hardware.gpus_per_instance * hardware.gpu.hbm_bytes
        room = per_instance - hardware.model.weight_footprint_bytes
        self.kv_capacity_tokens = int(room / hardware.model.kv_bytes_per_token)
        if self.kv_capacity_tokens < 1:
            raise LiveFleetError(
                "gpu.hbm_bytes",
                hardware.gpu.hbm_bytes,
                f"{hardware.gpus_per_instance} GPU(s) leave no room for KV cache after "
                f"{hardware.model.weight_footprint_bytes:.3g} bytes of weights",
            )
        self._rng = np.random.default_rng(seed)
        self._instances: dict[str, _Instance] = {}
        self._events: list[tuple[float, int, _Event, str, int, _Request | None]] = []
        self._sequence = 0
        self._waiting: dict[Role, deque[_Request]] = {Role.PREFILL: deque(), Role.DECODE: deque()}
        self._arrived = 0
        self._completed = 0
        self._within_slo = 0
        self._recomputed = 0

    # ---- the cluster side: instances come, go, switch -----------------------------------------------

    def add(self, key: str, role: Role, serving: bool = True) -> None:
        if key in self._instances:
            raise LiveFleetError("instance", key, "already in the fleet")
        self._instances[key] = _Instance(key=key, role=role, serving=serving)
        if serving:
            self._release_waiting(role)

    def remove(self, key: str) -> None:
        """Take an instance away; whatever it still holds is routed again."""
        held = self._instance(key).take_all()
        del self._instances[key]
        self._recompute(held)

    def set_role(self, key: str, role: Role) -> None:
        """Switch an instance's role in place; counters stay (no restart), work in flight is re-routed."""
        instance = self._instance(key)
        if instance.role is role:
            return
        held = instance.take_all()
        instance.role = role
        self._recompute(held)
        if instance.serving:
            self._release_waiting(role)

    def set_serving(self, key: str, serving: bool) -> None:
        """The router's switch: a non-serving instance gets no new work but finishes what it holds."""
        instance = self._instance(key)
        instance.serving = serving
        if serving:
            self._release_waiting(instance.role)

    def roles(self) -> dict[str, Role]:
        """Every instance's key and current role."""
        return {key: instance.role for key, instance in self._instances.items()}

    def __contains__(self, key: object) -> bool:
        return key in self._instances

    def metrics_text(self, key: str, model_name: str) -> str:
        """The instance's /metrics body right now."""
        instance = self._instance(key)
        series = instance.series
        series.waiting = len(instance.queue) + len(instance.incoming)
        series.running = len(instance.batch) + (instance.current is not None)
        resident = instance.kv_tokens or (instance.current.resident_tokens if instance.current else 0)
        series.kv_usage = min(1.0, resident / self.kv_capacity_tokens)
        return render(series, model_name)

    def stats(self) -> FleetStats:
        held = sum(i.load() for i in self._instances.values())
        waiting = sum(len(q) for q in self._waiting.values())
        return FleetStats(
            now_s=self.now_s,
            arrived=self._arrived,
            completed=self._completed,
            within_slo=self._within_slo,
            recomputed=self._recomputed,
            in_system=held + waiting,
            waiting_for_instance=waiting,
        )

    # ---- time ---------------------------------------------------------------------------------------

    def advance(self, dt: float) -> None:
        """Move the clock `dt` seconds forward, drawing that window's arrivals and running every event."""
        if not dt >= 0 or dt == float("inf"):
            raise LiveFleetError("dt", dt, "must be a finite number of seconds >= 0")
        end = self.now_s + dt
        if dt > 0:
            self._draw_arrivals(dt)
        while self._events and self._events[0][0] <= end:
            at, _, kind, key, epoch, request = heapq.heappop(self._events)
            self.now_s = at
            instance = self._instances.get(key)
            if kind is _Event.ARRIVAL and request is not None:
                self._arrived += 1
                self._route(Role.PREFILL, request)
            elif instance is None or instance.epoch != epoch:
                continue  # the instance was removed or switched since; its requests were re-routed then
            elif kind is _Event.PREFILL_DONE:
                self._prefill_done(instance)
            elif kind is _Event.TRANSFER_DONE and request is not None:
                instance.incoming.remove(request)
                instance.queue.append(request)
                self._admit_and_step(instance)
            elif kind is _Event.DECODE_STEP:
                self._decode_step_done(instance)
        self.now_s = end

    def _draw_arrivals(self, dt: float) -> None:
        offsets = renewal_arrivals(self._rng, Shifted(self.traffic.rate, self.now_s), dt)
        if len(offsets) == 0:
            return
        times = offsets + self.now_s
        prompts, outputs = self.traffic.lengths.sample(self._rng, times)
        for at, prompt, output in zip(times.tolist(), prompts.tolist(), outputs.tolist(), strict=True):
            hit = int(prompt * self.traffic.hit_fraction)
            self._schedule(at, _Event.ARRIVAL, "", 0, _Request(at, prompt, output, hit))

    def _schedule(self, at: float, kind: _Event, key: str, epoch: int, request: _Request | None) -> None:
        self._sequence += 1
        heapq.heappush(self._events, (at, self._sequence, kind, key, epoch, request))

    def _instance(self, key: str) -> _Instance:
        try:
            return self._instances[key]
        except KeyError:
            raise LiveFleetError("instance", key, "is not in the fleet") from None

    # ---- routing --------------------------------------------------------------------------------------

    def _route(self, role: Role, request: _Request) -> None:
        """Least-loaded serving instance of `role` (ties by name), else the router holds the request."""
        candidates = [(i.load(), k) for k, i in self._instances.items() if i.role is role and i.serving]
        if not candidates:
            self._waiting[role].append(request)
            return
        instance = self._instances[min(candidates)[1]]
        if role is Role.PREFILL:
            if not request.admitted:
                request.admitted = True
                instance.series.prompt_tokens.observe(request.prompt_tokens)
            instance.queue.append(request)
            self._start_prefill(instance)
        else:
            instance.incoming.append(request)
            seconds = float(
                kv_transfer_seconds(self.hardware.model, self.hardware.link, request.resident_tokens)
            )
            self._schedule(self.now_s + seconds, _Event.TRANSFER_DONE, instance.key, instance.epoch, request)

    def _release_waiting(self, role: Role) -> None:
        held = self._waiting[role]
        self._waiting[role] = deque()
        for request in held:
            self._route(role, request)

    def _recompute(self, requests: list[_Request]) -> None:
        self._recomputed += len(requests)
        for request in requests:
            self._route(Role.PREFILL, request)

    # ---- prefill: one FIFO server per instance ------------------------------------------------------------

    def _start_prefill(self, instance: _Instance) -> None:
        if instance.current is not None or not instance.queue:
            return
        request = instance.queue.popleft()
        instance.current = request
        tokens = request.resident_tokens
        instance.series.prefix_queries += tokens
        instance.series.prefix_hits += request.hit_tokens
        hardware = self.hardware
        seconds = prefill_seconds(
            hardware.model,
            hardware.gpu,
            tokens,
            hardware.gpus_per_instance,
            hit_rate=request.hit_tokens / tokens,
        )
        self._schedule(self.now_s + float(seconds), _Event.PREFILL_DONE, instance.key, instance.epoch, None)

    def _prefill_done(self, instance: _Instance) -> None:
        request = instance.current
        instance.current = None
        if request is not None:
            self._route(Role.DECODE, request)
        self._start_prefill(instance)

    # ---- decode: continuous batching within the KV cache ----------------------------------------------------

    def _admit_and_step(self, instance: _Instance) -> None:
        """Between steps: admit queued requests while their KV fits, then start the next step."""
        if instance.step_started_s is not None:
            return
        while instance.queue and (
            not instance.batch
            or instance.kv_tokens + instance.queue[0].resident_tokens + 1 <= self.kv_capacity_tokens
        ):
            request = instance.queue.popleft()
            instance.batch.append(request)
            instance.kv_tokens += request.resident_tokens
        if not instance.batch:
            return
        hardware = self.hardware
        seconds = decode_step_seconds(
            hardware.model,
            hardware.gpu,
            batch=len(instance.batch),
            context_tokens=instance.kv_tokens / len(instance.batch),
            gpus=hardware.gpus_per_instance,
            step_overhead=hardware.step_overhead_s,
        )
        instance.step_started_s = self.now_s
        self._schedule(self.now_s + float(seconds), _Event.DECODE_STEP, instance.key, instance.epoch, None)

    def _decode_step_done(self, instance: _Instance) -> None:
        started = instance.step_started_s if instance.step_started_s is not None else self.now_s
        instance.step_started_s = None
        series = instance.series
        continuing = 0
        remaining: list[_Request] = []
        for request in instance.batch:
            request.generated += 1
            instance.kv_tokens += 1
            if request.first_token_s is None:
                request.first_token_s = self.now_s
                series.ttft.observe(self.now_s - request.arrival_s)
            else:
                continuing += 1
            if request.generated >= request.output_tokens:
                instance.kv_tokens -= request.resident_tokens
                series.generation_tokens.observe(request.output_tokens)
                self._complete(request)
            else:
                remaining.append(request)
        series.inter_token.observe(self.now_s - started, continuing)
        instance.batch = remaining
        while instance.kv_tokens > self.kv_capacity_tokens and len(instance.batch) > 1:
            preempted = instance.batch.pop()  # the newest waits for room again (vLLM preempts the same way)
            instance.kv_tokens -= preempted.resident_tokens
            instance.queue.appendleft(preempted)
        self._admit_and_step(instance)

    def _complete(self, request: _Request) -> None:
        self._completed += 1
        first = request.first_token_s if request.first_token_s is not None else self.now_s
        ttft_ok = first - request.arrival_s <= self.slo.ttft_s
        per_token = (self.now_s - first) / max(1, request.output_tokens - 1)
        tpot_ok = self.slo.tpot_s is None or per_token <= self.slo.tpot_s
        self._within_slo += ttft_ok and tpot_ok
