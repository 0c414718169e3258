"""The FastAPI app: OpenAI's completions and chat completions (streamed as server-sent events),
models, health and Prometheus metrics, over an `EngineLoop`."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request as HTTPRequest

from schedlab.request import SamplingParams
from schedlab.serve.loop import EngineLoop, GenerateRequest, StreamEvent
from schedlab.serve.prom import CONTENT_TYPE, ServerMetrics
from schedlab.serve.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    ResponseShape,
    error_body,
)

#: how often a non-streamed request checks whether its client is still there (s)
_DISCONNECT_POLL_S = 1.0


@dataclass(slots=True)
class ServeState:
    """What the handlers share.

    Args:
        loop: the engine loop (started by whoever runs the server).
        model_name: the name clients send as `model` (also in /v1/models).
        max_model_len: the engine's prompt + output limit.
        tokenizer: encodes text prompts, applies the chat template; None: token ids only.
        metrics: the Prometheus registry behind /metrics.
    """

    loop: EngineLoop
    model_name: str
    max_model_len: int
    tokenizer: Any
    metrics: ServerMetrics


class BadRequest(Exception):
    """A request the server refuses with a 400 (the message says why)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


def _error(message: str, status: int = 400, param: str | None = None) -> JSONResponse:
    return JSONResponse(error_body(message, status, param), status_code=status)


def build_app(state: ServeState) -> FastAPI:
    """The app; every route reads `state`."""
    app = FastAPI(title="schedlab serve", docs_url=None, redoc_url=None)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: HTTPRequest, exc: RequestValidationError) -> JSONResponse:
        errs = exc.errors()
        first = errs[0] if errs else {}
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        msg = first.get("msg", "invalid request")
        if first.get("type") == "json_invalid":
            return _error(f"the body is not valid JSON: {first.get('ctx', {}).get('error', msg)}")
        return _error(f"{where}: {msg}" if where else msg, param=where or None)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: HTTPRequest, exc: StarletteHTTPException) -> JSONResponse:
        return _error(str(exc.detail), exc.status_code)

    @app.exception_handler(BadRequest)
    async def _bad(_: HTTPRequest, exc: BadRequest) -> JSONResponse:
        return _error(str(exc), 400, exc.param)

    @app.get("/health")
    async def health() -> Response:
        if state.loop.draining:
            return _error("the server is shutting down", 503)
        return Response(status_code=200)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{
            "id": state.model_name, "object": "model", "created": int(time.time()),
            "owned_by": "schedlab", "max_model_len": state.max_model_len}]}

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(state.metrics.render(), media_type=CONTENT_TYPE)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, raw: HTTPRequest) -> Response:
        _check_common(state, body)
        ids = _completion_prompt(state, body.prompt)
        return await _generate(state, body, ids, body.max_tokens, ResponseShape(
            False, state.model_name), raw)

    @app.post("/v1/chat/completions")
    async def chat(body: ChatCompletionRequest, raw: HTTPRequest) -> Response:
        _check_common(state, body)
        ids = _chat_prompt(state, body)
        return await _generate(state, body, ids, body.output_limit, ResponseShape(
            True, state.model_name), raw)

    return app


def _check_common(state: ServeState, body: CompletionRequest | ChatCompletionRequest) -> None:
    why = body.unsupported()
    if why is not None:
        raise BadRequest(why)
    if body.model is not None and body.model != state.model_name:
        raise BadRequest(f"the model {body.model!r} does not exist; this server serves "
                         f"{state.model_name!r} (GET /v1/models)", "model")


def _completion_prompt(state: ServeState, prompt: Any) -> list[int]:
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list):
        if len(prompt) != 1:
            raise BadRequest(f"{len(prompt)} prompts in one request; send one prompt per "
                             "request", "prompt")
        prompt = prompt[0]
    if isinstance(prompt, list):
        return prompt
    if state.tokenizer is None:
        raise BadRequest("this model has no tokenizer: send the prompt as a list of token ids",
                         "prompt")
    return state.tokenizer.encode(prompt, add_special_tokens=False)


