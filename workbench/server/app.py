"""The ASGI app: llama-server's OpenAI-compatible endpoints over a batched `Scheduler`.

Requests are validated here (api.py), tokenized with the model's chat template, and queued
on the scheduler; its thread calls back with events, which reach the request's coroutine
through the event loop. A streaming client that goes away is cancelled at the next pass
(Starlette cancels the stream; the generator's cleanup cancels the request); a waiting
non-streaming client is checked for disconnection while it waits.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import os
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request as HTTPRequest
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ..engine import ContextFullError, DoneEvent, Engine, TokenEvent
from ..engine.scheduler import ActiveRequest, ErrorEvent, QueueFullError, Request, Scheduler, ShuttingDownError
from ..engine.chat import ChatTemplateError, Message
from . import api
from .api import ApiError

MAX_BODY = 16 << 20  # bytes of a request body
RETRY_AFTER = 1  # seconds, on 503 (queue full)


@dataclass
class ServerState:
    """The engine, its scheduler and the server's counters (shared with /metrics and the app)."""

    engine: Engine
    scheduler: Scheduler
    model_id: str = ""
    api_key: str | None = None
    started: float = field(default_factory=time.time)
    shutting_down: bool = False
    http: dict[tuple[str, int], int] = field(default_factory=dict)  # (path, status) -> count
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        if not self.model_id:
            self.model_id = os.path.basename(self.engine.path)

    def count(self, path: str, status: int) -> None:
        with self.lock:
            self.http[(path, status)] = self.http.get((path, status), 0) + 1

    def active(self) -> list[ActiveRequest]:
        """Requests in slots or waiting: id, state, slot, tokens, t/s, KV node (thread-safe)."""
        return self.scheduler.active()

    def model_names(self) -> set[str]:
        path = self.engine.path
        base = os.path.basename(path)
        return {self.model_id, path, base, os.path.splitext(base)[0]}


def _error(e: ApiError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status, headers=e.headers)


async def _json_body(request: HTTPRequest) -> Any:
    body = await request.body()
    if len(body) > MAX_BODY:
        raise ApiError(413, f"request body of {len(body)} bytes exceeds {MAX_BODY}")
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError) as e:
        raise ApiError(400, f"request body is not valid JSON: {e}") from None


def chat_prompt(engine: Engine, messages: list[Message]) -> list[int]:
    """Token ids of a conversation, rendered with the model's chat template (as `Chat`)."""
    text = engine.chat_format.render(messages, add_generation_prompt=True)
    tok = engine.tokenizer
    bos_text = tok.token_text(tok.bos_id) if tok.bos_id is not None else None
    add_bos = tok.add_bos and not (bos_text and text.startswith(bos_text))
    return tok.encode(text, add_bos=add_bos, parse_special=True)


def _check_model(state: ServerState, g: api.GenRequest) -> None:
    if g.model and g.model not in state.model_names():
        raise ApiError(404, f"the model '{g.model}' does not exist (this server has '{state.model_id}')",
                       "invalid_request_error", "model", "model_not_found")


def _submit(state: ServerState, g: api.GenRequest, ids: list[int]) -> tuple[Request, asyncio.Queue]:
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue()

    def on_event(ev: object) -> None:
        try:
            loop.call_soon_threadsafe(queue.put_nowait, ev)
        except RuntimeError:  # the loop closed (shutdown): nobody listens any more
            pass
    vocab = state.engine.tokenizer.n_vocab
    if any(t < 0 or t >= vocab for t in ids):
        raise ApiError(400, f"token ids must be in [0, {vocab})", param="prompt")
    req = Request(prompt=ids, params=g.params, n_predict=g.n_predict, stop=g.stop,
                  frequency_penalty=g.frequency_penalty, presence_penalty=g.presence_penalty,
                  stop_ids=set() if g.ignore_eos else None, on_event=on_event, id=uuid.uuid4().hex[:24])
    sch = state.scheduler
    try:
        sch.submit(req)
    except QueueFullError as e:
        raise ApiError(503, str(e), "server_error", code="queue_full",
                       headers={"Retry-After": str(RETRY_AFTER)}) from None
    except ShuttingDownError as e:
        raise ApiError(503, str(e), "server_error", code="shutting_down") from None
    except ContextFullError as e:
        raise ApiError(400, f"the request exceeds the available context size: {e}",
                       param="messages", code="context_length_exceeded") from None
    except ValueError as e:
        raise ApiError(400, str(e)) from None
    return req, queue


