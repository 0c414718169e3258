"""`schedlab bench serve`: replay a workload against any OpenAI-compatible server over HTTP.

Each request is sent at its arrival time (or when a seat frees, with `max_concurrency`) to
`/v1/completions` with its prompt as token ids (exact lengths), `max_tokens`, `ignore_eos`,
`stream: true` and its metadata (`user` = client id, `priority`, `deadline_ms`, `slo_class`,
`expected_output_len`).
A session's later turn is sent as `schedlab run` releases it: `think_time_s` after the previous
turn's answer ended, its prompt the previous prompt + the answer + its new message.
As `vllm bench serve` does, every streamed chunk that carries a choice is one
token arrival: TTFT is send -> first chunk, ITL the gaps between chunks, and the output length
is the server's `usage.completion_tokens` (the chunk count when it sends no usage). The timings
become `Request`s on the client's clock, so `compute_metrics` gives the same results.json keys
as `schedlab run`; what only the engine can see (queueing, KV, steps) is left out.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections import Counter
from dataclasses import dataclass

import httpx

from schedlab.request import Request, RequestStatus, SamplingParams
from schedlab.runs.distributions import FIRST_TOKEN_ID, WorkloadRequest
from schedlab.runs.driver import progress_bar
from schedlab.runs.run_result import RunResult
from schedlab.runs.sessions import next_turns


class BenchError(RuntimeError):
    """The server cannot be benchmarked (unreachable, no model); the message says why."""


@dataclass(frozen=True, slots=True)
class BenchOptions:
    """How to drive the server.

    Args:
        base_url: e.g. `http://127.0.0.1:8000` (the `/v1/...` paths are appended).
        model: the `model` to send; None: the first of the server's `/v1/models`.
        temperature: sampling temperature of every request (0: greedy).
        ignore_eos: ask for exactly `max_tokens` tokens per request.
        max_concurrency: at most this many requests in flight (None: no cap).
        timeout_s: per-request timeout.
        progress: a tqdm bar of requests done on stderr.
        api_key: sent as `Authorization: Bearer <key>` (a server run with `--api-key`); None:
            no key.
    """

    base_url: str
    model: str | None = None
    temperature: float = 0.0
    ignore_eos: bool = True
    max_concurrency: int | None = None
    timeout_s: float = 600.0
    progress: bool = False
    api_key: str | None = None


def auth_headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def served_model(base_url: str, timeout_s: float = 10.0, api_key: str | None = None) -> str:
    """The first model id of `GET /v1/models` (with `api_key`, if given).

    Raises:
        BenchError: the server does not answer, or lists no model.
    """
    url = base_url.rstrip("/") + "/v1/models"
    try:
        r = httpx.get(url, timeout=timeout_s, headers=auth_headers(api_key))
        r.raise_for_status()
        data = r.json().get("data") or []
    except (httpx.HTTPError, ValueError, AttributeError) as e:
        raise BenchError(f"cannot list the models at {url}: {e}") from None
    if not data:
        raise BenchError(f"{url} lists no model; pass the model name")
    return str(data[0]["id"])


def run_bench(workload: list[WorkloadRequest], options: BenchOptions) -> RunResult:
    """Send the workload and wait for every response.

    Returns:
        A `RunResult` on the client's clock (no engine steps): one finished, rejected (HTTP 4xx)
        or aborted (any other failure, the reason in `reject_reason`) request per workload
        request, in workload order.

    Raises:
        BenchError: the server cannot be reached or names no model.
    """
    logging.getLogger("httpx").setLevel(logging.WARNING)  # no line per request
    model = options.model or served_model(options.base_url, api_key=options.api_key)
    return asyncio.run(_run(workload, options, model))


async def _run(workload: list[WorkloadRequest], o: BenchOptions, model: str) -> RunResult:
    url = o.base_url.rstrip("/") + "/v1/completions"
    sem = asyncio.Semaphore(o.max_concurrency) if o.max_concurrency else None
    nxt = next_turns(workload)
    later = set(nxt.values())  # a session's later turns: sent after the previous answer
    requests: list[Request | None] = [None] * len(workload)
    bar = progress_bar(len(workload), o.progress)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    timeout = httpx.Timeout(o.timeout_s, connect=30.0)
    async with httpx.AsyncClient(limits=limits, timeout=timeout,
                                 headers=auth_headers(o.api_key)) as client:
        start = time.perf_counter()

        async def one(first: int, prompt: list[int], release_s: float) -> None:
            """Send request `first` at `release_s` after the start, then its session's next
            turn (as the run loop does: after the answer + think time, with the history)."""
            turn: int | None = first
            while turn is not None:
                i = turn
                delay = start + release_s - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                if sem is None:
                    req, answer = await _send(client, url, model, str(i), prompt,
                                              workload[i], o)
                else:
                    async with sem:  # a held-back request's clock starts when it is sent
                        req, answer = await _send(client, url, model, str(i), prompt,
                                                  workload[i], o)
                requests[i] = req
                bar.update(1)
                j = nxt.get(i)
                if j is not None:
                    w = workload[j]
                    prompt = prompt + answer + list(w.prompt_token_ids)
                    finished = req.metrics.finished_time
                    done_s = (finished if finished is not None else time.perf_counter()) - start
                    release_s = done_s + w.think_time_s
                turn = j

        try:
            await asyncio.gather(*(one(i, list(w.prompt_token_ids), w.arrival_s)
                                   for i, w in enumerate(workload) if i not in later))
        finally:
            bar.close()
        end = time.perf_counter()
    return RunResult(requests=[r for r in requests if r is not None], duration_s=end - start,
                     step_stats=[], num_preemptions=0, prefix_hit_rate=0.0, start_time=start,
                     max_concurrency=o.max_concurrency)


def request_body(model: str, prompt: list[int], w: WorkloadRequest,
                 o: BenchOptions) -> dict:
    """The JSON body of one request: the prompt as token ids, its length limits, and its
    metadata as the server reads it (OpenAI's `user` = the client id; vLLM's `priority`,
    sent only when not 0 as vLLM refuses it without priority scheduling; `deadline_ms`,
    `slo_class` and `expected_output_len` (a length-aware queue's hint), when set), and
    vLLM's `return_token_ids` (a session's next prompt holds the answer's token ids)."""
    body = {"model": model, "prompt": prompt, "max_tokens": w.max_tokens,
            "temperature": o.temperature, "ignore_eos": o.ignore_eos, "stream": True,
            "stream_options": {"include_usage": True}, "return_token_ids": True}
    if w.client_id is not None:
        body["user"] = str(w.client_id)
    if w.priority:
        body["priority"] = int(w.priority)
    if w.deadline_ms is not None:
        body["deadline_ms"] = float(w.deadline_ms)
    if w.slo_class is not None:
        body["slo_class"] = str(w.slo_class)
    if w.expected_output_len is not None:
        body["expected_output_len"] = int(w.expected_output_len)
    return body


#: a token the server wrote as `<id>` (a model without a tokenizer, e.g. under `executor=sim`)
_TOKEN_TEXT = re.compile(r"<(\d+)>")


def answer_tokens(token_ids: list[int], text: str, num_tokens: int) -> list[int]:
    """The answer's token ids, for a session's next prompt: those the server returned
    (`return_token_ids`), else read back from `<id>` text (a server without a tokenizer),
    else `num_tokens` placeholders (the lengths stay exact; the ids cannot be known)."""
    if len(token_ids) == num_tokens:
        return list(token_ids)
    ids = [int(m) for m in _TOKEN_TEXT.findall(text)]
    if len(ids) == num_tokens and "".join(f"<{t}>" for t in ids) == text:
        return ids
    return [FIRST_TOKEN_ID] * num_tokens


async def _send(client: httpx.AsyncClient, url: str, model: str, rid: str, prompt: list[int],
                w: WorkloadRequest, o: BenchOptions) -> tuple[Request, list[int]]:
    """One request, streamed. Returns it (its timings on the client's clock) and the answer's
    token ids (see `answer_tokens`; empty when it failed)."""
    body = request_body(model, prompt, w, o)
    sent = time.perf_counter()
    req = Request(rid, list(prompt), SamplingParams(
        temperature=o.temperature, max_tokens=w.max_tokens, ignore_eos=o.ignore_eos),
        arrival_time=sent, priority=w.priority, client_id=w.client_id,
        deadline_ms=w.deadline_ms, slo_class=w.slo_class,
        expected_output_len=w.expected_output_len)
    times: list[float] = []
    text: list[str] = []
    ids: list[int] = []
    num_tokens: int | None = None
    finish: str | None = None
    try:
        async with client.stream("POST", url, json=body) as r:
            if r.status_code != 200:
                err = (await r.aread()).decode("utf-8", "replace")
                return _failed(req, f"HTTP {r.status_code}: {_message(err)}",
                               RequestStatus.REJECTED if 400 <= r.status_code < 500
                               else RequestStatus.FINISHED_ABORTED), []
            async for line in r.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk:  # NOTE: a 4xx: the server rejected it once queued
                    code = _code(chunk)
                    rejected = code is not None and 400 <= code < 500
                    return _failed(req, f"HTTP {code}: {_message(data)}" if rejected
                                   else f"error mid-stream: {_message(data)}",
                                   RequestStatus.REJECTED if rejected
                                   else RequestStatus.FINISHED_ABORTED), []
                choices = chunk.get("choices")
                if choices:
                    times.append(time.perf_counter())
                    text.append(choices[0].get("text") or "")
                    ids += choices[0].get("token_ids") or []
                    finish = choices[0].get("finish_reason") or finish
                usage = chunk.get("usage")
                if usage and usage.get("completion_tokens") is not None:
                    num_tokens = int(usage["completion_tokens"])
    except (httpx.HTTPError, json.JSONDecodeError, OSError) as e:
        return _failed(req, f"{type(e).__name__}: {e}", RequestStatus.FINISHED_ABORTED), []
    end = time.perf_counter()
    if not times:
        return _failed(req, "the stream ended without a token",
                       RequestStatus.FINISHED_ABORTED), []
    if finish not in (None, "stop", "length"):
        return _failed(req, f"finish_reason {finish!r}", RequestStatus.FINISHED_ABORTED), []
    m = req.metrics
    m.first_scheduled_time = sent  # NOTE: a client cannot see queueing; queue keys are dropped
    m.first_token_time = times[0]
    m.token_times = times
    n = num_tokens if num_tokens is not None else len(times)
    req.output_token_ids = answer_tokens(ids, "".join(text), n)
    req.end(RequestStatus.FINISHED_STOPPED if finish == "stop" else RequestStatus.FINISHED_LENGTH,
            end)
    return req, req.output_token_ids


def _failed(req: Request, reason: str, status: RequestStatus) -> Request:
    req.end(status, time.perf_counter(), reason)
    return req


def _code(chunk: dict) -> int | None:
    """The HTTP status an error chunk carries (OpenAI's `error.code`), or None."""
    err = chunk.get("error")
    code = err.get("code") if isinstance(err, dict) else None
    return code if type(code) is int else None


def _message(text: str) -> str:
    try:
        err = json.loads(text)
        return str(err.get("error", err).get("message", text))
    except (ValueError, AttributeError):
        return text[:300]


#: numbers in a failure reason, but an HTTP status
_ALIKE = re.compile(r"\b(?<!HTTP )\d+\b")


def failure_summary(run: RunResult) -> str | None:
    """One sentence on the requests that did not finish (None: all did): how many of how many,
    and the commonest reasons (numbers in them as N, so alike reasons count together)."""
    reasons = Counter(_ALIKE.sub("N", r.reject_reason or r.finish_reason or "unknown")
                      for r in run.requests if r.finish_reason not in ("stop", "length"))
    n = sum(reasons.values())
    if not n:
        return None
    top = "; ".join(f"{k} (x{c})" for k, c in reasons.most_common(3))
    more = f"; and {len(reasons) - 3} other reasons" if len(reasons) > 3 else ""
    return f"{n} of {len(run.requests)} requests failed: {top}{more}"


def client_metrics(run: RunResult, metrics: dict) -> dict:
    """`compute_metrics` output as a client sees it: engine-only and queueing keys dropped
    (`max_concurrent_requests`, from the requests' send..finish intervals, stays)."""
    engine_only = set(engine_keys())
    return {k: v for k, v in metrics.items() if k not in engine_only and "_queue_ms" not in k}


def engine_keys() -> list[str]:
    """Metric keys of `compute_metrics` that only the engine can fill (steps, KV, batches)."""
    from schedlab.runs.metrics import engine_metrics

    empty = RunResult(requests=[], duration_s=0.0, step_stats=[], num_preemptions=0,
                      prefix_hit_rate=0.0)
    return list(engine_metrics(empty))  # the step-phase means included
