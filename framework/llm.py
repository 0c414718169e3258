"""The offline API, shaped like vLLM's: `LLM(model=...).generate(prompts, sampling_params)`."""

from __future__ import annotations

import numbers
from collections.abc import Iterator, Sequence
from typing import Any

from schedlab.config import EngineConfig
from schedlab.engine import Engine
from schedlab.request import CompletionOutput, Request, RequestOutput, SamplingParams
from schedlab.tokenizer import load_tokenizer

Prompt = str | Sequence[int]


class LLM:
    """Serve a local Hugging Face checkpoint through the configured plugins.

    Accepts every `EngineConfig` field as a keyword, e.g.
    `LLM(model=path, scheduler="continuous", kv_allocator="paged", block_size=16)`.
    """

    def __init__(self, model: str, **kwargs: Any) -> None:
        self.config = EngineConfig(model=str(model), **kwargs)
        self.engine = Engine(self.config)
        self.tokenizer = load_tokenizer(self.config.model)
        self._prompts: dict[str, str | None] = {}

    def _submit(self, prompts: Prompt | Sequence[Prompt],
                sampling_params: SamplingParams | Sequence[SamplingParams] | None) -> list[Request]:
        if hasattr(prompts, "tolist"):  # a numpy array or tensor of token ids
            prompts = prompts.tolist()
        if isinstance(prompts, str) or (
            isinstance(prompts, Sequence) and prompts and isinstance(prompts[0], numbers.Integral)
        ):
            prompts = [prompts]
        prompts = list(prompts)
        if sampling_params is None or isinstance(sampling_params, SamplingParams):
            params = [sampling_params or SamplingParams()] * len(prompts)
        elif isinstance(sampling_params, Sequence) and all(
            isinstance(p, SamplingParams) for p in sampling_params
        ):
            params = list(sampling_params)
            if len(params) != len(prompts):
                raise ValueError(f"{len(prompts)} prompts but {len(params)} sampling_params")
        else:
            raise TypeError("sampling_params must be a SamplingParams or a list of them, got "
                            f"{type(sampling_params).__name__}")
        reqs = []
        for prompt, sp in zip(prompts, params, strict=True):
            if isinstance(prompt, str):
                if self.tokenizer is None:
                    raise ValueError("string prompts need a tokenizer; this model has none: "
                                     "pass lists of token ids")
                ids = self.tokenizer.encode(prompt, add_special_tokens=False)
                text = prompt
            else:
                if hasattr(prompt, "tolist"):
                    prompt = prompt.tolist()
                ids, text = list(prompt), None
            req = self.engine.add_request(ids, sp)
            self._prompts[req.request_id] = text
            reqs.append(req)
        return reqs

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[RequestOutput]:
        """Run every prompt to completion; one `RequestOutput` per prompt, in order.

        Prompts are strings (tokenized with the checkpoint's tokenizer) or lists of token ids.
        A prompt that can never run comes back with `finish_reason == "rejected"` and a
        `reject_reason`; the others still complete.
        """
        reqs = self._submit(prompts, sampling_params)
        try:
            self.engine.run_until_done()
        except BaseException:
            self._abort_unfinished(reqs)
            raise
        return [self._output(r) for r in reqs]

    def _abort_unfinished(self, reqs: list[Request]) -> None:
        """After an error (or an interrupt) mid-run, end this call's requests so the next
        call does not inherit them."""
        for r in reqs:
            if not r.is_finished:
                self.engine.abort(r.request_id)

    def stream(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> Iterator[RequestOutput]:
        """Like `generate`, but yields a cumulative `RequestOutput` each time a request gets
        a token (and once for each rejected request), as the tokens are produced."""
        reqs = self._submit(prompts, sampling_params)
        try:
            for r in reqs:
                if r.reject_reason is not None:
                    yield self._output(r)
            while self.engine.has_unfinished():
                for r in self.engine.step():
                    yield self._output(r)
        finally:  # an error, or the caller stopped iterating early
            self._abort_unfinished(reqs)

    def _output(self, r: Request) -> RequestOutput:
        text = None
        if self.tokenizer is not None:
            text = self.tokenizer.decode(r.output_token_ids, skip_special_tokens=True)
        return RequestOutput(
            request_id=r.request_id,
            prompt=self._prompts.get(r.request_id),
            prompt_token_ids=r.prompt_token_ids,
            outputs=[CompletionOutput(0, list(r.output_token_ids), text, r.finish_reason)],
            finished=r.is_finished,
            metrics=r.metrics,
            reject_reason=r.reject_reason,
        )

