"""KV transfer between a prefill and a decode instance (prefill/decode disaggregation)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from schedlab import registry
from schedlab.admission import checked_dropped, take_victim, victims_would_make_room
from schedlab.engine import Engine
from schedlab.faults import PluginContractError, PluginFault, named
from schedlab.queue import Dropped, RequestQueue, overrides_hook
from schedlab.request import MigratedRequest, Request, RequestStatus


@dataclass(slots=True)
class KVTransfer:
    """One request's prompt KV on its way from a prefill to a decode instance.

    Args:
        request: the request; its prompt is computed and its first token sampled.
        src: the prefill instance's index in the cluster.
        dst: the decode instance's index in the cluster.
        num_tokens: tokens of KV moved (the prompt).
        num_bytes: bytes moved (whole blocks, as a paged KV transfer moves them).
        start_time: when the prefill finished (cluster time, s).
        ready_time: when the KV has arrived: start + bytes / bandwidth + latency.
        data: the KV itself, per layer, for real executors (None for the simulator).
    """

    request: Request
    src: int
    dst: int
    num_tokens: int
    num_bytes: int
    start_time: float
    ready_time: float
    data: Any | None = None


def take_prefilled(engine: Engine, request: Request) -> tuple[int, Any | None]:
    """Take a request whose prefill just finished off a prefill instance, with its prompt KV
    (real executors), through `Engine.migrate_out`. Changes state.

    Returns:
        (the number of tokens whose KV moves, the KV or None in simulation).
    """
    m = engine.migrate_out(request.request_id)
    return m.num_tokens, m.data


def _migrated(transfer: KVTransfer) -> MigratedRequest:
    return MigratedRequest(transfer.request, transfer.num_tokens, transfer.data)


def can_admit(engine: Engine, transfer: KVTransfer) -> bool:
    """Whether the decode instance has a seat and KV blocks for the transferred prompt (plus
    the next token). No state change."""
    return engine.can_migrate_in(_migrated(transfer))


def admit_transferred(engine: Engine, transfer: KVTransfer) -> None:
    """Continue a request whose prompt KV arrived on the decode instance
    (`Engine.migrate_in`): the blocks are allocated there and, for real executors, the KV
    written into them; nothing is recomputed. Call `can_admit` first. Changes state."""
    engine.migrate_in(_migrated(transfer))
    transfer.data = None


def reject_transferred(engine: Engine, transfer: KVTransfer, now: float) -> None:
    """A transferred request that can never fit the decode instance: end it as REJECTED with
    a reason (its first token stays counted). Changes the request only."""
    req = transfer.request
    req.end(RequestStatus.REJECTED, now,
            f"its {transfer.num_tokens}-token prompt KV does not fit decode instance "
            f"{transfer.dst} ({engine.num_kv_blocks} KV blocks)")


class ArrivedTransfers:
    """The transfers whose KV has arrived on a decode instance and that wait for a seat and KV
    blocks, admitted in the order of the decode engine's queue policy (vLLM V1's decode side:
    a request whose remote KV has arrived waits like any other, and goes by the policy).

    They wait in a queue of their own, of the decode engine's plugin and options
    (`EngineConfig.queue`, built on the first arrival and bound to the engine's KV), which
    sees what the engine's queue would see of them on one engine: `add` when the KV arrives,
    `peek` / `pop` when one takes its seat (VTC charges its prompt then), `on_token` for every
    token the decode engine produces (`served`), `outranks` / `select_victim` when the head has
    a seat but not the KV (outranked running requests are preempted for it) and `expire` before
    each admission (a policy may give up on one: it ends REJECTED with the reason). Not
    `accept`: the prefill instance's queue took the request when it arrived.

    NOTE: transfers are admitted before each step of the decode engine, ahead of the requests
    it preempted itself (those wait in the engine's own queue), and the policy's head blocks
    the rest (no skipping ahead), as the engine admits its waiting requests; under `fcfs` this
    is the arrival order, as before the policy decided it. The engine's own queue still
    orders what the engine preempts itself and picks its victims when KV runs out mid-decode;
    a policy that keeps service books keeps one per instance, shared by the two queues through
    the KV manager both are bound to (VTC: the prompts charged here and every token).

    Args:
        engine: the decode instance's engine.
    """

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        #: the policy's queue of the waiting requests (None until the first transfer)
        self.queue: RequestQueue | None = None
        self._label = registry.describe(engine.config.queue)
        #: id(request) -> its transfer, the waiting ones (read-only outside; one dict for good)
        self.by_request: dict[int, KVTransfer] = {}
        self._on_token: Callable[[Request], None] | None = None
        self._expire: Callable[[float], list[Dropped]] | None = None
        self._outranks = False

    def _build(self) -> RequestQueue:
        cfg = self.engine.config
        queue = registry.build(registry.resolve("queue", cfg.queue, cfg.queue_options))
        queue.bind(self.engine.kv)
        self.queue = queue
        # NOTE: hooks a queue leaves as the base's no-ops are not called (as the scheduler does)
        self._on_token = queue.on_token if overrides_hook(queue, "on_token") else None
        self._expire = queue.expire if overrides_hook(queue, "expire") else None
        self._outranks = overrides_hook(queue, "outranks")
        return queue

    # ---- queries (no state change) -------------------------------------------------------
    def __len__(self) -> int:
        return len(self.by_request)

    def __bool__(self) -> bool:
        return bool(self.by_request)

    def __iter__(self) -> Iterator[KVTransfer]:
        """The waiting transfers in arrival order. No state change."""
        return iter(self.by_request.values())

    # ---- changes -------------------------------------------------------------------------
    def add(self, transfer: KVTransfer) -> None:
        """A transfer's KV has arrived: it waits at its place in the policy's order. Changes
        state.

        Raises:
            PluginContractError: the queue's `add()` did not queue it exactly once.
        """
        queue = self.queue if self.queue is not None else self._build()
        req = transfer.request
        self.by_request[id(req)] = transfer
        queue.add(req)
        if len(queue) != len(self.by_request):
            raise PluginContractError(
                f"queue {self._label} add() of request {req.request_id!r} left {len(queue)} "
                f"requests queued for {len(self.by_request)} arrived on the decode instance; "
                "add() queues a request once")

    def served(self, requests: Sequence[Request]) -> None:
        """The decode engine's step gave each of `requests` a token: the policy counts it (its
        `on_token`). Changes state (the policy's counters)."""
        on_token = self._on_token
        if on_token is not None:
            for r in requests:
                on_token(r)

    def admit(self, now: float) -> None:
        """Move the waiting transfers into the engine in the policy's order while seats and KV
        allow, preempting running requests the head outranks for its KV; one that cannot fit
        even an idle engine is rejected. Changes state.

        Raises:
            PluginContractError: the queue handed back a request that does not wait here.
        """
        if self.queue is None or not self.by_request:
            return
        try:
            self._admit(now)
        except PluginFault as e:  # NOTE: named on the queue as configured, as the engine does
            raise PluginContractError(f"queue {self._label} {e.rule}") from None

    def _admit(self, now: float) -> None:
        queue, engine, waiting = self.queue, self.engine, self.by_request
        assert queue is not None
        if self._expire is not None:
            for req, reason in checked_dropped(self._expire(now)):
                if waiting.pop(id(req), None) is None:
                    raise _not_waiting("expire()", req)
                req.end(RequestStatus.REJECTED, now, reason)
        while waiting:
            req = queue.peek()
            t = waiting.get(id(req))
            if t is None:
                raise _not_waiting("peek()", req)
            if can_admit(engine, t) or (self._outranks and self._preempt_for(t)):
                fits = True
            elif not engine.has_unfinished():
                fits = False
            else:
                break
            popped = queue.pop()
            if popped is not req:
                raise _not_waiting("pop()", popped)
            del waiting[id(req)]
            if fits:
                admit_transferred(engine, t)
            else:
                reject_transferred(engine, t, now)

    def _preempt_for(self, transfer: KVTransfer) -> bool:
        """Preempt running requests the transfer's request outranks (`RequestQueue.outranks`),
        the policy's victims first, until it can be admitted (recompute: there is no step to
        carry a swap). Returns whether it can be now; nothing is preempted when even every
        outranked request together would not free enough KV, or no seat is free. Changes
        state."""
        engine, queue, req = self.engine, self.queue, transfer.request
        assert queue is not None
        sched, kv = engine.scheduler, engine.kv
        if len(sched.running) >= sched.config.max_num_seqs:
            return False
        victims = [r for r in sched.running if queue.outranks(req, r)]
        if not victims:
            return False
        if not victims_would_make_room(kv, req, transfer.num_tokens + 1, victims):
            return False
        while victims and not can_admit(engine, transfer):
            victim = queue.select_victim(victims)
            take_victim(victims, victim)
            sched.preempt(victim)
        return can_admit(engine, transfer)

    def clear(self) -> None:
        """Drop every waiting transfer (a run cut short). Changes state."""
        queue = self.queue
        if queue is not None:
            for t in self.by_request.values():
                queue.remove(t.request)
        self.by_request.clear()

    def check_integrity(self) -> None:
        """Raise AssertionError if the policy's queue and the waiting transfers disagree."""
        queue = self.queue
        if queue is None:
            assert not self.by_request, "transfers wait without a queue"
            return
        queue.check_integrity()
        assert len(queue) == len(self.by_request), (
            f"the decode queue holds {len(queue)} requests for {len(self.by_request)} "
            "arrived transfers")
        for r in queue:
            t = self.by_request.get(id(r))
            assert t is not None and t.request is r, f"{r.request_id} queued without its KV"


def _not_waiting(method: str, req: object) -> PluginFault:
    return PluginFault("queue", (
        f"{method} returned {named(req)}, which is not waiting for a seat on the decode "
        "instance; a queue hands back only requests it was given and holds each once"))
