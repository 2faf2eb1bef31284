"""The stand-in's HTTP server: vLLM's OpenAI endpoints, /metrics and /health over one `SimulatedInstance`.

What the real vllm-router (0.1.17, measured) sends is what this serves:
- `POST /v1/completions/render` (the router tokenizes through each worker first): vLLM's answer shape, a
  list with `token_ids`.
- `POST /v1/completions` with `kv_transfer_params.do_remote_decode` (to the prefill instance, max_tokens 1,
  not streamed): the prompt is computed and the answer carries `kv_transfer_params` with
  `do_remote_prefill`, `remote_block_ids`, `remote_engine_id`, `remote_host`, `remote_port`, as vLLM's
  NIXL connector returns them.
- `POST /v1/completions` with those parameters (to the decode instance, streamed or not): the decode side
  pulls the blocks from `remote_host:remote_port` (here the prefill stand-in's HTTP port, standing for the
  NIXL side channel; a failed pull is recomputed locally, like vLLM's recompute policy), then generates.
- no parameters: prefill and decode here.

Prompts are token-id lists (as vLLM accepts them) or text, counted as one token per whitespace-separated
word. `GET /xpyd/requests` is the stand-in's own: the request log (what arrived, when, of which kind) and
how many health checks and render calls it answered, so a test can see what the router sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import math
import time
import uuid
import zlib
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import aiohttp
from aiohttp import web

from xpyd_api.engines import STANDIN_REQUESTS_PATH, VLLM
from xpyd_api.errors import InputError
from xpyd_controller.sim.instance import Job, JobKind, Progress, SimulatedInstance

TOKEN_TEXT = " tok"  # the text of every generated token
PULL_PATH = "/xpyd/kv/pull"


class RequestError(InputError):
    """A request the server answers with 400; the message names the field, value and rule."""


@dataclass
class LoggedRequest:
    """One /v1/completions request as the engine saw it."""

    at: float  # wall-clock seconds (time.time)
    request_id: str
    kind: str
    prompt_tokens: int
    max_tokens: int
    status: str = "running"  # running | ok | failed
    kv_pull: str = ""  # decode: "ok" or why the pull failed (then recomputed here)
    user: str = ""  # the request's OpenAI `user` field (a client can tag its requests with it)


def prompt_token_ids(prompt: object) -> list[int]:
    """Token ids of a completions `prompt`: a list of ints as given, text one id per word."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], list | str):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        return [zlib.crc32(word.encode()) % 32000 for word in prompt.split()] or [0]
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        return list(prompt)
    raise RequestError("prompt", str(prompt)[:80], "must be a string or a non-empty list of token ids")


def job_kind(params: object) -> JobKind:
    """What `kv_transfer_params` ask of this instance (vLLM's NIXL connector's two flags)."""
    if not isinstance(params, dict):
        return JobKind.LOCAL
    if params.get("do_remote_decode"):
        return JobKind.PREFILL
    if params.get("do_remote_prefill"):
        return JobKind.DECODE
    return JobKind.LOCAL


