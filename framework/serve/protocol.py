"""Request bodies of the OpenAI API subset served, and the JSON the server answers with.

Bodies are pydantic models (FastAPI validates them; a bad one is a 400 in OpenAI's error
shape); fields OpenAI has that are not listed are ignored, and the listed ones that schedlab
cannot honour (`n > 1`, `logprobs`, `echo`, `best_of > 1`) are refused with a 400.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

#: a prompt: text, token ids, or a one-element list of either (OpenAI's batch form, n=1)
Prompt = str | list[int] | list[str] | list[list[int]]


class StreamOptions(BaseModel):
    include_usage: bool = False


class _Sampling(BaseModel):
    """The fields both endpoints share (OpenAI's names, plus vLLM's `top_k`, `ignore_eos` and
    `stop_token_ids`)."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False
    stop_token_ids: list[int] | None = None
    n: int = 1
    logprobs: Any = None
    best_of: int | None = None

    def unsupported(self) -> str | None:
        """Why this body asks for something the server cannot do, or None."""
        if self.n != 1:
            return f"n={self.n}: only n=1 is supported"
        if self.best_of not in (None, 1):
            return f"best_of={self.best_of}: only best_of=1 is supported"
        if self.logprobs not in (None, False):
            return "logprobs are not supported"
        return None

    @property
    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class CompletionRequest(_Sampling):
    """`POST /v1/completions`."""

    prompt: Prompt
    max_tokens: int | None = 16
    echo: bool = False
    suffix: str | None = None

    def unsupported(self) -> str | None:
        if self.echo:
            return "echo is not supported"
        if self.suffix:
            return "suffix is not supported"
        return super().unsupported()


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: str
    content: str | list[dict[str, Any]] | None = None


class ChatCompletionRequest(_Sampling):
    """`POST /v1/chat/completions`."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = None
    max_completion_tokens: int | None = None

    @property
    def output_limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None \
            else self.max_tokens

    def template_messages(self) -> list[dict[str, Any]]:
        """The messages as a chat template takes them (text parts joined)."""
        out = []
        for m in self.messages:
            content = m.content
            if isinstance(content, list):
                parts = []
                for p in content:
                    if p.get("type") != "text" or not isinstance(p.get("text"), str):
                        raise ValueError(f"message content part of type {p.get('type')!r} is "
                                         "not supported; only text parts")
                    parts.append(p["text"])
                content = "".join(parts)
            out.append({"role": m.role, "content": content or ""})
        return out


# ---- responses -----------------------------------------------------------------------------
def error_body(message: str, status: int = 400, param: str | None = None) -> dict[str, Any]:
    """OpenAI's error JSON (`{"error": {...}}`)."""
    kind = {400: "invalid_request_error", 404: "not_found_error", 503: "server_overloaded",
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
              role: bool = False) -> dict[str, Any]:
        """A streamed chunk with new text (chat: a delta)."""
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant"} if role else {}
            if text is not None:
                delta["content"] = text
            choice = {"index": 0, "delta": delta, "logprobs": None,
                      "finish_reason": finish_reason}
        else:
            choice = {"index": 0, "text": text or "", "logprobs": None,
                      "finish_reason": finish_reason}
        return {**self._head(True), "choices": [choice]}

    def usage_chunk(self, num_prompt: int, num_output: int) -> dict[str, Any]:
        """The last chunk with `stream_options.include_usage`: no choices, the usage."""
        return {**self._head(True), "choices": [], "usage": usage(num_prompt, num_output)}

    def whole(self, text: str, finish_reason: str, num_prompt: int,
              num_output: int) -> dict[str, Any]:
        """A non-streamed response."""
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text},
                      "logprobs": None, "finish_reason": finish_reason}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        return {**self._head(False), "choices": [choice], "usage": usage(num_prompt, num_output)}
