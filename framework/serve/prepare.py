"""From a request body's bytes to what the engine loop takes: parse, validate, tokenize.

Runs in a worker thread, off the event loop and the engine thread: everything here is bounded
by the body limit, and the prompt's length is checked before anything looks at each token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from schedlab.request import SamplingParams
from schedlab.serve.events import GenerateRequest
from schedlab.serve.protocol import (
    BodyError,
    ChatCompletionRequest,
    CompletionRequest,
    ResponseShape,
    parse,
)


class ApiError(Exception):
    """A request the server refuses (the message says why) with an HTTP status."""

    def __init__(self, message: str, status: int = 400, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.param = param


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """What intake checks a request against.

    Args:
        names: the names clients may send as `model` (the first is answered with).
        max_model_len: the engine's prompt + output limit.
        vocab_size: token ids must be in [0, vocab_size).
        tokenizer: encodes text prompts and applies the chat template; None: token ids only.
    """

    names: tuple[str, ...]
    max_model_len: int
    vocab_size: int
    tokenizer: Any


@dataclass(slots=True)
class Prepared:
    """A validated request, ready for `EngineLoop.submit`."""

    request: GenerateRequest
    shape: ResponseShape
    stream: bool
    include_usage: bool
    continuous_usage: bool
    return_token_ids: bool


def check_model(info: ModelInfo, model: str | None) -> None:
    """Raises ApiError (404) for a model this server does not serve."""
    if model is not None and model not in info.names:
        raise ApiError(f"the model {model!r} does not exist; this server serves "
                       f"{', '.join(map(repr, info.names))} (GET /v1/models)", 404, "model")


def prepare(info: ModelInfo, raw: bytes, chat: bool) -> Prepared:
    """Parse and check one completions (or chat) body and tokenize its prompt.

    Raises:
        ApiError: the body is refused (400, or 404 for an unknown model).
    """
    try:
        body: ChatCompletionRequest | CompletionRequest = (
            parse(ChatCompletionRequest, raw) if chat else parse(CompletionRequest, raw))
        why = body.unsupported()
        if why is not None:
            raise ApiError(why)
        check_model(info, body.model)
        if isinstance(body, ChatCompletionRequest):
            ids = chat_prompt(info, body.template_messages())
            max_tokens = body.output_limit
        else:
            ids = completion_prompt(info, body.prompt)
            max_tokens = body.max_tokens
        check_ids(info, ids)
        params = _sampling(info, body, len(ids), max_tokens)
    except BodyError as e:
        raise ApiError(str(e), 400, e.param) from None
    shape = ResponseShape(chat, info.names[0])
    g = GenerateRequest(shape.id, ids, params, body.stop_strings, client_id=body.user,
                        priority=body.priority, deadline_ms=body.deadline_ms,
                        slo_class=body.slo_class,
                        expected_output_len=body.expected_output_len)
    return Prepared(g, shape, bool(body.stream), body.include_usage, body.continuous_usage,
                    body.return_token_ids)


def completion_prompt(info: ModelInfo, prompt: Any) -> list[int]:
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list):
        if len(prompt) != 1:
            raise ApiError(f"{len(prompt)} prompts in one request; send one prompt per "
                           "request", param="prompt")
        prompt = prompt[0]
    if isinstance(prompt, list):
        return prompt
    if info.tokenizer is None:
        raise ApiError("this model has no tokenizer: send the prompt as a list of token ids",
                       param="prompt")
    return info.tokenizer.encode(prompt, add_special_tokens=False)


def chat_prompt(info: ModelInfo, messages: list[dict[str, Any]],
                add_generation_prompt: bool = True) -> list[int]:
    tok = info.tokenizer
    if tok is None or not getattr(tok, "chat_template", None):
        raise ApiError("this model's tokenizer has no chat template, so /v1/chat/completions "
                       "cannot build a prompt; use /v1/completions", param="messages")
    try:
        text = tok.apply_chat_template(messages, add_generation_prompt=add_generation_prompt,
                                       tokenize=False)
    except Exception as e:  # noqa: BLE001 - a template error is the request's fault
        raise ApiError(f"the chat template could not be applied: {e}",
                       param="messages") from None
    return tok.encode(text, add_special_tokens=False)


def check_ids(info: ModelInfo, ids: list[int]) -> None:
    """The prompt's length first, then its range (both at C speed)."""
    if not ids:
        raise ApiError("empty prompt: a request needs at least one prompt token",
                       param="prompt")
    if len(ids) > info.max_model_len:
        raise ApiError(f"prompt has {len(ids)} tokens, more than max_model_len="
                       f"{info.max_model_len}", param="prompt")
    lo, hi = min(ids), max(ids)
    if lo < 0 or hi >= info.vocab_size:
        bad = lo if lo < 0 else hi
        raise ApiError(f"prompt token id {bad} is outside the vocabulary "
                       f"[0, {info.vocab_size})", param="prompt")


def _sampling(info: ModelInfo, body: Any, num_prompt: int,
              max_tokens: int | None) -> SamplingParams:
    if max_tokens is None:  # as vLLM: up to the context limit
        max_tokens = max(1, info.max_model_len - num_prompt)
    bias = body.token_bias()
    if bias:
        bad = next((t for t in bias if not 0 <= t < info.vocab_size), None)
        if bad is not None:
            raise ApiError(f"logit_bias: token id {bad} is outside the vocabulary "
                           f"[0, {info.vocab_size})", param="logit_bias")

    def either(v, default):
        return default if v is None else v

    try:
        return SamplingParams(
            temperature=either(body.temperature, 1.0), top_p=either(body.top_p, 1.0),
            top_k=either(body.top_k, 0), max_tokens=max_tokens, seed=body.seed,
            ignore_eos=body.ignore_eos, stop_token_ids=body.stop_token_ids or [],
            min_tokens=body.min_tokens, presence_penalty=either(body.presence_penalty, 0.0),
            frequency_penalty=either(body.frequency_penalty, 0.0),
            repetition_penalty=either(body.repetition_penalty, 1.0), logit_bias=bias)
    except ValueError as e:
        raise ApiError(str(e), param=str(e).split(" ", 1)[0]) from None
