"""The run loop: one discrete-event loop that drives a workload through 1..N engine instances.

`schedlab run`, `LLM.generate` and clusters all go through it
(`schedlab.runs.driver.run_workload`); a single engine is a
cluster of one instance (`Cluster.around`) and takes the same code. The events, on one timeline
(each instance's clock, started together):

- a release: a request's arrival (`arrival_s` after the start), or a session's next turn
  (`think_time_s` after the previous turn finished, its prompt the previous prompt + answer +
  its new message); with `max_concurrency` a release also waits for a seat, and its clock
  (arrival time) starts when it gets one, as a request held by vLLM bench's semaphore;
- a seat freeing: a request ending (finished, rejected, aborted) frees its seat and may
  release its session's next turn;
- a KV transfer arriving on a decode instance (prefill/decode disaggregation);
- an instance step: the busy instance whose clock is furthest behind steps next.

A release or a transfer is handled once every busy instance has reached its time (ties: releases
first, then transfers, then steps); an idle instance's clock jumps to the work that reaches it
(the wall clock of a single real engine really sleeps). Offline workloads (every arrival at 0)
thus submit everything at once, and a request that waits for a seat counts the wait in its TTFT.
"""

from __future__ import annotations

import heapq
import math
from array import array
from collections.abc import Sequence
from typing import TYPE_CHECKING, overload

from schedlab.request import SamplingParams
from schedlab.runs.distributions import WorkloadRequest
from schedlab.runs.interrupt import InterruptLatch
from schedlab.runs.prompts import LazyTokens
from schedlab.runs.sessions import next_turns

if TYPE_CHECKING:
    from schedlab.cluster.cluster import Cluster
    from schedlab.cluster.instance import Instance

#: consecutive steps without progress (no plan run, nothing ended or moved) before the loop
#: gives up on a stuck plugin
MAX_STALLED_STEPS = 1000

_INF = math.inf


