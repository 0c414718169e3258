"""Request bodies of the OpenAI API subset served, and the JSON the server answers with.

Bodies are strict pydantic models parsed from the raw bytes (`parse`): `"max_tokens": "5"`,
`"stream": "yes"`, `true` for a number, NaN or infinity, and invalid UTF-16 (a lone surrogate)
are refused with a 400; `null` is taken wherever OpenAI allows it (as the field's default).
What schedlab cannot honour is refused with a 400 naming it: `n > 1`, `logprobs`,
`top_logprobs`, `echo`, `best_of > 1`, `tools` / `functions`, a `response_format` other than
text, `max_completion_tokens` on /v1/completions, and vLLM's extras in `NOT_HONOURED` set to
anything but their default; other fields (`metadata`, `store`, ...) are ignored.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

#: a prompt: text, token ids, or a one-element list of either (OpenAI's batch form, n=1)
Prompt = str | list[int] | list[str] | list[list[int]]

_STRICT = ConfigDict(extra="ignore", strict=True, allow_inf_nan=False)
#: fields OpenAI or vLLM take that would change the output if honoured, each with the value that
#: leaves it as it is (null and [] too): any other value is refused, never ignored
NOT_HONOURED: dict[str, Any] = {
    "top_logprobs": 0, "functions": None, "min_p": 0, "use_beam_search": False,
    "length_penalty": 1, "include_stop_str_in_output": False, "skip_special_tokens": True,
    "spaces_between_special_tokens": True, "allowed_token_ids": None, "bad_words": None,
    "prompt_logprobs": None, "truncate_prompt_tokens": None, "guided_json": None,
    "guided_regex": None, "guided_choice": None, "guided_grammar": None,
    "structured_outputs": None, "add_generation_prompt": True,
    "continue_final_message": False, "echo": False}
B = TypeVar("B", bound=BaseModel)


class BodyError(ValueError):
    """A body that does not parse or validate (the message says where and why)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


def parse(cls: type[B], raw: bytes) -> B:
    """`raw` (JSON bytes) as a `cls`.

    Raises:
        BodyError: not JSON, or a field of the wrong type or range.
    """
    try:
        return cls.model_validate_json(raw)
    except ValidationError as e:
        first = e.errors(include_url=False)[0]
        if first["type"] == "json_invalid":
            raise BodyError(f"the body is not valid JSON: "
                            f"{first.get('ctx', {}).get('error', first['msg'])}") from None
        where = ".".join(str(p) for p in first.get("loc", ()))
        raise BodyError(f"{where}: {first['msg']}" if where else first["msg"],
                        where or None) from None


class StreamOptions(BaseModel):
    model_config = _STRICT

    include_usage: bool = False
    continuous_usage_stats: bool = False


class _Sampling(BaseModel):
    """The fields both endpoints share: OpenAI's names, vLLM's extras (`top_k`, `min_tokens`,
    `repetition_penalty`, `ignore_eos`, `stop_token_ids`, `priority`, `return_token_ids`) and
    schedlab's request
    metadata (`deadline_ms`, `slo_class`, `expected_output_len`: the output-length hint of a
    length-aware queue, as `schedlab run`'s `workload.oracle_output_len`); OpenAI's `user` is
    the client id."""

    model_config = ConfigDict(extra="allow", strict=True, allow_inf_nan=False)

    model: str | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False
    stop_token_ids: list[int] | None = None
    min_tokens: int = 0
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    n: int | None = 1
    logprobs: bool | int | None = None
    best_of: int | None = None
    user: str | None = None
    priority: int = 0
    deadline_ms: float | None = None
    slo_class: str | None = None
    expected_output_len: int | None = None
    return_token_ids: bool = False
    tools: list[Any] | None = None
    response_format: dict[str, Any] | None = None

    def unsupported(self) -> str | None:
        """Why this body asks for something the server cannot do, or None."""
        if self.n not in (None, 1):
            return f"n={self.n}: only n=1 is supported"
        for name, value in (self.model_extra or {}).items():
            if name in NOT_HONOURED and value not in (None, [], NOT_HONOURED[name]):
                return f"{name} is not supported"
        if self.best_of not in (None, 1):
            return f"best_of={self.best_of}: only best_of=1 is supported"
        if self.logprobs is not None and self.logprobs is not False:  # NOTE: 0 asks for some
            return "logprobs are not supported"
        if self.tools:
            return "tools (function calling) are not supported"
        if self.response_format is not None and self.response_format.get("type") != "text":
            return (f"response_format {self.response_format.get('type')!r} is not supported; "
                    "only text")
        if self.stream_options is not None and not self.stream:
            return "stream_options can only be given with stream=true"
        if self.deadline_ms is not None and self.deadline_ms <= 0:
            return f"deadline_ms={self.deadline_ms:g} must be > 0"
        if self.expected_output_len is not None and self.expected_output_len < 0:
            return f"expected_output_len={self.expected_output_len} must be >= 0"
        return None

    @property
    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def continuous_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.continuous_usage_stats)

    def token_bias(self) -> dict[int, float] | None:
        """`logit_bias` with its keys (token ids as JSON strings) as integers.

        Raises:
            BodyError: a key is not an integer.
        """
        if not self.logit_bias:
            return None
        out = {}
        for k, v in self.logit_bias.items():
            try:
                out[int(k)] = v
            except ValueError:
                raise BodyError(f"logit_bias: the key {k!r} is not a token id",
                                "logit_bias") from None
        return out