def _sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, ensure_ascii=False).encode() + b"\n\n"


async def _generate(request: HTTPRequest, state: ServerState, g: api.GenRequest, ids: list[int],
                    chat: bool) -> Response:
    req, queue = _submit(state, g, ids)
    sch = state.scheduler
    created = int(time.time())
    rid = ("chatcmpl-" if chat else "cmpl-") + req.id
    obj = "chat.completion.chunk" if chat else "text_completion"

    def chunk(text: str | None, finish: str | None = None, extra: dict | None = None, role: bool = False) -> dict:
        if chat:
            delta: dict = {}
            if role:
                delta["role"] = "assistant"
            if text is not None:
                delta["content"] = text
            choice = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
        else:
            choice = {"index": 0, "text": text or "", "finish_reason": finish, "logprobs": None}
        d = {"id": rid, "object": obj, "created": created, "model": state.model_id,
             "system_fingerprint": "numawb", "choices": [choice]}
        if extra:
            d.update(extra)
        return d

    def final(done: DoneEvent) -> dict:
        d = {"usage": api.usage(len(ids), len(done.tokens)),
             "timings": api.timings(done.stats, req.reused, len(done.tokens))}
        if g.return_tokens:
            d["tokens"] = list(done.tokens)
        return d

    if g.stream:
        async def events():
            finished = False
            try:
                if chat:
                    yield _sse(chunk("", role=True))
                while True:
                    ev = await queue.get()
                    if isinstance(ev, TokenEvent):
                        yield _sse(chunk(ev.text))
                    elif isinstance(ev, DoneEvent):
                        finished = True
                        yield _sse(chunk(None if chat else "", api.FINISH.get(ev.stats.stop_reason, "stop"),
                                         final(ev)))
                        yield b"data: [DONE]\n\n"
                        return
                    elif isinstance(ev, ErrorEvent):
                        finished = True
                        yield _sse(ApiError(500, ev.message, "server_error").body())
                        return
            finally:
                if not finished:  # the client went away (or the server is stopping): free the slot
                    sch.cancel(req)
        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    parts: list[str] = []
    try:
        while True:
            try:
                ev = await asyncio.wait_for(queue.get(), 0.5)
            except asyncio.TimeoutError:
                if await request.is_disconnected():
                    sch.cancel(req)
                    return Response(status_code=499)
                continue
            if isinstance(ev, TokenEvent):
                parts.append(ev.text)
            elif isinstance(ev, DoneEvent):
                break
            elif isinstance(ev, ErrorEvent):
                raise ApiError(500, ev.message, "server_error")
    except asyncio.CancelledError:
        sch.cancel(req)
        raise
    text = "".join(parts)
    finish = api.FINISH.get(ev.stats.stop_reason, "stop")
    if chat:
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish,
                  "logprobs": None}
        kind = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "finish_reason": finish, "logprobs": None}
        kind = "text_completion"
    return JSONResponse({"id": rid, "object": kind, "created": created, "model": state.model_id,
                         "system_fingerprint": "numawb", "choices": [choice], **final(ev)})


