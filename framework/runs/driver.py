"""Driving an engine with a workload: requests released at their arrival times on its clock.

Offline workloads (every arrival at 0) submit everything at once. Online ones release each
request when the engine clock reaches its arrival time, so a request that waits for a seat
counts that wait in its TTFT; when nothing runs the driver sleeps until the next arrival (the
wall clock really sleeps, a virtual clock jumps).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from schedlab.engine import Engine
from schedlab.request import Request, SamplingParams
from schedlab.runs.distributions import WorkloadRequest
from schedlab.stats import StepStats

#: consecutive empty steps (no plan, nothing finished) before the driver gives up
_MAX_STALLED_STEPS = 1000


@dataclass(slots=True)
class RunResult:
    """Everything a run leaves behind for metrics, plots and reports.

    Times in `requests[i].metrics` and `step_stats` are on the engine clock; `start_time` is
    the clock when the run began, so `arrival_time - start_time` is the workload's `arrival_s`.

    Args:
        requests: one per workload request, in workload order; each finished or rejected.
        duration_s: from the start of the run until the last request finished.
        step_stats: the engine steps this run took.
        num_preemptions: preemptions during the run (recompute and swap).
        num_swaps: those preemptions whose KV went to host memory (swap mode).
        prefix_hit_rate: prompt tokens served from the prefix cache / prompt tokens looked up.
        start_time: engine clock at the start of the run.
        num_kv_blocks: blocks in the KV pool.
        block_size: token slots per block.
        max_concurrency: the cap on requests in flight, if any.
    """

    requests: list[Request]
    duration_s: float
    step_stats: list[StepStats]
    num_preemptions: int
    prefix_hit_rate: float
    start_time: float = 0.0
    num_kv_blocks: int = 0
    block_size: int = 0
    max_concurrency: int | None = None
    num_prefix_hit_tokens: int = 0
    num_swaps: int = 0


def run_workload(
    engine: Engine,
    workload: list[WorkloadRequest],
    *,
    temperature: float = 0.0,
    ignore_eos: bool = True,
    max_concurrency: int | None = None,
    progress: bool = False,
) -> RunResult:
    """Submit the workload at its arrival times and step the engine until every request ends.

    Args:
        engine: a built engine; requests it already holds are run along but not reported.
        workload: the requests, with `arrival_s` relative to the start of the run.
        temperature: sampling temperature for every request (0: greedy).
        ignore_eos: generate exactly `max_tokens` per request (benchmark lengths).
        max_concurrency: at most this many requests in flight (vLLM bench's
            `--max-concurrency`); a held-back request's clock starts when a seat frees up.
        progress: show a tqdm bar of requests done.

    Returns:
        The run: every request finished or rejected, with its timestamps.

    Raises:
        ValueError: `max_concurrency` below 1.
    """
    if max_concurrency is not None and max_concurrency < 1:
        raise ValueError(f"max_concurrency={max_concurrency} must be >= 1 or None")
    clock = engine.clock
    c0 = engine.counters()
    first_step = c0.num_steps

    order = deque(sorted(range(len(workload)), key=lambda i: (workload[i].arrival_s, i)))
    submitted: list[Request | None] = [None] * len(workload)
    in_flight: list[Request] = []
    seat_free_at = -float("inf")  # when the last seat was freed (concurrency-limited arrivals)
    held: set[int] = set()  # requests that arrived while max_concurrency were in flight
    bar = _progress_bar(len(workload), progress)
    stalled = 0
    start = clock.now()
    try:
        while order or in_flight:
            now = clock.now()
            while order and start + workload[order[0]].arrival_s <= now:
                if max_concurrency is not None and len(in_flight) >= max_concurrency:
                    for j in order:
                        if start + workload[j].arrival_s > now:
                            break
                        held.add(j)
                    break
                i = order.popleft()
                w = workload[i]
                arrival = start + w.arrival_s
                if i in held:  # it arrived to a full house: its clock starts at a free seat
                    arrival = max(arrival, seat_free_at)
                req = engine.add_request(
                    w.prompt_token_ids,
                    SamplingParams(temperature=temperature, max_tokens=w.max_tokens,
                                   ignore_eos=ignore_eos),
                    arrival_time=arrival,
                    priority=w.priority,
                    expected_output_len=w.expected_output_len,
                    client_id=w.client_id,
                    deadline_ms=w.deadline_ms,
                    slo_class=w.slo_class,
                )
                submitted[i] = req
                in_flight.append(req)
            num_steps = len(engine.step_stats)
            if engine.has_unfinished():
                engine.step()
            elif order:
                clock.sleep_until(start + workload[order[0]].arrival_s)
            still = [r for r in in_flight if not r.is_finished]
            if len(still) < len(in_flight):
                done = [r for r in in_flight if r.is_finished]
                seat_free_at = max(_finish_time(r, clock.now()) for r in done)
                bar.update(len(done))
                in_flight = still
                stalled = 0
            elif len(engine.step_stats) == num_steps and engine.has_unfinished():
                stalled += 1
                if stalled > _MAX_STALLED_STEPS:
                    raise RuntimeError(
                        f"the engine made no progress in {stalled} steps with "
                        f"{len(in_flight)} requests in flight (scheduler "
                        f"{engine.config.scheduler!r})"
                    )
        end = clock.now()
    finally:
        bar.close()

    c1 = engine.counters()
    hits = c1.num_prefix_hit_tokens - c0.num_prefix_hit_tokens
    queried = c1.num_prefix_query_tokens - c0.num_prefix_query_tokens
    return RunResult(
        requests=[r for r in submitted if r is not None],
        duration_s=end - start,
        step_stats=list(engine.step_stats[first_step:]),
        num_preemptions=c1.num_preemptions - c0.num_preemptions,
        prefix_hit_rate=hits / queried if queried else 0.0,
        start_time=start,
        num_kv_blocks=c1.num_kv_blocks,
        block_size=engine.config.block_size,
        max_concurrency=max_concurrency,
        num_prefix_hit_tokens=hits,
        num_swaps=c1.num_swaps - c0.num_swaps,
    )


def _finish_time(req: Request, default: float) -> float:
    t = req.metrics.finished_time
    return default if t is None else t


class _NoBar:
    def update(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass


def _progress_bar(total: int, enabled: bool):
    if not enabled:
        return _NoBar()
    from tqdm.auto import tqdm

    return tqdm(total=total, desc="requests", unit="req")
