"""`schedlab bench serve`: replay a workload against any OpenAI-compatible server over HTTP.

Each request is sent at its arrival time (or when a seat frees, with `max_concurrency`) to
`/v1/completions` with its prompt as token ids (exact lengths), `max_tokens`, `ignore_eos` and
`stream: true`. As `vllm bench serve` does, every streamed chunk that carries a choice is one
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
from schedlab.runs.distributions import WorkloadRequest
from schedlab.runs.driver import RunResult, progress_bar


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
    """

    base_url: str
    model: str | None = None
    temperature: float = 0.0
    ignore_eos: bool = True
    max_concurrency: int | None = None
    timeout_s: float = 600.0
    progress: bool = False


def served_model(base_url: str, timeout_s: float = 10.0) -> str:
    """The first model id of `GET /v1/models`.

    Raises:
        BenchError: the server does not answer, or lists no model.
    """
    url = base_url.rstrip("/") + "/v1/models"
    try:
        r = httpx.get(url, timeout=timeout_s)
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
    model = options.model or served_model(options.base_url)
    return asyncio.run(_run(workload, options, model))


async def _run(workload: list[WorkloadRequest], o: BenchOptions, model: str) -> RunResult:
    url = o.base_url.rstrip("/") + "/v1/completions"
    sem = asyncio.Semaphore(o.max_concurrency) if o.max_concurrency else None
    bar = progress_bar(len(workload), o.progress)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    timeout = httpx.Timeout(o.timeout_s, connect=30.0)
    async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:
        start = time.perf_counter()

        async def one(i: int, w: WorkloadRequest) -> Request:
            delay = start + w.arrival_s - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            if sem is None:
                req = await _send(client, url, model, str(i), w, o)
            else:
                async with sem:  # a held-back request's clock starts when it is sent
                    req = await _send(client, url, model, str(i), w, o)
            bar.update(1)
            return req

        try:
            requests = await asyncio.gather(*(one(i, w) for i, w in enumerate(workload)))
        finally:
            bar.close()
        end = time.perf_counter()
    return RunResult(requests=list(requests), duration_s=end - start, step_stats=[],
                     num_preemptions=0, prefix_hit_rate=0.0, start_time=start,
                     max_concurrency=o.max_concurrency)


async def _send(client: httpx.AsyncClient, url: str, model: str, rid: str, w: WorkloadRequest,
                o: BenchOptions) -> Request:
    body = {"model": model, "prompt": list(w.prompt_token_ids), "max_tokens": w.max_tokens,
            "temperature": o.temperature, "ignore_eos": o.ignore_eos, "stream": True,
            "stream_options": {"include_usage": True}}
    sent = time.perf_counter()
    req = Request(rid, list(w.prompt_token_ids), SamplingParams(
        temperature=o.temperature, max_tokens=w.max_tokens, ignore_eos=o.ignore_eos),
        arrival_time=sent, priority=w.priority, client_id=w.client_id,
        deadline_ms=w.deadline_ms, slo_class=w.slo_class)
    times: list[float] = []
    num_tokens: int | None = None
    finish: str | None = None
    try:
        async with client.stream("POST", url, json=body) as r:
            if r.status_code != 200:
                text = (await r.aread()).decode("utf-8", "replace")
                return _failed(req, f"HTTP {r.status_code}: {_message(text)}",
                               RequestStatus.REJECTED if 400 <= r.status_code < 500
                               else RequestStatus.FINISHED_ABORTED)
            async for line in r.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    return _failed(req, f"error mid-stream: {_message(data)}",
                                   RequestStatus.FINISHED_ABORTED)
                choices = chunk.get("choices")
                if choices:
                    times.append(time.perf_counter())
                    finish = choices[0].get("finish_reason") or finish
                usage = chunk.get("usage")
                if usage and usage.get("completion_tokens") is not None:
                    num_tokens = int(usage["completion_tokens"])
    except (httpx.HTTPError, json.JSONDecodeError, OSError) as e:
        return _failed(req, f"{type(e).__name__}: {e}", RequestStatus.FINISHED_ABORTED)
    end = time.perf_counter()
    if not times:
        return _failed(req, "the stream ended without a token", RequestStatus.FINISHED_ABORTED)
    if finish not in (None, "stop", "length"):
        return _failed(req, f"finish_reason {finish!r}", RequestStatus.FINISHED_ABORTED)
    m = req.metrics
    m.first_scheduled_time = sent  # NOTE: a client cannot see queueing; queue keys are dropped
    m.first_token_time = times[0]
    m.token_times = times
    req.output_token_ids = [0] * (num_tokens if num_tokens is not None else len(times))
    req.end(RequestStatus.FINISHED_STOPPED if finish == "stop" else RequestStatus.FINISHED_LENGTH,
            end)
    return req


def _failed(req: Request, reason: str, status: RequestStatus) -> Request:
    req.end(status, time.perf_counter(), reason)
    return req


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
    """`compute_metrics` output as a client sees it: engine-only and queueing keys dropped,
    `max_concurrent_requests` counted from the requests' send..finish intervals."""
    engine_only = set(engine_keys())
    out = {k: v for k, v in metrics.items() if k not in engine_only and "_queue_ms" not in k}
    events: list[tuple[float, int]] = []
    for r in run.requests:
        if r.metrics.finished_time is not None:
            events += [(r.arrival_time, 1), (r.metrics.finished_time, -1)]
    peak = cur = 0
    for _, d in sorted(events):
        cur += d
        peak = max(peak, cur)
    out["max_concurrent_requests"] = peak
    return out


def engine_keys() -> list[str]:
    """Metric keys of `compute_metrics` that only the engine can fill (steps, KV, batches)."""
    from schedlab.runs.metrics import engine_metrics

    empty = RunResult(requests=[], duration_s=0.0, step_stats=[], num_preemptions=0,
                      prefix_hit_rate=0.0)
    return list(engine_metrics(empty))  # the step-phase means included
