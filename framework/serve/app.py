"""The FastAPI app: OpenAI's completions and chat completions (streamed as server-sent events),
models, vLLM's tokenize / detokenize / version, health and Prometheus metrics, over an
`EngineLoop`.

A body is read up to `max_request_bytes` (413 beyond), then parsed, checked and tokenized in a
worker thread (`schedlab.serve.prepare`), so no request holds up the event loop or the engine.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request as HTTPRequest

from schedlab.serve.events import StreamEvent
from schedlab.serve.loop import EngineLoop
from schedlab.serve.prepare import (
    ApiError,
    ModelInfo,
    Prepared,
    chat_prompt,
    check_ids,
    check_model,
    prepare,
)
from schedlab.serve.prom import CONTENT_TYPE, ServerMetrics
from schedlab.serve.protocol import (
    BodyError,
    DetokenizeRequest,
    ResponseShape,
    TokenizeRequest,
    error_body,
    parse,
)

log = logging.getLogger("schedlab.serve")

#: paths served without the API key (as vLLM: probes and scrapers)
OPEN_PATHS = ("/health", "/metrics", "/version")


@dataclass(slots=True)
class ServeState:
    """What the handlers share.

    Args:
        loop: the engine loop (started by whoever runs the server).
        info: the served names, limits and tokenizer.
        metrics: the Prometheus registry behind /metrics.
        max_request_bytes: the largest body taken (413 beyond).
        api_key: the key clients must send as `Authorization: Bearer <key>`; None: none.
        version: what /version answers.
    """

    loop: EngineLoop
    info: ModelInfo
    metrics: ServerMetrics
    max_request_bytes: int
    api_key: str | None = None
    version: str = ""


def build_app(state: ServeState) -> FastAPI:
    """The app; every route reads `state`."""
    app = FastAPI(title="schedlab serve", docs_url=None, redoc_url=None, openapi_url=None)
    info = state.info

    def error(message: str, status: int = 400, param: str | None = None) -> JSONResponse:
        state.metrics.count_error(status)
        return JSONResponse(error_body(message, status, param), status_code=status)

    if state.api_key is not None:
        app.add_middleware(_RequireKey, key=state.api_key, refuse=error)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: HTTPRequest, exc: StarletteHTTPException) -> JSONResponse:
        return error(str(exc.detail), exc.status_code)

    @app.exception_handler(ApiError)
    async def _api(_: HTTPRequest, exc: ApiError) -> JSONResponse:
        return error(str(exc), exc.status, exc.param)

    @app.api_route("/health", methods=["GET", "HEAD"])
    async def health() -> Response:
        if state.loop.draining:
            return error("the server is shutting down", 503)
        return Response(status_code=200)

    def card(name: str) -> dict[str, Any]:
        return {"id": name, "object": "model", "created": int(time.time()),
                "owned_by": "schedlab", "root": info.names[0],
                "max_model_len": info.max_model_len}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [card(n) for n in info.names]}

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str) -> dict[str, Any]:
        check_model(info, model_id)
        return card(model_id)

    @app.api_route("/metrics", methods=["GET", "HEAD"])
    async def metrics() -> Response:
        return Response(state.metrics.render(), media_type=CONTENT_TYPE)

    @app.get("/version")
    async def version() -> dict[str, str]:
        return {"version": state.version}

    @app.post("/v1/completions")
    async def completions(raw: HTTPRequest) -> Response:
        return await _generate(state, error, await _prepare(state, raw, False), raw)

    @app.post("/v1/chat/completions")
    async def chat(raw: HTTPRequest) -> Response:
        return await _generate(state, error, await _prepare(state, raw, True), raw)

    @app.post("/tokenize")
    async def tokenize(raw: HTTPRequest) -> dict[str, Any]:
        body = await _read(state, raw)
        return await _off_loop(_tokenize, info, body)

    @app.post("/detokenize")
    async def detokenize(raw: HTTPRequest) -> dict[str, Any]:
        body = await _read(state, raw)
        return await _off_loop(_detokenize, info, body)

    return app


class _RequireKey:
    """ASGI middleware: 401 unless `Authorization: Bearer <key>` (except `OPEN_PATHS`)."""

    def __init__(self, app, key: str, refuse) -> None:
        self.app = app
        self.expected = f"Bearer {key}".encode()
        self.refuse = refuse

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope["path"] not in OPEN_PATHS:
            sent = dict(scope["headers"]).get(b"authorization", b"")
            if not secrets.compare_digest(sent, self.expected):
                response = self.refuse("a valid API key is required: Authorization: Bearer "
                                       "<key>", 401)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


async def _read(state: ServeState, raw: HTTPRequest) -> bytes:
    """The body, refused with a 413 as soon as it is known to exceed the limit."""
    limit = state.max_request_bytes
    declared = raw.headers.get("content-length", "")
    too_big = ApiError(f"the request body is larger than {limit} bytes (--max-request-bytes)",
                       413)
    if declared.isdigit() and int(declared) > limit:
        raise too_big
    parts, size = [], 0
    async for chunk in raw.stream():
        size += len(chunk)
        if size > limit:
            raise too_big
        parts.append(chunk)
    return b"".join(parts)


async def _prepare(state: ServeState, raw: HTTPRequest, chat: bool) -> Prepared:
    body = await _read(state, raw)
    return await _off_loop(prepare, state.info, body, chat)


async def _off_loop(fn, *args):
    """`fn(*args)` in a worker thread; an unexpected error is one logged 500, not a trace per
    client."""
    try:
        return await asyncio.to_thread(fn, *args)
    except ApiError:
        raise
    except Exception as e:  # noqa: BLE001 - the request fails, the server goes on
        log.exception("preparing a request failed")
        raise ApiError(f"the server could not prepare this request: {type(e).__name__}",
                       500) from None


def _tokenize(info: ModelInfo, raw: bytes) -> dict[str, Any]:
    try:
        body = parse(TokenizeRequest, raw)
    except BodyError as e:
        raise ApiError(str(e), 400, e.param) from None
    check_model(info, body.model)
    if (body.prompt is None) == (body.messages is None):
        raise ApiError("give either prompt or messages", param="prompt")
    if info.tokenizer is None:
        raise ApiError("this model has no tokenizer", param="prompt")
    if body.messages is not None:
        msgs = [{"role": m.role, "content": m.content if isinstance(m.content, str) else ""}
                for m in body.messages]
        ids = chat_prompt(info, msgs, body.add_generation_prompt)
    else:
        ids = info.tokenizer.encode(body.prompt, add_special_tokens=body.add_special_tokens)
    return {"count": len(ids), "max_model_len": info.max_model_len, "tokens": ids}


def _detokenize(info: ModelInfo, raw: bytes) -> dict[str, Any]:
    try:
        body = parse(DetokenizeRequest, raw)
    except BodyError as e:
        raise ApiError(str(e), 400, e.param) from None
    check_model(info, body.model)
    if info.tokenizer is None:
        raise ApiError("this model has no tokenizer", param="tokens")
    if body.tokens:
        check_ids(info, body.tokens)
    return {"prompt": info.tokenizer.decode(body.tokens)}


async def _generate(state: ServeState, error, p: Prepared, raw: HTTPRequest) -> Response:
    loop = state.loop
    rid = p.request.request_id
    stream = loop.submit(p.request)
    try:
        first = await stream.get()
    except asyncio.CancelledError:
        loop.abort(rid)
        raise
    if first.error is not None:
        return error(first.error, first.status)
    if p.stream:
        return StreamingResponse(_sse(state, stream, p), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})
    collect = asyncio.ensure_future(_collect(stream))
    gone = asyncio.ensure_future(_disconnected(raw))
    try:
        await asyncio.wait({collect, gone}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        loop.abort(rid)
        raise
    finally:
        gone.cancel()
    if not collect.done():  # the client went away: nobody wants the rest
        loop.abort(rid)
        collect.cancel()
        return Response(status_code=499)
    text, ids, last = collect.result()
    if last.error is not None:
        return error(last.error, last.status)
    return JSONResponse(p.shape.whole(text, last.finish_reason or "abort",
                                      last.num_prompt_tokens, last.num_output_tokens,
                                      ids if p.return_token_ids else None))


async def _collect(stream) -> tuple[str, list[int], StreamEvent]:
    parts: list[str] = []
    ids: list[int] = []
    while True:
        ev = await stream.get()
        parts.append(ev.text)
        ids.extend(ev.token_ids)
        if ev.finished:
            return "".join(parts), ids, ev


async def _disconnected(raw: HTTPRequest) -> None:
    """Returns when the client has closed the connection (the body is already read)."""
    while (await raw.receive())["type"] != "http.disconnect":
        pass


def _data(obj: Any) -> str:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"


async def _sse(state: ServeState, stream, p: Prepared) -> AsyncIterator[str]:
    """Server-sent events: a chunk per step with new text, usage if asked, `[DONE]`.

    NOTE: a client that goes away cancels this generator; the `finally` aborts its request,
    which frees its KV blocks on the engine thread.
    """
    shape: ResponseShape = p.shape
    done = False
    first = True
    try:
        while True:
            ev: StreamEvent = await stream.get()
            if ev.error is not None:  # the request failed mid-stream
                done = True
                state.metrics.count_error(ev.status)
                yield _data(error_body(ev.error, ev.status))
                break
            text = ev.text if (ev.text or not shape.chat or first) else None
            now = (ev.num_prompt_tokens, ev.num_output_tokens) if p.continuous_usage else None
            yield _data(shape.chunk(text, ev.finish_reason, role=first and shape.chat,
                                    usage_now=now,
                                    token_ids=ev.token_ids if p.return_token_ids else None))
            first = False
            if ev.finished:
                done = True
                if p.include_usage:
                    yield _data(shape.usage_chunk(ev.num_prompt_tokens, ev.num_output_tokens))
                break
        yield "data: [DONE]\n\n"
    finally:
        if not done:
            state.loop.abort(shape.id)
