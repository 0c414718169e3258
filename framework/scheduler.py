"""The scheduler interface and the mechanism every policy shares.

A policy plugin implements `schedule()`: which requests run this step and how many tokens each.
The request lifecycle (queueing, the stop checks after a step, abort, migration between
engines) lives here, once; the token budget, KV admission and preemption helpers a policy
builds its plan with, and the state they work on, come from its base
`schedlab.admission.AdmissionControl`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from itertools import chain, repeat
from operator import add, attrgetter

from schedlab.admission import AdmissionControl, checked_dropped
from schedlab.faults import PluginFault, named
from schedlab.plan import SchedulerOutput
from schedlab.request import Request, RequestStatus

_REQUEST = attrgetter("request")
_START = attrgetter("start")
_NUM_NEW = attrgetter("num_new_tokens")


class Scheduler(AdmissionControl, ABC):
    """Decides each step's plan under `max_num_seqs` and `max_num_batched_tokens`.

    Composed at construction with a KV manager (allocator + prefix cache) and an ordering
    policy; it never knows which ones. The state and the helpers a policy plans with
    (`schedule_running`, `admit_waiting`, `preempt`, ...) come from `AdmissionControl`, its
    base; the class attribute `chunks_prefill` (default False) says whether a prompt may be
    split over steps (the engine then allows prompts over the budget).

    Args:
        config: the limits.
        kv: allocation, freeing and prefix reuse.
        queue: the waiting requests in policy order.
    """

    # ---- the policy ----------------------------------------------------------------------
    @abstractmethod
    def schedule(self) -> SchedulerOutput:
        """Plan the next step: admit, continue and preempt requests. Changes state.

        Returns:
            The plan; empty when nothing can run.
        """

    # ---- the shared mechanism ------------------------------------------------------------
    def add_request(self, request: Request) -> None:
        """Queue a validated request. Changes state.

        Raises:
            PluginFault: the queue's `add()` queued it more than once.
        """
        queue = self.waiting
        reason = queue.accept(request)
        if reason is not None:  # refused by the policy (e.g. a client over its rate limit)
            if not isinstance(reason, str) or not reason:
                raise PluginFault("queue", (
                    f"accept() returned {named(reason)} for request {request.request_id!r}; "
                    "return None to queue it or the reason it is refused (a non-empty str)"))
            self._reject(request, reason, request.arrival_time)
            return
        request.status = RequestStatus.WAITING
        before = len(queue)
        queue.add(request)
        grown = len(queue) - before
        if grown > 1:  # NOTE: a request add() drops is found after the next step (the engine)
            raise PluginFault("queue", (
                f"add() of request {request.request_id!r} grew len() by {grown}; add() queues "
                "a request once"))

    def update_from_output(
        self, output: SchedulerOutput, sampled: Sequence[int | None], now: float
    ) -> list[Request]:
        """Apply a finished step: advance computed tokens, append sampled tokens, stop checks.

        Args:
            output: the plan that ran.
            sampled: one entry per `output.scheduled`: the new token, or None (partial prefill).
            now: the step's end time on the engine clock.

        Returns:
            The requests that finished in this step (their KV already freed).
        """
        finished: list[Request] = []
        max_len = self.config.max_model_len
        cache_computed = self.kv.cache_computed if self.kv.prefix_cache is not None else None
        on_token = self._on_token
        run, rest = output.decode_run, output.rest
        # NOTE: each request and where its step ends, a decode run's (one token each) first
        reqs: Iterable[Request]
        ends: Iterable[int]
        if run is None:
            num = len(rest)
            reqs, ends = map(_REQUEST, rest), map(add, map(_START, rest), map(_NUM_NEW, rest))
        else:
            num = len(run.requests) + len(rest)
            reqs, ends = run.requests, map(add, run.starts, repeat(1))
            if rest:
                reqs = chain(reqs, map(_REQUEST, rest))
                ends = chain(ends, map(add, map(_START, rest), map(_NUM_NEW, rest)))
        if len(sampled) != num:
            raise ValueError(f"update_from_output: {len(sampled)} sampled entries for a plan "
                             f"of {num}; one per scheduled request")
        for req, end, token in zip(reqs, ends, sampled, strict=True):
            req.num_computed_tokens = end
            if cache_computed is not None:
                cache_computed(req)
            if token is None:
                continue
            out_ids = req.output_token_ids
            out_ids.append(token)
            if on_token is not None:
                on_token(req)
            m = req.metrics
            m.token_times.append(now)
            if m.first_token_time is None:
                m.first_token_time = now
            sp = req.sampling_params
            if not sp.ignore_eos and token in req.eos_token_ids:
                self._finish(req, RequestStatus.FINISHED_STOPPED, now)
            elif sp.stop_token_ids and token in sp.stop_token_ids:
                self._finish(req, RequestStatus.FINISHED_STOPPED, now)
            elif (len(out_ids) >= sp.max_tokens
                  or len(req.prompt_token_ids) + len(out_ids) >= max_len):
                self._finish(req, RequestStatus.FINISHED_LENGTH, now)
            else:
                continue
            finished.append(req)
        if finished:
            done = {id(r) for r in finished}
            self.running = [r for r in self.running if id(r) not in done]
        if self._expire is not None:
            for req, reason in checked_dropped(self._expire(now)):  # e.g. EDF: a deadline missed
                self._reject(req, reason, now)
                finished.append(req)
        return finished

    def _reject(self, req: Request, reason: str, now: float) -> None:
        """End a request that is not running as REJECTED with `reason`; free any host KV."""
        self.kv.free(req)  # a swapped-out request holds host slots
        req.end(RequestStatus.REJECTED, now, reason)

    def _finish(self, req: Request, status: RequestStatus, now: float) -> None:
        req.end(status, now)
        self.kv.free(req)

    def abort(self, request: Request, now: float) -> None:
        """Stop a request wherever it is and free its KV. Changes state."""
        if request in self.running:
            self.running.remove(request)
            self.kv.free(request)
        elif any(r is request for r in self.waiting):
            self.waiting.remove(request)
            self.kv.free(request)  # a swapped-out request holds host slots
        request.end(RequestStatus.FINISHED_ABORTED, now)

    def has_unfinished(self) -> bool:
        return bool(self.running) or bool(self.waiting)

    # ---- migration between engines (prefill/decode disaggregation) -------------------------
    def release(self, request: Request) -> int:
        """Hand a request over to another engine: take it out of the running set (or the
        queue) and free its KV here, keeping its output and timestamps; it waits for
        `adopt` on the other side. Changes state.

        Returns:
            How many of its tokens have K/V on the device to move with it (0 for a queued
            request: the other side computes it again).
        """
        if any(r is request for r in self.running):
            moved = request.num_computed_tokens
            self.running.remove(request)
        else:
            moved = 0
            self.waiting.remove(request)
        self.kv.free(request)
        request.num_computed_tokens = 0
        request.status = RequestStatus.WAITING
        return moved

    def can_adopt(self, request: Request, num_tokens: int) -> bool:
        """Whether a request whose first `num_tokens` tokens were computed elsewhere can join
        the running set here: a seat, and KV for those tokens plus the next. No state change."""
        return (len(self.running) < self.config.max_num_seqs
                and self.kv.can_allocate(request, num_tokens + 1))

    def adopt(self, request: Request, num_tokens: int) -> list[int]:
        """Take a request released by another engine into the running set, its first
        `num_tokens` tokens counted as computed (their K/V arrives from the other side); the
        next step continues it. Call `can_adopt` first. Changes state.

        Returns:
            The blocks holding those tokens, in order (where the migrated K/V goes).
        """
        self.kv.allocate(request, num_tokens)
        request.num_computed_tokens = num_tokens
        request.status = RequestStatus.RUNNING
        request.finish_reason = None
        request.metrics.finished_time = None
        self.running.append(request)
        table = self.kv.allocator.block_table(request)
        return list(table[: self.kv.allocator.blocks_for(num_tokens)])

    def reject_stalled(self, reason: str, now: float) -> Request | None:
        """When nothing runs but requests wait and the policy planned nothing, reject the head
        of the queue with `reason`, so no request waits forever. Changes state.

        Returns:
            The rejected request, or None when nothing was stalled.
        """
        if self.running or not self.waiting:
            return None
        req = self.waiting.pop()
        self._reject(req, reason, now)
        return req

    def check_integrity(self) -> None:
        """Raise AssertionError if requests, queue and KV disagree."""
        self.waiting.check_integrity()
        self.kv.check_integrity()
        assert len(self.running) <= self.config.max_num_seqs, "more running than max_num_seqs"
        ids = {id(r) for r in self.running}
        assert len(ids) == len(self.running), "a request runs twice"
        for r in self.running:
            assert r.status is RequestStatus.RUNNING, f"{r.request_id} running with {r.status}"
            held = len(self.kv.allocator.block_table(r)) * self.kv.block_size
            assert held >= r.num_computed_tokens, f"{r.request_id} computed more than it holds"
        for r in self.waiting:
            assert id(r) not in ids, f"{r.request_id} both waiting and running"
            assert not self.kv.allocator.block_table(r), f"waiting {r.request_id} holds KV"
            assert r.num_computed_tokens == 0 or self.kv.is_swapped(r), (
                f"waiting {r.request_id} keeps computed tokens but its KV is not swapped out")