class RunLoop:
    """One run's events over a cluster (see the module docstring); `run` drives it to the end.
    `schedlab.runs.driver.run_workload` is the way in."""

    def __init__(self, cluster: Cluster, workload: list[WorkloadRequest],
                 params: Sequence[SamplingParams], request_ids: Sequence[str] | None,
                 max_concurrency: int | None, check: bool, stream: bool = False) -> None:
        if max_concurrency is not None and max_concurrency < 1:
            raise ValueError(f"max_concurrency={max_concurrency} must be >= 1 or None")
        self.cluster = cluster
        self.workload = workload
        self.params = params
        self.ids = request_ids
        self.check = check
        self.nxt = next_turns(workload)
        later = set(self.nxt.values())  # turns released by their predecessor, not arrival_s
        # NOTE: releases go by (time after the start, 0 for an arrival / 1 for a next turn,
        # index): the arrivals are known up front, so they are sorted once and taken in
        # order (a heap of them all cost a dozen scattered tuple comparisons a release)
        order = sorted((i for i in range(len(workload)) if i not in later),
                       key=lambda i: workload[i].arrival_s)  # NOTE: stable: ties by index
        #: the arrivals' times and indices in release order, the next one at `next_arrival`
        self.arrival_times = [workload[i].arrival_s for i in order]
        self.arrival_index = array("q", order)
        self.next_arrival = 0
        #: the next turns' releases: a heap of (time after the start, 1, index)
        self.releases: list[tuple[float, int, int]] = []
        #: when each free seat became free (None: no cap)
        self.seats: list[float] | None = (None if max_concurrency is None
                                          else [-float("inf")] * max_concurrency)
        self.prompts: dict[int, list[int]] = {}  # a next turn's full prompt
        self.index: dict[int, int] = {}  # id(request) -> its workload index
        self.outstanding = 0  # released and not ended
        self.bar = None
        #: a Ctrl-C to raise again if its KeyboardInterrupt was swallowed (None: not watched)
        self.interrupt: InterruptLatch | None = None
        #: busy instances by (clock, index), and the clock each was last filed at
        self._busy: list[tuple[float, int]] = []
        self._filed: dict[int, float] = {}
        #: streaming: each request is retired (its stats kept, the request forgotten) once
        #: it ended and its next turn, if any, was released
        self.stream = stream
        #: requests released with their own read of their workload prompt (a `LazyTokens`),
        #: by workload index: once one ends it refers to that prompt instead, as its workload
        #: does (the same ids, drawn again when read; ~0.15 KB where the list held 8 bytes a
        #: token for the rest of a detailed run)
        self.lazy: set[int] = set()
        self.start = cluster.begin_run(len(workload) if stream else None)

    def next_release(self) -> float:
        """When the next release can happen (inf: none left, or no free seat)."""
        turns, seats, k = self.releases, self.seats, self.next_arrival
        if k < len(self.arrival_times):
            t = self.arrival_times[k]
            if turns and turns[0][0] < t:
                t = turns[0][0]
        elif turns:
            t = turns[0][0]
        else:
            return _INF
        t = self.start + t
        if seats is None:
            return t
        return max(t, seats[0]) if seats else _INF

    def run(self, bar=None) -> None:
        """Handle events until every request has ended. `bar`: a progress bar told of each
        ended request. Changes state.

        Raises:
            RuntimeError: requests are outstanding and no instance can make progress.
        """
        self.bar = bar
        cluster = self.cluster
        check = self.check
        latch = self.interrupt
        alone = len(cluster.instances) == 1  # NOTE: and so no KV transfers
        stalled = 0
        while True:
            if latch is not None and latch.hit:
                latch.check()
            inst = self._next_busy()
            t_busy = inst.now() if inst is not None else _INF
            t_release = self.next_release()
            t_transfer = cluster.next_transfer_time()
            if t_release < _INF and t_release <= t_busy and t_release <= t_transfer:
                self._queue(self.release(t_release))
            elif t_transfer < _INF and t_transfer <= t_busy:
                dst = cluster.deliver_next()
                self.ended(dst)
                self._queue(dst)
            elif inst is not None:
                # NOTE: the next release moves only when something ends (a seat, a next turn)
                t_release = self.next_release()
                engine = inst.engine  # NOTE: `inst.is_busy()` and `inst.now()` inline below
                while True:
                    if latch is not None and latch.hit:
                        latch.check()
                    stepped = cluster.step(inst, check)
                    if self.ended(inst):
                        stalled = 0
                        t_release = self.next_release()
                    elif stepped:
                        stalled = 0
                    else:
                        stalled += 1
                        if stalled > MAX_STALLED_STEPS:
                            raise RuntimeError(self._stuck(
                                f"instance {inst.index} made no progress in {stalled} steps"))
                    # NOTE: a lone instance steps on while it is busy and no release is due:
                    # what the next round would choose, without the busy heap
                    if not (alone and engine.has_unfinished() and engine.clock.now() < t_release):
                        break
                self._queue(inst)
            elif cluster.has_pending():  # transfers that wait for nothing: admit or reject
                cluster.admit_pending()
                for inst in cluster.instances:
                    self.ended(inst)
                    self._queue(inst)
            elif (self.outstanding or self.releases
                  or self.next_arrival < len(self.arrival_times)):
                if any(self.ended(inst) for inst in cluster.instances):
                    continue
                raise RuntimeError(self._stuck("no instance has work left"))
            else:
                return

    def _queue(self, inst: Instance) -> None:
        """File `inst` in the busy heap at its clock, if it is busy and not filed there."""
        if inst.is_busy():
            t = inst.now()
            if self._filed.get(inst.index) != t:
                self._filed[inst.index] = t
                heapq.heappush(self._busy, (t, inst.index))

    def _next_busy(self) -> Instance | None:
        """The busy instance whose clock is furthest behind (ties: the lowest index), or None.

        NOTE: the heap holds (clock, index) entries filed after each event that touched an
        instance (a virtual or paused clock moves only then); an entry whose instance was filed
        again since, or is idle, is dropped when it surfaces.
        An empty heap is refilled from a scan, so an instance made busy some other way is
        still found."""
        inst = self._top()
        if inst is None:
            for i in self.cluster.is_busy():
                self._queue(i)
            inst = self._top()
        return inst

    def _top(self) -> Instance | None:
        """The heap's first entry that is current and busy (dropping those before it)."""
        heap, filed, instances = self._busy, self._filed, self.cluster.instances
        while heap:
            t, j = heap[0]
            if filed.get(j) == t:
                inst = instances[j]
                if inst.is_busy():
                    return inst
                del filed[j]
            heapq.heappop(heap)
        return None

    def _stuck(self, what: str) -> str:
        ec = self.cluster.engine_config
        return (f"{what} while {self.outstanding} requests are outstanding (scheduler "
                f"{ec.scheduler!r}, queue {ec.queue!r}): a plugin lost or stalls them")

    def release(self, t: float) -> Instance:
        """Submit the next release at `t` (its arrival time, a seat's time included). Returns
        the instance it went to."""
        k, turns = self.next_arrival, self.releases
        # NOTE: an arrival before a next turn at the same time, as (t, 0, i) < (t, 1, j)
        if k < len(self.arrival_times) and not (turns and turns[0][0] < self.arrival_times[k]):
            i = self.arrival_index[k]
            self.next_arrival = k + 1
        else:
            _, _, i = heapq.heappop(turns)
        if self.seats is not None:
            heapq.heappop(self.seats)
        w = self.workload[i]
        prompt: Sequence[int] | None = self.prompts.pop(i, None)
        if prompt is None:
            prompt = w.prompt_token_ids
            if isinstance(prompt, LazyTokens):
                # NOTE: ints of its own (no shared ints to fetch), freed when it ends
                prompt = prompt.read(own=True)
                self.lazy.add(i)
        inst, req = self.cluster.route(i, prompt, self.params[i], t, w,
                                       None if self.ids is None else self.ids[i])
        self.index[id(req)] = i
        self.outstanding += 1
        self.ended(inst)  # rejected on arrival
        return inst

    def ended(self, inst: Instance) -> bool:
        """Take what ended on `inst`: free seats, release next turns. Returns whether anything
        ended or moved."""
        done, moved = self.cluster.collect(inst)
        for r in done:
            i = self.index.pop(id(r), None)
            if i is None:
                continue
            self.outstanding -= 1
            if self.bar is not None:
                self.bar.update(1)
            t = r.metrics.finished_time
            if t is None:
                t = inst.now()
            if self.seats is not None:
                heapq.heappush(self.seats, t)
            j = self.nxt.get(i)
            if j is not None:
                w = self.workload[j]
                self.prompts[j] = r.prompt_token_ids + r.output_token_ids + list(
                    w.prompt_token_ids)
                heapq.heappush(self.releases, (t - self.start + w.think_time_s, 1, j))
            if i in self.lazy:
                self.lazy.discard(i)
                r.prompt_token_ids = self.workload[i].prompt_token_ids  # type: ignore[assignment]
            if self.stream:
                self.cluster.retire(i, inst, r)
        return moved


