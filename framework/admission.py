"""Token budget, KV admission and preemption: the helpers a policy's `schedule()` is built from.

`AdmissionControl` is the base of `schedlab.scheduler.Scheduler` and owns the state a step is
built from (the limits, the KV manager, the queue, the running requests and the preemption
counters), so a policy calls these as its own methods: `schedule_running` continues the
running requests, `admit_waiting` admits queued ones in policy order, and both preempt (swap
or recompute) when KV runs out, taking victims as the queue's `select_victim` / `outranks` say.
What the queue hands back is checked where it is used: a broken rule raises `PluginFault`
naming the queue method.
"""

from __future__ import annotations

from itertools import islice
from typing import cast

from schedlab.faults import PluginFault, named
from schedlab.kv_manager import KVCacheManager
from schedlab.plan import ScheduledRequest, SchedulerConfig, SchedulerOutput
from schedlab.prefix_cache import PrefixMatch
from schedlab.queue import RequestQueue, overrides_hook
from schedlab.request import Request, RequestStatus

_QUEUED = (RequestStatus.WAITING, RequestStatus.PREEMPTED)


class AdmissionControl:
    """The shared step-building mechanism of every `Scheduler` (see the module docstring).

    Args:
        config: the limits.
        kv: allocation, freeing and prefix reuse.
        queue: the waiting requests in policy order.
    """

    #: whether a prompt may be split over steps (the engine then allows prompts over the budget)
    chunks_prefill: bool = False

    def __init__(self, config: SchedulerConfig, kv: KVCacheManager, queue: RequestQueue) -> None:
        self.config = config
        self.kv = kv
        self.waiting = queue
        self.running: list[Request] = []
        self.num_preemptions = 0
        #: preemptions that swapped the victim's KV to host memory (the rest recompute)
        self.num_swaps = 0
        queue.bind(kv)
        # NOTE: a hook the queue leaves as the base's no-op is not called per request (or per
        # step): looked up once, here, when the queue is bound.
        self._on_token = queue.on_token if overrides_hook(queue, "on_token") else None
        self._expire = queue.expire if overrides_hook(queue, "expire") else None

    def num_tokens_to_run(self, remaining: int, budget: int) -> int:
        """How many of a request's `remaining` tokens fit this step (0: none).

        Without chunking a prefill runs whole or waits; with it, a prefill is cut to the budget
        and to `long_prefill_threshold`.
        """
        if self.chunks_prefill:
            cap = self.config.long_prefill_threshold or budget
            return max(0, min(remaining, budget, cap))
        return remaining if remaining <= budget else 0

    def schedule_running(self, out: SchedulerOutput, budget: int) -> int:
        """Continue running requests in order, preempting by policy when KV runs out.

        Victims are the running requests not yet scheduled this step and, where the queue
        says the one short of KV `outranks` them, planned ones too (taken out of the step,
        their tokens given back to the budget), as vLLM's priority scheduler does. Returns
        the budget left.
        """
        running = self.running
        # NOTE: a running request has host KV to bring back only if some request had at the
        # start (a victim swapped out in this loop leaves `running`), so one look suffices.
        quick = not self.kv.has_swapped()
        i = 0
        while i < len(running) and budget > 0:
            if quick:
                i, budget = self._plan_decodes(out, i, budget)
                if i >= len(running) or budget <= 0:
                    break
            i, budget = self._continue(out, i, budget)
        return budget

    def _plan_decodes(self, out: SchedulerOutput, i: int, budget: int) -> tuple[int, int]:
        """`_continue` for the run of decoding requests from `running[i]` (at most `budget`),
        their KV from the free pool in one `allocate_next_tokens` call (the decode fast path,
        for a plan with no swap-in); one the pool is short for, and those after it needing a
        block, go through `_continue` in order. Returns where the run stopped and the budget
        left. Changes state."""
        running = self.running
        starts: list[int] = []
        add_start = starts.append
        for req in islice(running, i, i + budget):
            done = req.num_computed_tokens
            if len(req.prompt_token_ids) + len(req.output_token_ids) - done != 1:
                break
            add_start(done)
        if not starts:
            return i, budget
        stop = i + len(starts)
        run = running[i:stop]
        tables = self.kv.allocate_next_tokens(run)
        if None not in tables:  # NOTE: the common step: the pool had a slot for every decode
            out.add_decodes(run, starts, cast("list[list[int]]", tables))
            return stop, budget - len(run)
        ready = tables.index(None)
        add = out.add
        # NOTE: the entries up to the first request the pool was short for, in one call
        held = cast("list[list[int]]", tables[:ready])
        out.add_decodes(run[:ready], starts[:ready], held)
        num_preemptions = self.num_preemptions
        for k in range(ready, len(run)):
            req, table = run[k], tables[k]
            if table is not None:
                add(ScheduledRequest(req, 1, req.num_computed_tokens, table))
                continue
            j, left = self._continue(out, i + k, budget - k)  # evict or preempt for it
            if self.num_preemptions != num_preemptions:
                return j, left  # the run's positions moved; the caller goes on from j
        return stop, budget - len(run)  # each of the run took one token

    def _continue(self, out: SchedulerOutput, i: int, budget: int) -> tuple[int, int]:
        """Plan `running[i]`'s next tokens (a decode, or its prompt or the next chunk of it),
        preempting by policy when KV runs out. Changes state.

        Returns:
            The index of the next request to look at and the budget left.
        """
        running, kv = self.running, self.kv
        req = running[i]
        done = req.num_computed_tokens
        remaining = len(req.prompt_token_ids) + len(req.output_token_ids) - done
        n = 1 if remaining == 1 else self.num_tokens_to_run(remaining, budget)  # a decode fits
        if n == 0:
            return i + 1, budget
        target = done + n
        if kv.can_allocate(req, target):
            kv.allocate(req, target)
        else:
            seen = {id(r) for r in running[:i]}
            planned = out.num_batched_tokens
            kept = self.ensure_kv(req, target, running[i:], out)
            budget += planned - out.num_batched_tokens  # planned victims give theirs back
            i = sum(1 for r in running if id(r) in seen)  # victims may have sat before req
            if not kept:
                return i, budget  # req itself was preempted; running[i] is now the next one
        out.add(self._plan(req, n, done))
        return i + 1, budget - n

    def admit_waiting(self, out: SchedulerOutput, budget: int,
                      max_num_new: int | None = None) -> int:
        """Admit queued requests in policy order while seats, budget and KV allow.

        Stops at the first request that does not fit (no skipping ahead: the policy's order is
        kept), or after `max_num_new` admissions (None: no cap). Returns the budget left.
        """
        num_new = 0
        while self.waiting and len(self.running) < self.config.max_num_seqs and budget > 0:
            if max_num_new is not None and num_new >= max_num_new:
                break
            req = self.next_waiting()
            if out.preempted and any(r is req for r in out.preempted):
                break  # preempted in this very step: not back before the next one
            prefix = self.kv.match_prefix(req)
            start = prefix.num_tokens if prefix.block_ids else req.num_computed_tokens
            n = self.num_tokens_to_run(req.num_tokens - start, budget)
            if n == 0:
                break
            if not self.kv.can_allocate(req, start + n, prefix):
                freed = self._preempt_outranked(req, start + n, out)
                if freed is None:
                    break
                budget += freed
                continue  # look again: the victims' blocks are free now
            self.admit(req, start + n, prefix)
            out.add(self._plan(req, n, start))
            budget -= n
            num_new += 1
        return budget

    def next_waiting(self) -> Request:
        """The queue's head (`peek`), checked to be a request that waits. No state change.

        Raises:
            PluginFault: the queue returned a request that is running or has ended.
        """
        req = self.waiting.peek()
        if not isinstance(req, Request):
            raise PluginFault("queue", (
                f"peek() returned {named(req)}, not a Request; peek() returns the head of the "
                "queue (the engine calls it only when len() > 0)"))
        if req.status not in _QUEUED:
            raise PluginFault("queue", (
                f"peek() returned request {req.request_id!r}, which is {req.status.name}, not "
                "waiting; a queue holds each waiting request once (did add() or prepend() "
                "queue it twice, or pop() not remove it?)"))
        return req

    def admit(self, request: Request, num_tokens: int,
              prefix: PrefixMatch | None = None) -> None:
        """Move the queue's head `request` (from `next_waiting`) to the running set holding KV
        for `num_tokens` tokens, its cached `prefix` reused and counted as computed. Call
        `kv.can_allocate(request, num_tokens, prefix)` first. Changes state.

        Raises:
            PluginFault: the queue's `pop()` returned another request than `peek()`.
        """
        popped = self.waiting.pop()
        if popped is not request:
            raise PluginFault("queue", (
                f"pop() returned {named(popped)} but peek() had just returned request "
                f"{request.request_id!r}; pop() must remove and return the request peek() "
                "returns"))
        reused = self.kv.allocate(request, num_tokens, prefix)
        if reused.num_tokens:
            request.num_computed_tokens = reused.num_tokens
        if request.metrics.first_scheduled_time is None:  # vLLM counts the first lookup only
            self.kv.record_lookup(request.num_prompt_tokens, reused.num_tokens)
            request.metrics.num_cached_tokens = reused.num_tokens
        request.status = RequestStatus.RUNNING
        self.running.append(request)

    def plan_request(self, request: Request, num_new_tokens: int) -> ScheduledRequest:
        """A running request's share of this step: its next `num_new_tokens` tokens, from where
        it stopped, over the KV it holds (allocate first). Add it with `out.add`.
        No state change beyond handing back swapped-out KV (see `_plan`)."""
        return self._plan(request, num_new_tokens, request.num_computed_tokens)

    def _preempt_outranked(self, req: Request, num_tokens: int,
                           out: SchedulerOutput) -> int | None:
        """Preempt running requests that the waiting `req` outranks (`RequestQueue.outranks`)
        until it can hold `num_tokens`; victims leave this step's plan. Changes state.

        Returns:
            The budget the victims gave back, or None (nothing preempted) when even all
            outranked requests together would not free enough KV.
        """
        kv, queue = self.kv, self.waiting
        victims = [r for r in self.running if queue.outranks(req, r)]
        if not victims:  # the usual case (FCFS never outranks): nothing built per step
            return None
        # NOTE: a request whose swapped KV comes back in this very step is never a victim.
        planned = {id(s.request): s for s in out.scheduled}
        victims = [r for r in victims if not (id(r) in planned and planned[id(r)].swap_in)]
        if not victims:
            return None
        if not victims_would_make_room(kv, req, num_tokens, victims):
            return None
        freed = 0
        while victims and not kv.can_allocate(req, num_tokens):
            victim = queue.select_victim(victims)
            take_victim(victims, victim)
            sr = planned.get(id(victim))
            if sr is not None:
                out.scheduled.remove(sr)
                freed += sr.num_new_tokens
            self.preempt(victim, out)
            out.preempted.append(victim)
        return freed

    def _plan(self, req: Request, n: int, start: int) -> ScheduledRequest:
        """The request's share of the step. NOTE: every policy plans through here, so a
        swapped-out request's KV is copied back the first time it runs again."""
        kv = self.kv
        table = kv.allocator.block_table(req)
        pairs = kv.swap_in(req)
        return ScheduledRequest(req, n, start, table, pairs) if pairs else (
            ScheduledRequest(req, n, start, table))

    def preempt(self, request: Request, out: SchedulerOutput | None = None) -> None:
        """Take a running request off the device: free its KV and queue it again. Changes state.

        Swap: when the KV manager's host pool holds its blocks (and `out` is given, to carry
        the copies), its KV goes to host memory and comes back on re-admission. Otherwise
        (recompute): its prompt and the outputs so far are prefilled again when it is
        re-admitted. Either way its output is unchanged.
        """
        self.running.remove(request)
        pairs = self.kv.swap_out(request) if out is not None else None
        if out is None or pairs is None:
            self.kv.free(request)
            request.num_computed_tokens = 0
        else:
            out.swap_out.extend(pairs)
            self.num_swaps += 1
        request.status = RequestStatus.PREEMPTED
        request.metrics.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.prepend(request)

    def ensure_kv(
        self, request: Request, num_tokens: int, candidates: list[Request], out: SchedulerOutput
    ) -> bool:
        """Make room for `request` to hold `num_tokens`, preempting by policy, and allocate.
        Changes state.

        Victims are chosen by the queue's `select_victim` among `candidates` (requests not
        yet scheduled this step, `request` among them) and the requests planned this step
        that `request` outranks (`RequestQueue.outranks`); a planned victim leaves
        `out.scheduled`. `candidates` is not changed. Returns False if `request` itself had
        to be preempted.
        """
        pool: list[Request] | None = None
        planned: dict[int, ScheduledRequest] = {}
        while not self.kv.can_allocate(request, num_tokens):
            if pool is None:
                pool = list(candidates)
                queue = self.waiting
                # NOTE: a request whose swapped KV comes back in this very step is never a victim
                planned = {id(s.request): s for s in out.scheduled
                           if not s.swap_in and s.request is not request
                           and queue.outranks(request, s.request)}
                pool += [s.request for s in planned.values()]
            victim = self.waiting.select_victim(pool)
            take_victim(pool, victim)
            sr = planned.get(id(victim))
            if sr is not None:
                out.scheduled.remove(sr)
            self.preempt(victim, out)
            out.preempted.append(victim)
            if victim is request:
                return False
        self.kv.allocate(request, num_tokens)
        return True