def _chat_prompt(state: ServeState, body: ChatCompletionRequest) -> list[int]:
    tok = state.tokenizer
    if tok is None or not getattr(tok, "chat_template", None):
        raise BadRequest("this model's tokenizer has no chat template, so /v1/chat/completions "
                         "cannot build a prompt; use /v1/completions", "messages")
    try:
        text = tok.apply_chat_template(body.template_messages(), add_generation_prompt=True,
                                       tokenize=False)
    except Exception as e:  # noqa: BLE001 - a template error is the request's fault
        raise BadRequest(f"the chat template could not be applied: {e}", "messages") from None
    return tok.encode(text, add_special_tokens=False)


def _sampling(state: ServeState, body: Any, num_prompt: int,
              max_tokens: int | None) -> SamplingParams:
    if max_tokens is None:  # as vLLM: up to the context limit
        max_tokens = max(1, state.max_model_len - num_prompt)
    try:
        return SamplingParams(
            temperature=1.0 if body.temperature is None else body.temperature,
            top_p=1.0 if body.top_p is None else body.top_p,
            top_k=0 if body.top_k is None else body.top_k,
            max_tokens=max_tokens, seed=body.seed, ignore_eos=body.ignore_eos,
            stop_token_ids=body.stop_token_ids or [])
    except ValueError as e:
        raise BadRequest(str(e), str(e).split(" ", 1)[0]) from None


async def _generate(state: ServeState, body: Any, ids: list[int], max_tokens: int | None,
                    shape: ResponseShape, raw: HTTPRequest) -> Response:
    params = _sampling(state, body, len(ids), max_tokens)
    loop = state.loop
    stream = loop.submit(GenerateRequest(shape.id, ids, params, body.stop_strings))
    try:
        first = await stream.get()
    except asyncio.CancelledError:
        loop.abort(shape.id)
        raise
    if first.error is not None:
        return _error(first.error, first.status)
    if body.stream:
        return StreamingResponse(_sse(loop, stream, shape, body.include_usage),
                                 media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})
    parts: list[str] = []
    last = first
    try:
        while not last.finished:
            try:
                last = await asyncio.wait_for(stream.get(), _DISCONNECT_POLL_S)
            except asyncio.TimeoutError:
                if await raw.is_disconnected():
                    loop.abort(shape.id)
                    return Response(status_code=499)
                continue
            parts.append(last.text)
    except asyncio.CancelledError:
        loop.abort(shape.id)
        raise
    if last.error is not None:
        return _error(last.error, last.status)
    return JSONResponse(shape.whole("".join(parts), last.finish_reason or "abort",
                                    last.num_prompt_tokens, last.num_output_tokens))


def _data(obj: Any) -> str:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"


async def _sse(loop: EngineLoop, stream, shape: ResponseShape,
               include_usage: bool) -> AsyncIterator[str]:
    """Server-sent events: a chunk per step with new text, usage if asked, `[DONE]`.

    NOTE: a client that goes away cancels this generator; the `finally` aborts its request,
    which frees its KV blocks on the engine thread.
    """
    done = False
    first = True
    try:
        while True:
            ev: StreamEvent = await stream.get()
            if ev.error is not None:  # the engine failed mid-stream
                done = True
                yield _data(error_body(ev.error, ev.status))
                break
            text = ev.text if (ev.text or not shape.chat or first) else None
            yield _data(shape.chunk(text, ev.finish_reason, role=first and shape.chat))
            first = False
            if ev.finished:
                done = True
                if include_usage:
                    yield _data(shape.usage_chunk(ev.num_prompt_tokens, ev.num_output_tokens))
                break
        yield "data: [DONE]\n\n"
    finally:
        if not done:
            loop.abort(shape.id)