class WorkloadParams(Sequence[SamplingParams]):
    """Each request's `SamplingParams`, `temperature` and `ignore_eos` with its workload
    request's `max_tokens`, made when read (the run loop reads each once, at its release,
    so a long run holds none of them)."""

    def __init__(self, workload: Sequence[WorkloadRequest], temperature: float,
                 ignore_eos: bool) -> None:
        self._workload = workload
        self._temperature = temperature
        self._ignore_eos = ignore_eos
        #: the first request's, checked; each request's a copy with its `max_tokens`
        self._first: SamplingParams | None = None
        # NOTE: checked here, before the run, as building them all would: the first request
        # whose parameters are not plain valid ones is built, to raise SamplingParams' error
        for k, w in enumerate(workload):
            if k == 0 or type(w.max_tokens) is not int or w.max_tokens < 1:
                self[k]

    def __len__(self) -> int:
        return len(self._workload)

    @overload
    def __getitem__(self, i: int) -> SamplingParams: ...
    @overload
    def __getitem__(self, i: slice) -> list[SamplingParams]: ...

    def __getitem__(self, i: int | slice) -> SamplingParams | list[SamplingParams]:
        if isinstance(i, slice):
            return [self[k] for k in range(len(self))[i]]
        max_tokens = self._workload[i].max_tokens
        first = self._first
        if first is None:
            first = self._first = SamplingParams(temperature=self._temperature,
                                                 max_tokens=max_tokens,
                                                 ignore_eos=self._ignore_eos)
        return first.with_max_tokens(max_tokens)

