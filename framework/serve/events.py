"""What crosses between the HTTP handlers (on the asyncio event loop) and the engine's thread
(`schedlab.serve.loop.EngineLoop`): a request handed in, its stream of events handed back, and
a finished request as the metrics see it."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from schedlab.request import Request, SamplingParams


@dataclass(slots=True)
class GenerateRequest:
    """One request as a handler hands it to the loop.

    Args:
        request_id: unique (the handler makes one).
        prompt_token_ids: the prompt, already tokenized.
        sampling_params: the engine's sampling parameters.
        stop: OpenAI `stop` strings (the text ends before the first one that appears).
        client_id: the tenant (OpenAI's `user`), for fairness queues and per-client metrics.
        priority: lower runs first under a priority-aware queue (vLLM's `priority`).
        deadline_ms: latency objective after arrival, for deadline-aware queues.
        slo_class: a named SLO tier.
        expected_output_len: an output-length hint for length-aware queues.
    """

    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    stop: tuple[str, ...] = ()
    client_id: str | None = None
    priority: int = 0
    deadline_ms: float | None = None
    slo_class: str | None = None
    expected_output_len: int | None = None


@dataclass(slots=True)
class StreamEvent:
    """What a handler receives: first an acceptance (or a refusal), then text per step.

    Args:
        text: new text since the last event.
        num_prompt_tokens: the prompt's length.
        num_output_tokens: output tokens so far (usage's `completion_tokens`).
        finish_reason: set on the last event: "stop", "length" or "abort".
        error: a refusal (the request never ran), or its end: rejected by a policy once
            queued, or failed (the message says why).
        status: the HTTP status for `error` (400 rejected, 503 overloaded or draining, 500
            failed).
        token_ids: the new output token ids since the last event (vLLM's `return_token_ids`
            answers with them; `bench serve` builds a session's next prompt from them).
    """

    text: str = ""
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0
    finish_reason: str | None = None
    error: str | None = None
    status: int = 200
    token_ids: list[int] = field(default_factory=list)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None or self.error is not None


class RequestStream:
    """One request's events, read on the asyncio loop that submitted it."""

    def __init__(self, request_id: str, aloop: asyncio.AbstractEventLoop) -> None:
        self.request_id = request_id
        self._aloop = aloop
        self._queue: asyncio.Queue[StreamEvent] = asyncio.Queue()

    def put(self, event: StreamEvent) -> None:
        """Deliver an event (from the engine thread). Dropped if the event loop has closed."""
        try:
            self._aloop.call_soon_threadsafe(self._queue.put_nowait, event)
        except RuntimeError:  # the server's event loop is gone: nobody is listening
            pass

    async def get(self) -> StreamEvent:
        return await self._queue.get()


@dataclass(slots=True)
class FinishedRequest:
    """A request that ended, as the metrics see it.

    Args:
        request: the engine's request (timestamps on the engine clock).
        finish_reason: "stop", "length" or "abort" (a stop string ends as "stop").
        num_output_tokens: the tokens the client was charged for.
    """

    request: Request
    finish_reason: str
    num_output_tokens: int
