"""The offline API, shaped like vLLM's: `LLM(model=...).generate(prompts, sampling_params)`."""

from __future__ import annotations

import itertools
import numbers
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from schedlab.config import EngineConfig
from schedlab.engine import Engine
from schedlab.intake import why_bad_metadata
from schedlab.request import CompletionOutput, Request, RequestOutput, SamplingParams
from schedlab.runs.distributions import WorkloadRequest
from schedlab.tokenizer import load_tokenizer

Prompt = str | Sequence[int]


@dataclass(slots=True)
class _Batch:
    """One call's prompts, aligned: the requests, prompt texts, sampling params and ids."""

    workload: list[WorkloadRequest]
    texts: list[str | None]
    params: list[SamplingParams]
    request_ids: list[str]


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
        self._ids = itertools.count()

    def _prepare(self, prompts: Prompt | Sequence[Prompt],
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None,
                 metadata: dict[str, Sequence[Any] | None]) -> _Batch:
        """Token ids, sampling parameters, ids and metadata per prompt (no state change but
        the id counter)."""
        # a numpy array or tensor of token ids becomes a list
        raw: Any = prompts.tolist() if hasattr(prompts, "tolist") else prompts
        if isinstance(raw, str) or (
            isinstance(raw, Sequence) and raw and isinstance(raw[0], numbers.Integral)
        ):
            raw = [raw]
        prompts = list(raw)
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
        for key, values in metadata.items():
            if values is not None and (isinstance(values, str | bytes) or
                                       not isinstance(values, Sequence)
                                       or len(values) != len(prompts)):
                raise ValueError(f"{key} must be a list with one value per prompt "
                                 f"({len(prompts)}), got {values!r}")
        batch = _Batch([], [], params, [])
        for k, (prompt, sp) in enumerate(zip(prompts, params, strict=True)):
            if isinstance(prompt, str):
                if self.tokenizer is None:
                    raise ValueError("string prompts need a tokenizer; this model has none: "
                                     "pass lists of token ids")
                ids = self.tokenizer.encode(prompt, add_special_tokens=False)
                text = prompt
            else:
                ids = list(prompt.tolist() if hasattr(prompt, "tolist") else prompt)
                text = None
            meta = {key: values[k] for key, values in metadata.items() if values is not None}
            if meta.get("priority") is None:
                meta.pop("priority", None)
            bad = why_bad_metadata(**meta)
            if bad is not None:  # NOTE: before anything runs, as the server's 400
                raise ValueError(f"prompt {k}: {bad}")
            batch.workload.append(WorkloadRequest(ids, sp.max_tokens, **meta))
            batch.texts.append(text)
            batch.request_ids.append(str(next(self._ids)))
        return batch

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        priority: Sequence[int] | None = None,
        client_id: Sequence[str | None] | None = None,
        deadline_ms: Sequence[float | None] | None = None,
        slo_class: Sequence[str | None] | None = None,
        expected_output_len: Sequence[int | None] | None = None,
    ) -> list[RequestOutput]:
        """Run every prompt to completion, through the run loop `schedlab run` uses; one
        `RequestOutput` per prompt, in order.

        Prompts are strings (tokenized with the checkpoint's tokenizer) or lists of token ids.
        A prompt that can never run comes back with `finish_reason == "rejected"` and a
        `reject_reason`; the others still complete.

        Args:
            prompts: the prompts.
            sampling_params: one for all, or one per prompt.
            priority: per prompt, lower runs first under a priority-aware queue (vLLM's).
            client_id: per prompt, the tenant (fairness queues, per-client metrics).
            deadline_ms: per prompt, a TTFT objective for deadline-aware queues.
            slo_class: per prompt, a named SLO tier.
            expected_output_len: per prompt, an output-length hint for length-aware queues.

        Raises:
            ValueError: a metadata list whose length is not the number of prompts.
        """
        from schedlab.runs.driver import run_workload

        batch = self._prepare(prompts, sampling_params, {
            "priority": priority, "client_id": client_id, "deadline_ms": deadline_ms,
            "slo_class": slo_class, "expected_output_len": expected_output_len})
        for rid, text in zip(batch.request_ids, batch.texts, strict=True):
            self._prompts[rid] = text
        try:
            run = run_workload(self.engine, batch.workload, params=batch.params,
                               request_ids=batch.request_ids)
        except BaseException:
            self._abort_unfinished(batch.request_ids)
            raise
        return [self._output(r) for r in run.requests]

    def _abort_unfinished(self, request_ids: Sequence[str]) -> None:
        """After an error (or an interrupt) mid-run, end this call's requests so the next
        call does not inherit them."""
        for rid in request_ids:
            r = self.engine.requests.get(rid)
            if r is not None and not r.is_finished:
                self.engine.abort(rid)

    def stream(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        priority: Sequence[int] | None = None,
        client_id: Sequence[str | None] | None = None,
        deadline_ms: Sequence[float | None] | None = None,
        slo_class: Sequence[str | None] | None = None,
        expected_output_len: Sequence[int | None] | None = None,
    ) -> Iterator[RequestOutput]:
        """Like `generate` (the same arguments, the same metadata per prompt), but yields a
        cumulative `RequestOutput` each time a request gets a token (and once for each
        rejected request), as the tokens are produced."""
        batch = self._prepare(prompts, sampling_params, {
            "priority": priority, "client_id": client_id, "deadline_ms": deadline_ms,
            "slo_class": slo_class, "expected_output_len": expected_output_len})
        reqs = []
        for w, sp, rid, text in zip(batch.workload, batch.params, batch.request_ids,
                                    batch.texts, strict=True):
            reqs.append(self.engine.add_request(
                w.prompt_token_ids, sp, request_id=rid, priority=w.priority,
                client_id=w.client_id, deadline_ms=w.deadline_ms, slo_class=w.slo_class,
                expected_output_len=w.expected_output_len))
            self._prompts[rid] = text
        try:
            for r in reqs:
                if r.reject_reason is not None:
                    yield self._output(r)
            while self.engine.has_unfinished():
                for r in self.engine.step():
                    yield self._output(r)
        finally:  # an error, or the caller stopped iterating early
            self._abort_unfinished(batch.request_ids)

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

