"""Open-loop traffic through the router: streamed OpenAI completions, arrivals and lengths from the
simulator's synthetic traces, measured as a client sees them (TTFT to the first streamed text, time per
output token after it). A request that errs, or ends with fewer tokens than asked, is a failure.

Prompts are token-id lists of the drawn length (vLLM and the stand-in take them as they are), and
`ignore_eos` makes every answer as long as asked, so the lengths the controller reads are the drawn ones.
Each request carries a fresh tag in the OpenAI `user` field, which the router passes on, so an engine's
request log can be matched with when the client sent the request (`sent_at`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import aiohttp
import numpy as np

from xpyd_controller.sim.config import GoodputSlo
from xpyd_controller.sim.traces.synthetic import Curve, LengthDistribution, Shifted, renewal_arrivals

WINDOW_S = 1.0  # arrivals are drawn one window ahead


@dataclass(frozen=True)
class TrafficStats:
    """Counts since the traffic started (seconds `now_s`)."""

    now_s: float
    sent: int
    completed: int
    within_slo: int
    failed: int

    @property
    def in_flight(self) -> int:
        return self.sent - self.completed - self.failed


class RouterTraffic:
    """Sends requests to `url` (the router) from a thread of its own until `close()`."""

    def __init__(
        self,
        url: str,
        model: str,
        rate: Curve,
        lengths: LengthDistribution,
        slo: GoodputSlo,
        *,
        seed: int = 0,
        timeout_s: float = 600.0,
    ) -> None:
        self.url = url.rstrip("/")
        self.model = model
        self.rate = rate
        self.lengths = lengths
        self.slo = slo
        self.timeout_s = timeout_s
        self.failures: list[str] = []  # why each failed request failed
        self.sent_at: dict[str, float] = {}  # wall-clock send time by the tag in each request's `user` field
        self._rng = np.random.default_rng(seed)
        self._sent = self._completed = self._within_slo = 0
        self._lock = threading.Lock()
        self._started = time.monotonic()
        self._loop = asyncio.new_event_loop()
        self._stopping: asyncio.Event | None = None
        self._thread = threading.Thread(
            target=self._loop.run_until_complete, args=(self._run(),), daemon=True
        )

    def start(self) -> RouterTraffic:
        self._started = time.monotonic()
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop sending; requests in flight are abandoned (not counted as failures)."""
        if self._stopping is not None:
            self._loop.call_soon_threadsafe(self._stopping.set)
        self._thread.join(timeout=30)

    def stats(self) -> TrafficStats:
        with self._lock:
            failed = len(self.failures)
            return TrafficStats(self.now_s, self._sent, self._completed, self._within_slo, failed)

    @property
    def now_s(self) -> float:
        return time.monotonic() - self._started

    async def _run(self) -> None:
        self._stopping = asyncio.Event()
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
            tasks: set[asyncio.Task[None]] = set()
            window_start = 0.0
            while not self._stopping.is_set():
                offsets = renewal_arrivals(self._rng, Shifted(self.rate, window_start), WINDOW_S)
                times = offsets + window_start
                prompts, outputs = self.lengths.sample(self._rng, times)
                for at, prompt, output in zip(
                    times.tolist(), prompts.tolist(), outputs.tolist(), strict=True
                ):
                    await self._sleep_until(at)
                    if self._stopping.is_set():
                        break
                    task = asyncio.create_task(self._request(session, int(prompt), int(output)))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
                window_start += WINDOW_S
                await self._sleep_until(window_start)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _sleep_until(self, at_s: float) -> None:
        assert self._stopping is not None
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), max(0.0, at_s - self.now_s))

    async def _request(self, session: aiohttp.ClientSession, prompt_tokens: int, output_tokens: int) -> None:
        tag = uuid.uuid4().hex
        body = {
            "model": self.model,
            "user": tag,  # passed on to the engines: their logs say which request they got
            "prompt": [int(t) for t in self._rng.integers(1, 32000, prompt_tokens)],
            "max_tokens": output_tokens,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        with self._lock:
            self._sent += 1
            self.sent_at[tag] = time.time()
        started = time.monotonic()
        first: float | None = None
        generated = 0
        try:
            async with session.post(f"{self.url}/v1/completions", json=body) as response:
                if response.status != 200:
                    raise RuntimeError(f"HTTP {response.status}: {(await response.text())[:200]}")
                async for line in response.content:
                    data = line.strip().removeprefix(b"data: ")
                    if not data or data == b"[DONE]":
                        continue
                    chunk = json.loads(data)
                    if chunk.get("choices") and chunk["choices"][0].get("text") and first is None:
                        first = time.monotonic()
                    if chunk.get("usage"):
                        generated = int(chunk["usage"]["completion_tokens"])
            if generated != output_tokens:
                raise RuntimeError(f"{generated} of {output_tokens} tokens")
        except asyncio.CancelledError:
            raise
        except (aiohttp.ClientError, TimeoutError, RuntimeError, ValueError) as error:
            with self._lock:
                self.failures.append(f"{self.now_s:.1f}s: {error!r}")
            return
        done = time.monotonic()
        first = first if first is not None else done
        per_token = (done - first) / max(1, output_tokens - 1)
        within = first - started <= self.slo.ttft_s and (
            self.slo.tpot_s is None or per_token <= self.slo.tpot_s
        )
        with self._lock:
            self._completed += 1
            self._within_slo += within


@contextlib.contextmanager
def router_traffic(
    url: str, model: str, rate: Curve, lengths: LengthDistribution, slo: GoodputSlo, *, seed: int = 0
) -> Iterator[RouterTraffic]:
    """Started traffic, stopped (thread joined) on exit."""
    traffic = RouterTraffic(url, model, rate, lengths, slo, seed=seed).start()
    try:
        yield traffic
    finally:
        traffic.close()
