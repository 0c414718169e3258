"""Driving an engine with a workload: requests released at their arrival times on its clock.

Offline workloads (every arrival at 0) submit everything at once. Online ones release each
request when the engine clock reaches its arrival time, so a request that waits for a seat
counts that wait in its TTFT; when nothing runs the driver sleeps until the next arrival (the
wall clock really sleeps, a virtual clock jumps).

Multi-turn sessions (`WorkloadRequest.session_id`): a later turn is released `think_time_s`
after the previous turn finished, its prompt the previous prompt + answer + its new message.
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass

from schedlab.engine import Engine
from schedlab.request import Request, SamplingParams
from schedlab.runs.distributions import WorkloadRequest
from schedlab.runs.sessions import next_turns
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
    # NOTE: the records still held, not `c0.num_steps`: `Engine.drain_step_stats` empties
    # the list while the step count goes on
    first_step = len(engine.step_stats)

    nxt = next_turns(workload)
    later = set(nxt.values())  # turns released by their predecessor, not by arrival_s
    order = deque(sorted((i for i in range(len(workload)) if i not in later),
                         key=lambda i: (workload[i].arrival_s, i)))
    follow: list[tuple[float, int]] = []  # (release time after start, index): next turns
    release = {i: workload[i].arrival_s for i in order}
    prompts: dict[int, list[int]] = {}  # a next turn's full prompt (history + message)
    submitted: list[Request | None] = [None] * len(workload)
    in_flight: list[Request] = []
    seat_free_at = -float("inf")  # when the last seat was freed (concurrency-limited arrivals)
    held: set[int] = set()  # requests that arrived while max_concurrency were in flight
    index: dict[int, int] = {}  # id(request) -> its workload index
    bar = progress_bar(len(workload), progress)
    stalled = 0
    start = clock.now()
    def due() -> int | None:
        """The next request to release (the earlier of the two sources)."""
        if follow and (not order or follow[0][0] < release[order[0]]):
            return follow[0][1]
        return order[0] if order else None

    def take(i: int) -> None:
        if follow and follow[0][1] == i:
            heapq.heappop(follow)
        else:
            order.popleft()

    try:
        while order or follow or in_flight:
            now = clock.now()
            while (i := due()) is not None and start + release[i] <= now:
                if max_concurrency is not None and len(in_flight) >= max_concurrency:
                    held.update(j for j in _arrived(order, release, start, now))
                    held.update(j for t, j in follow if start + t <= now)
                    break
                take(i)
                w = workload[i]
                arrival = start + release[i]
                if i in held:  # it arrived to a full house: its clock starts at a free seat
                    arrival = max(arrival, seat_free_at)
                req = engine.add_request(
                    prompts.pop(i, w.prompt_token_ids),
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
                index[id(req)] = i
                in_flight.append(req)
            num_steps = len(engine.step_stats)
            if engine.has_unfinished():
                engine.step()
            elif (i := due()) is not None:
                clock.sleep_until(start + release[i])
            still = [r for r in in_flight if not r.is_finished]
            if len(still) < len(in_flight):
                done = [r for r in in_flight if r.is_finished]
                seat_free_at = max(_finish_time(r, clock.now()) for r in done)
                for r in done:  # release the next turn of each finished session turn
                    j = nxt.get(index[id(r)])
                    if j is not None:
                        t = _finish_time(r, clock.now()) - start + workload[j].think_time_s
                        release[j] = t
                        prompts[j] = r.prompt_token_ids + r.output_token_ids + list(
                            workload[j].prompt_token_ids)
                        heapq.heappush(follow, (t, j))
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


def _arrived(order: deque[int], release: dict[int, float], start: float, now: float):
    """The queued indices whose release time has come (`order` is sorted by it)."""
    for j in order:
        if start + release[j] > now:
            return
        yield j


def _finish_time(req: Request, default: float) -> float:
    t = req.metrics.finished_time
    return default if t is None else t


class _NoBar:
    def update(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass


def progress_bar(total: int, enabled: bool):
    """A tqdm bar over `total` requests, or one that does nothing."""
    if not enabled:
        return _NoBar()
    from tqdm.auto import tqdm

    return tqdm(total=total, desc="requests", unit="req")