def take_victim(candidates: list[Request], victim: object) -> None:
    """Take the queue's `select_victim` choice out of `candidates`. Changes `candidates`.

    Raises:
        PluginFault: the queue chose something that is not one of them.
    """
    for k, r in enumerate(candidates):
        if r is victim:
            del candidates[k]
            return
    raise PluginFault("queue", (
        f"select_victim() returned {named(victim)}, not one of the {len(candidates)} "
        "candidates it was given; return one of them"))


def checked_dropped(dropped: object) -> list[tuple[Request, str]]:
    """What the queue's `expire` returned, checked: a list of `Dropped(request, reason)`.

    Raises:
        PluginFault: anything else (one sentence naming what came back).
    """
    if type(dropped) is list and not dropped:  # NOTE: the common step: nothing expired
        return dropped
    if not isinstance(dropped, list | tuple):
        raise PluginFault("queue", (
            f"expire() returned {named(dropped)}; return a list of Dropped(request, reason) "
            "([] when nothing expired)"))
    for d in dropped:
        if (not isinstance(d, tuple) or len(d) != 2 or not isinstance(d[0], Request)
                or not isinstance(d[1], str) or not d[1]):
            raise PluginFault("queue", (
                f"expire() returned the entry {named(d)}; each entry is "
                "Dropped(request, reason), the reason a non-empty str"))
    return list(dropped)


def victims_would_make_room(kv: KVCacheManager, req: Request, num_tokens: int,
                            victims: list[Request]) -> bool:
    """Whether `req` could hold `num_tokens` once every one of `victims` gave its blocks
    back (and the prefix cache evicted what it can). No state change."""
    table = kv.allocator.block_table
    extra = sum(len(table(v)) for v in victims)
    if kv.prefix_cache is not None:
        extra += kv.num_evictable_blocks()
    return kv.allocator.can_allocate(req, num_tokens, num_extra_free=extra)