class CompletionRequest(_Sampling):
    """`POST /v1/completions`."""

    prompt: Prompt
    max_tokens: int | None = 16
    echo: bool | None = False
    suffix: str | None = None

    def unsupported(self) -> str | None:
        if self.echo:
            return "echo is not supported"
        if self.suffix:
            return "suffix is not supported"
        if (self.model_extra or {}).get("max_completion_tokens") is not None:
            return ("max_completion_tokens is a chat completions field; /v1/completions takes "
                    "max_tokens")
        return super().unsupported()


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True, allow_inf_nan=False)

    role: str
    content: str | list[dict[str, Any]] | None = None


class ChatCompletionRequest(_Sampling):
    """`POST /v1/chat/completions`."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = None
    max_completion_tokens: int | None = None

    def unsupported(self) -> str | None:
        n = self.max_completion_tokens
        if n is not None and n < 1:
            return f"max_completion_tokens must be a positive integer, got {n}"
        return super().unsupported()

    @property
    def output_limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None \
            else self.max_tokens

    def template_messages(self) -> list[dict[str, Any]]:
        """The messages as a chat template takes them (text parts joined).

        Raises:
            BodyError: a content part that is not text.
        """
        out = []
        for m in self.messages:
            content = m.content
            if isinstance(content, list):
                parts = []
                for p in content:
                    if p.get("type") != "text" or not isinstance(p.get("text"), str):
                        raise BodyError(f"message content part of type {p.get('type')!r} is "
                                        "not supported; only text parts", "messages")
                    parts.append(p["text"])
                content = "".join(parts)
            out.append({"role": m.role, "content": content or ""})
        return out


class TokenizeRequest(BaseModel):
    """`POST /tokenize` (vLLM's): a prompt, or chat messages through the template."""

    model_config = _STRICT

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = False
    add_generation_prompt: bool = True


class DetokenizeRequest(BaseModel):
    """`POST /detokenize` (vLLM's)."""

    model_config = _STRICT

    model: str | None = None
    tokens: list[int]


# ---- responses -----------------------------------------------------------------------------
def error_body(message: str, status: int = 400, param: str | None = None) -> dict[str, Any]:
    """OpenAI's error JSON (`{"error": {...}}`)."""
    kind = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
            413: "request_too_large", 503: "server_overloaded",
            500: "internal_error"}.get(status, "invalid_request_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def usage(num_prompt: int, num_output: int) -> dict[str, int]:
    return {"prompt_tokens": num_prompt, "completion_tokens": num_output,
            "total_tokens": num_prompt + num_output}


class ResponseShape:
    """Builds one request's response objects (completions or chat, chunks or whole)."""

    def __init__(self, chat: bool, model: str) -> None:
        self.chat = chat
        self.model = model
        self.id = new_id("chatcmpl" if chat else "cmpl")
        self.created = int(time.time())

    def _head(self, stream: bool) -> dict[str, Any]:
        if self.chat:
            obj = "chat.completion.chunk" if stream else "chat.completion"
        else:
            obj = "text_completion"
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def chunk(self, text: str | None, finish_reason: str | None = None,
              role: bool = False, usage_now: tuple[int, int] | None = None,
              token_ids: list[int] | None = None) -> dict[str, Any]:
        """A streamed chunk with new text (chat: a delta); `usage_now` (prompt, output tokens
        so far) adds a usage (`continuous_usage_stats`); `token_ids` the chunk's new output
        token ids (vLLM's `return_token_ids`)."""
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant"} if role else {}
            if text is not None:
                delta["content"] = text
            choice = {"index": 0, "delta": delta, "logprobs": None,
                      "finish_reason": finish_reason}
        else:
            choice = {"index": 0, "text": text or "", "logprobs": None,
                      "finish_reason": finish_reason}
        if token_ids is not None:
            choice["token_ids"] = token_ids
        out = {**self._head(True), "choices": [choice]}
        if usage_now is not None:
            out["usage"] = usage(*usage_now)
        return out

    def usage_chunk(self, num_prompt: int, num_output: int) -> dict[str, Any]:
        """The last chunk with `stream_options.include_usage`: no choices, the usage."""
        return {**self._head(True), "choices": [], "usage": usage(num_prompt, num_output)}

    def whole(self, text: str, finish_reason: str, num_prompt: int,
              num_output: int, token_ids: list[int] | None = None) -> dict[str, Any]:
        """A non-streamed response (`token_ids`: the output's, with `return_token_ids`)."""
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text},
                      "logprobs": None, "finish_reason": finish_reason}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        if token_ids is not None:
            choice["token_ids"] = token_ids
        return {**self._head(False), "choices": [choice], "usage": usage(num_prompt, num_output)}