def create_app(state: ServerState) -> Starlette:
    """The Starlette app over a running scheduler (the caller owns and closes both)."""

    async def chat_completions(request: HTTPRequest) -> Response:
        body = await _json_body(request)
        g = api.parse_common(body)
        messages = api.parse_messages(body)
        _check_model(state, g)
        if not getattr(state.engine.chat_format, "can_chat", True):  # a base model: no turns invented
            raise ApiError(400, f"model '{state.model_id}' has no chat template (it completes text, it does not "
                                "chat); use /v1/completions", param="messages", code="no_chat_template")
        try:
            ids = chat_prompt(state.engine, messages)
        except ChatTemplateError as e:
            raise ApiError(400, str(e), param="messages") from None
        return await _generate(request, state, g, ids, chat=True)

    async def completions(request: HTTPRequest) -> Response:
        body = await _json_body(request)
        g = api.parse_common(body)
        prompt = api.parse_prompt(body)
        _check_model(state, g)
        if body.get("echo"):
            raise ApiError(400, "'echo' is not supported", param="echo")
        ids = prompt if isinstance(prompt, list) else \
            state.engine.tokenizer.encode(prompt, add_bos=None, parse_special=True)
        return await _generate(request, state, g, ids, chat=False)

    async def models(request: HTTPRequest) -> Response:
        eng = state.engine
        try:
            created = int(os.path.getmtime(eng.path))
        except OSError:
            created = int(state.started)
        return JSONResponse({"object": "list", "data": [{
            "id": state.model_id, "object": "model", "created": created, "owned_by": "numawb",
            "meta": {"n_ctx_slot": state.scheduler.n_ctx, "n_parallel": state.scheduler.n_parallel,
                     "n_ctx_train": eng.cfg.n_ctx_train, "n_vocab": eng.tokenizer.n_vocab,
                     "n_params": eng.n_params, "size": eng.weight_bytes, "arch": eng.cfg.arch}}]})

    async def health(request: HTTPRequest) -> Response:
        if state.shutting_down:
            return JSONResponse(ApiError(503, "the server is shutting down", "server_error").body(), 503)
        sch = state.scheduler
        return JSONResponse({"status": "ok", "slots_idle": sch.n_parallel - sch.running,
                             "slots_processing": sch.running, "requests_waiting": sch.queued})

    async def metrics(request: HTTPRequest) -> Response:
        from .metrics import render
        body, ctype = await asyncio.get_running_loop().run_in_executor(None, render, state)
        return Response(body, media_type=None, headers={"Content-Type": ctype})

    def wrap(fn):
        async def endpoint(request: HTTPRequest) -> Response:
            try:
                return await fn(request)
            except ApiError as e:
                return _error(e)
        return endpoint

    routes = [Route("/v1/chat/completions", wrap(chat_completions), methods=["POST"]),
              Route("/chat/completions", wrap(chat_completions), methods=["POST"]),
              Route("/v1/completions", wrap(completions), methods=["POST"]),
              Route("/completions", wrap(completions), methods=["POST"]),
              Route("/v1/models", wrap(models), methods=["GET"]),
              Route("/models", wrap(models), methods=["GET"]),
              Route("/health", wrap(health), methods=["GET"]),
              Route("/v1/health", wrap(health), methods=["GET"]),
              Route("/metrics", wrap(metrics), methods=["GET"])]

    async def not_found(request: HTTPRequest, exc: Exception) -> Response:
        return _error(ApiError(404, f"no such endpoint: {request.method} {request.url.path}",
                               "not_found_error"))

    async def not_allowed(request: HTTPRequest, exc: Exception) -> Response:
        return _error(ApiError(405, f"method {request.method} not allowed on {request.url.path}"))

    async def server_error(request: HTTPRequest, exc: Exception) -> Response:
        return _error(ApiError(500, f"{type(exc).__name__}: {exc}", "server_error"))

    app = Starlette(routes=routes, exception_handlers={404: not_found, 405: not_allowed,
                                                       Exception: server_error})
    return _Guard(app, state)


class _Guard:
    """ASGI middleware: the API key on every request, and request counts by path and status."""

    def __init__(self, app, state: ServerState):
        self.app, self.state = app, state

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        known = path if path in _PATHS else "other"
        state = self.state
        if state.api_key is not None:
            headers = dict(scope.get("headers") or [])
            auth = headers.get(b"authorization", b"").decode("latin-1")
            key = auth[7:].strip() if auth.lower().startswith("bearer ") else \
                headers.get(b"x-api-key", b"").decode("latin-1")
            if not hmac.compare_digest(key.encode(), state.api_key.encode()):
                e = ApiError(401, "invalid or missing API key (send 'Authorization: Bearer KEY')",
                             "authentication_error", code="invalid_api_key")
                state.count(known, 401)
                await _error(e)(scope, receive, send)
                return
        status = [0]

        async def counting_send(message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)
        try:
            await self.app(scope, receive, counting_send)
        finally:
            state.count(known, status[0] or 499)


_PATHS = {"/v1/chat/completions", "/chat/completions", "/v1/completions", "/completions", "/v1/models",
          "/models", "/health", "/v1/health", "/metrics"}