class StandinEngine:
    """One simulated instance behind vLLM's HTTP API; `app()` is the aiohttp application."""

    def __init__(
        self,
        instance: SimulatedInstance,
        *,
        model_name: str,
        side_channel_host: str,
        side_channel_port: int,
        stream_interval: int = 1,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if stream_interval < 1:
            raise RequestError("stream_interval", stream_interval, "must be >= 1")
        self.instance = instance
        self.model_name = model_name
        self.engine_id = str(uuid.uuid4())
        self.side_channel = (side_channel_host, side_channel_port)
        self.stream_interval = stream_interval
        self.clock = clock
        self.log: list[LoggedRequest] = []
        self.health_checks = 0
        self.render_calls = 0
        self._ids = itertools.count()
        self._waiters: dict[str, asyncio.Queue[Progress]] = {}
        self._wake = asyncio.Event()
        self._session: aiohttp.ClientSession | None = None

    def app(self) -> web.Application:
        app = web.Application(client_max_size=512 * 1024**2)
        app.router.add_get(VLLM.endpoints.health, self._health)
        app.router.add_get(VLLM.endpoints.metrics, self._metrics)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/completions/render", self._render)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post(PULL_PATH, self._pull)
        app.router.add_get(STANDIN_REQUESTS_PATH, self._requests)
        app.cleanup_ctx.append(self._lifecycle)
        return app

    async def _lifecycle(self, _: web.Application) -> Any:
        clock = asyncio.create_task(self._run_clock())
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10))
        yield
        clock.cancel()
        await self._session.close()

    # ---- the clock ---------------------------------------------------------------------------------------

    async def _run_clock(self) -> None:
        while True:
            due = self.instance.next_due()
            timeout = None if due == math.inf else max(0.0, due - self.clock())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout)
            self._wake.clear()
            self._deliver(self.instance.advance(self.clock()))

    def _deliver(self, progress: list[Progress]) -> None:
        """Hand progress to the waiting requests: the first token, every stream interval, the end."""
        interval = self.stream_interval
        for item in progress:
            if item.finished or item.generated == 1 or item.generated % interval == 0:
                waiter = self._waiters.get(item.job.id)
                if waiter is not None:
                    waiter.put_nowait(item)

    def _submit(self, job: Job) -> asyncio.Queue[Progress]:
        waiter: asyncio.Queue[Progress] = asyncio.Queue()
        self._waiters[job.id] = waiter
        self._deliver(self.instance.submit(job, self.clock()))
        self._wake.set()
        return waiter

    # ---- endpoints ---------------------------------------------------------------------------------------

    async def _health(self, _: web.Request) -> web.Response:
        self.health_checks += 1
        return web.Response()

    async def _metrics(self, _: web.Request) -> web.Response:
        self._deliver(self.instance.advance(self.clock()))
        body = self.instance.metrics_text(self.model_name)
        return web.Response(text=body, content_type="text/plain", charset="utf-8")

    async def _models(self, _: web.Request) -> web.Response:
        model = {"id": self.model_name, "object": "model", "created": int(time.time()), "owned_by": "vllm"}
        return web.json_response({"object": "list", "data": [model]})

    async def _requests(self, _: web.Request) -> web.Response:
        return web.json_response(
            {
                "requests": [asdict(entry) for entry in self.log],
                "health_checks": self.health_checks,
                "render_calls": self.render_calls,
                "leased_blocks": self.instance.leased_blocks,
            }
        )

    async def _render(self, request: web.Request) -> web.Response:
        self.render_calls += 1
        try:
            body = await request.json()
            tokens = prompt_token_ids(body.get("prompt"))
        except (ValueError, AttributeError) as error:
            return _error(400, str(error))
        rendered = {
            "token_ids": tokens,
            "sampling_params": {"max_tokens": body.get("max_tokens")},
            "model": self.model_name,
            "request_id": f"cmpl-{uuid.uuid4().hex}",
        }
        return web.json_response([rendered])

    async def _pull(self, request: web.Request) -> web.Response:
        """The decode side reads a prefill's KV blocks (NIXL's read, over HTTP here)."""
        body = await request.json()
        if body.get("remote_engine_id") != self.engine_id:
            return _error(404, f"remote_engine_id = {body.get('remote_engine_id')!r}: not this engine")
        blocks = body.get("block_ids") or []
        if not blocks or not self.instance.release(int(blocks[0])):
            return _error(410, f"block_ids starting {blocks[:1]!r}: not held (lease over or never given)")
        return web.json_response({"released": len(blocks)})

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await request.json()
            if not isinstance(body, dict):
                raise RequestError("body", type(body).__name__, "must be a JSON object")
            tokens = prompt_token_ids(body.get("prompt"))
            max_tokens = int(body.get("max_tokens") or 16)
            if max_tokens < 1:
                raise RequestError("max_tokens", max_tokens, "must be >= 1")
        except (ValueError, TypeError) as error:
            return _error(400, str(error))
        params = body.get("kv_transfer_params")
        kind = job_kind(params)
        entry = LoggedRequest(
            at=time.time(),
            request_id=request.headers.get("x-request-id", ""),
            kind=str(kind),
            prompt_tokens=len(tokens),
            max_tokens=max_tokens,
            user=str(body.get("user") or ""),
        )
        self.log.append(entry)
        if kind is JobKind.DECODE and isinstance(params, dict):
            entry.kv_pull = await self._pull_from_prefill(params)
            if entry.kv_pull != "ok":
                kind = JobKind.LOCAL  # recompute the prompt here
        output = 1 if kind is JobKind.PREFILL else max_tokens
        job = Job(f"{next(self._ids)}", kind, len(tokens), output, self.clock())
        waiter = self._submit(job)
        try:
            if body.get("stream"):
                response = await self._stream(request, job, waiter, body)
            else:
                while not (await waiter.get()).finished:
                    pass
                response = web.json_response(self._completion(job, job.generated, final=True, stream=False))
            entry.status = "ok"
            return response
        except (ConnectionResetError, asyncio.CancelledError):
            entry.status = "failed"
            raise
        finally:
            self._waiters.pop(job.id, None)

    async def _pull_from_prefill(self, params: dict[str, Any]) -> str:
        host, port = params.get("remote_host"), params.get("remote_port")
        url = f"http://{host}:{port}{PULL_PATH}"
        pull = {
            "remote_engine_id": params.get("remote_engine_id"),
            "block_ids": params.get("remote_block_ids"),
        }
        assert self._session is not None
        try:
            async with self._session.post(url, json=pull) as answer:
                return (
                    "ok" if answer.status == 200 else f"HTTP {answer.status}: {(await answer.text())[:200]}"
                )
        except (aiohttp.ClientError, TimeoutError) as error:
            return f"{url}: {error!r}"

    async def _stream(
        self, request: web.Request, job: Job, waiter: asyncio.Queue[Progress], body: dict[str, Any]
    ) -> web.StreamResponse:
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)
        sent = 0
        finished = False
        while not finished:
            item = await waiter.get()
            finished = item.finished
            if item.generated > sent or finished:  # _deliver passes on every stream interval
                chunk = self._completion(job, item.generated - sent, final=finished, stream=True)
                await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
                sent = item.generated
        if (body.get("stream_options") or {}).get("include_usage"):
            usage = self._completion(job, 0, final=True, stream=True)
            usage["choices"] = []
            await response.write(f"data: {json.dumps(usage)}\n\n".encode())
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    def _completion(self, job: Job, new_tokens: int, *, final: bool, stream: bool) -> dict[str, Any]:
        """vLLM's completion object (a chunk of one when streaming)."""
        choice = {
            "index": 0,
            "text": TOKEN_TEXT * new_tokens,
            "logprobs": None,
            "finish_reason": "length" if final else None,
            "stop_reason": None,
        }
        answer: dict[str, Any] = {
            "id": f"cmpl-{self.engine_id[:8]}-{job.id}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": self.model_name,
            "choices": [choice],
        }
        if final:
            answer["usage"] = {
                "prompt_tokens": job.prompt_tokens,
                "completion_tokens": job.generated,
                "total_tokens": job.prompt_tokens + job.generated,
            }
        if not stream or final:
            answer["kv_transfer_params"] = self._transfer_params(job) if final else None
        return answer

    def _transfer_params(self, job: Job) -> dict[str, Any] | None:
        if job.kind is not JobKind.PREFILL:
            return None
        host, port = self.side_channel
        return {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_block_ids": list(job.blocks),
            "remote_engine_id": self.engine_id,
            "remote_host": host,
            "remote_port": port,
            "tp_size": self.instance.hardware.gpus_per_instance,
        }


def _error(status: int, message: str) -> web.Response:
    kind = "BadRequestError" if status == 400 else "NotFoundError"
    return web.json_response({"error": {"message": message, "type": kind, "code": status}}, status=status)
