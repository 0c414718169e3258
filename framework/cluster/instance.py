"""One engine of a cluster: its role, the requests routed to it, its load as routers see it."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, replace

from schedlab.clock import InstanceClock
from schedlab.cluster.router import InstanceLoad
from schedlab.cluster.transfer import ArrivedTransfers, KVTransfer, take_prefilled
from schedlab.engine import Engine
from schedlab.request import Request, RequestStatus, SamplingParams
from schedlab.runs.distributions import WorkloadRequest

#: the statuses of a request not ended (`Request.is_finished` is False), tested by identity
_LIVE = (RequestStatus.RUNNING, RequestStatus.WAITING, RequestStatus.PREEMPTED)


class Role(enum.Enum):
    MIXED = "mixed"  # co-located: prefills and decodes
    PREFILL = "prefill"
    DECODE = "decode"


@dataclass(slots=True)
class InstanceSummary:
    """One instance's share of a cluster run (results.json's `cluster.instances`)."""

    index: int
    role: str
    #: requests routed here on arrival (a decode instance receives transfers instead)
    num_routed: int
    num_steps: int
    #: time on the instance's clock spent in steps (its clock's share of the run)
    busy_time_s: float
    num_preemptions: int
    num_swaps: int
    num_prefix_hit_tokens: int
    num_prefix_query_tokens: int
    num_kv_blocks: int
    peak_kv_used_blocks: int
    #: peak_kv_used_blocks / num_kv_blocks, in percent
    peak_kv_usage_pct: float
    num_transfers_out: int = 0
    num_transfers_in: int = 0
    transfer_bytes_out: int = 0
    mean_transfer_time_ms: float = 0.0


class Instance:
    """An engine with a role, a clock the cluster steps, and the requests routed to it.

    Args:
        index: the instance's position in the cluster.
        engine: its engine (its own clock: the simulator's virtual one, or an
            `InstanceClock` for real executors).
        role: co-located, prefill-only or decode-only.
    """

    def __init__(self, index: int, engine: Engine, role: Role = Role.MIXED) -> None:
        self.index = index
        self.engine = engine
        self.role = role
        #: requests routed here and not yet done here, by id
        self.in_flight: dict[str, Request] = {}
        #: decode side: transfers whose KV arrived, waiting for a seat and blocks in the order
        #: of the engine's queue policy
        self.pending = ArrivedTransfers(engine)
        #: the waiting transfers (`pending.by_request`: a dict's length, not a method call,
        #: on every step)
        self._arrived = self.pending.by_request
        self.num_routed = 0
        self.num_transfers_in = 0
        self.num_transfers_out = 0
        self.transfer_bytes_out = 0
        self._transfer_time_sum = 0.0
        self._busy_time = 0.0
        #: whether every unfinished request of the engine is one routed here, so that the
        #: requests ended here can be counted without a scan (see `take_done`)
        self._counted = not engine.has_unfinished()
        #: the load as of the last change made through this instance (None: changed since)
        self._load: InstanceLoad | None = None
        #: the most KV blocks in use over the step records streaming runs took from the
        #: engine (gone from `engine.step_stats`; `summary` counts them with those kept)
        self.drained_kv_peak = 0
        #: the engine's clock as last stepped, and it if an InstanceClock (paused between steps)
        self._clock: object = None
        self._timed: InstanceClock | None = None

    # ---- queries (no state change) -------------------------------------------------------
    def now(self) -> float:
        return self.engine.clock.now()

    def is_busy(self) -> bool:
        """Whether the engine has a request to step (pending transfers do not count)."""
        return self.engine.has_unfinished()

    def has_work(self) -> bool:
        return self.is_busy() or bool(self.pending)

    def load(self, cached_prefix_tokens: int = 0) -> InstanceLoad:
        """The instance's load as routers see it (see `InstanceLoad`). No state change.

        NOTE: kept from one call to the next until this instance changes (a step, a request
        or a transfer in or out: the methods below forget it), so a router reading every
        instance on every arrival sums over the requests only of those that changed."""
        load = self._load
        if load is None:
            outstanding = sum(self._remaining(r) for r in self.in_flight.values())
            outstanding += sum(self._remaining(t.request) for t in self.pending)
            c = self.engine.counters()
            load = self._load = InstanceLoad(
                index=self.index,
                num_running=c.num_running,
                num_waiting=c.num_waiting + len(self.pending),
                outstanding_tokens=outstanding,
                kv_free_blocks=c.kv_free_blocks,
                num_kv_blocks=c.num_kv_blocks,
            )
        if cached_prefix_tokens:
            return replace(load, cached_prefix_tokens=cached_prefix_tokens)
        return load

    def forget_load(self) -> None:
        """The engine was changed from outside this instance (an abort): the next `load`
        reads it afresh. Changes state."""
        self._load = None

    def abort_all(self) -> None:
        """Abort every request in flight here and drop those waiting for a seat (a run cut
        short). Changes state."""
        self._load = None
        engine = self.engine
        for req in list(self.in_flight.values()):
            if req.request_id in engine.requests and not req.is_finished:
                engine.abort(req.request_id)
        self.pending.clear()
        self.in_flight.clear()

    def cached_prefix_tokens(self, probe: Request) -> int:
        """Tokens of `probe`'s prompt this instance's prefix cache holds (a request that is in
        no engine). No state change."""
        return self.engine.kv.match_prefix(probe).num_tokens

    def _remaining(self, r: Request) -> int:
        prompt_left = max(0, r.num_prompt_tokens - r.num_computed_tokens)
        if self.role is Role.PREFILL:
            return prompt_left + (0 if r.output_token_ids else 1)
        return prompt_left + max(0, r.sampling_params.max_tokens - r.num_output_tokens)

    # ---- changes -------------------------------------------------------------------------
    def add(self, request_id: str | None, prompt: Sequence[int], params: SamplingParams,
            arrival: float, w: WorkloadRequest) -> Request:
        """Submit a routed request with `w`'s metadata (jumping an idle instance's clock to
        its arrival). Changes state."""
        self._load = None
        engine = self.engine
        if not engine.has_unfinished():
            engine.clock.sleep_until(arrival)
        req = engine.add_request(prompt, params, request_id, arrival, w.priority,
                                 w.expected_output_len, w.client_id, w.deadline_ms,
                                 w.slo_class)
        self.in_flight[req.request_id] = req
        self.num_routed += 1
        return req

    def step(self) -> None:
        """Admit arrived KV transfers, then run one engine step (its tokens counted by the
        transfers' policy, `ArrivedTransfers.served`). Changes state."""
        self._load = None
        if self._arrived:
            self.admit_pending()
        clock = self.engine.clock
        if clock is not self._clock:  # NOTE: an ABC's isinstance is Python code: once a clock
            self._clock = clock
            self._timed = clock if isinstance(clock, InstanceClock) else None
        timed = self._timed
        if timed is not None:
            timed.resume()
        t0 = clock.now()
        engine = self.engine
        steps = engine.step_stats
        held = len(steps)
        try:
            served = engine.step()
        finally:
            if timed is not None:
                timed.pause()
            self._busy_time += clock.now() - t0
        if self.index and len(steps) > held:  # NOTE: the step's record names its instance
            steps[-1].instance = self.index
        if self.pending.queue is not None:  # NOTE: transfers came here: its policy counts
            self.pending.served(served)

    def receive(self, transfer: KVTransfer) -> None:
        """A transfer's KV has arrived here: queue it for a seat. Changes state."""
        self._load = None
        if not self.engine.has_unfinished():
            self.engine.clock.sleep_until(transfer.ready_time)
        self.pending.add(transfer)
        self.in_flight[transfer.request.request_id] = transfer.request
        self.num_transfers_in += 1
        self.admit_pending()

    def admit_pending(self) -> None:
        """Move arrived transfers into the engine in the order of its queue policy while seats
        and KV allow (`ArrivedTransfers.admit`); one that cannot fit even an idle instance is
        rejected. Changes state."""
        if self.pending:
            self._load = None
            self.pending.admit(self.now())

    def take_done(self) -> list[Request]:
        """Requests routed here that ended here (finished, rejected, aborted), forgotten.
        Changes state.

        NOTE: what is in flight here is pending, unfinished in the engine, or ended; the count
        of ended ones is O(1), the last plan is scanned for them when some ended, and
        everything only when the plan does not hold them all (an expired or rejected one)."""
        in_flight = self.in_flight
        if self._counted:
            sched = self.engine.scheduler
            ended = (len(in_flight) - len(self._arrived) - len(sched.running)
                     - len(sched.waiting))
            if ended == 0:
                return []
            self._load = None
            plan = self.engine.last_plan
            if plan is not None:
                done = [r for r in plan.requests()  # NOTE: `is_finished` inline
                        if r.status not in _LIVE and r.request_id in in_flight]
                if len(done) == ended:
                    for r in done:
                        del in_flight[r.request_id]
                    return done
        done = [r for r in in_flight.values() if r.is_finished]
        for r in done:
            del in_flight[r.request_id]
        if done:
            self._load = None
        return done

    def take_prefilled(self) -> list[tuple[Request, int, list | None]]:
        """Prefill role: requests whose first token is out and that go on to a decode
        instance, taken off this engine with their KV. Changes state.

        Returns:
            (request, prompt tokens whose KV moves, the KV or None) per request.
        """
        out = []
        self._load = None
        for r in list(self.in_flight.values()):
            if r.output_token_ids and not r.is_finished:
                num_tokens, data = take_prefilled(self.engine, r)
                del self.in_flight[r.request_id]
                out.append((r, num_tokens, data))
        return out

    def record_transfer_out(self, transfer: KVTransfer) -> None:
        self.num_transfers_out += 1
        self.transfer_bytes_out += transfer.num_bytes
        self._transfer_time_sum += transfer.ready_time - transfer.start_time

    def summary(self) -> InstanceSummary:
        """The instance over its engine's life (every run on it). No state change."""
        c = self.engine.counters()
        peak = max(self.drained_kv_peak,
                   max((s.kv_used_blocks for s in self.engine.step_stats), default=0))
        return InstanceSummary(
            index=self.index,
            role=self.role.value,
            num_routed=self.num_routed,
            num_steps=c.num_steps,
            busy_time_s=self._busy_time,
            num_preemptions=c.num_preemptions,
            num_swaps=c.num_swaps,
            num_prefix_hit_tokens=c.num_prefix_hit_tokens,
            num_prefix_query_tokens=c.num_prefix_query_tokens,
            num_kv_blocks=c.num_kv_blocks,
            peak_kv_used_blocks=peak,
            peak_kv_usage_pct=100.0 * peak / c.num_kv_blocks if c.num_kv_blocks else 0.0,
            num_transfers_out=self.num_transfers_out,
            num_transfers_in=self.num_transfers_in,
            transfer_bytes_out=self.transfer_bytes_out,
            mean_transfer_time_ms=(1000.0 * self._transfer_time_sum / self.num_transfers_out
                                   if self.num_transfers_out else 0.0),
        )

    def check_integrity(self) -> None:
        """Raise AssertionError if the engine's state or this instance's books disagree."""
        self.engine.check_integrity()
        kept = self._load
        if kept is not None:
            self._load = None
            fresh = self.load()
            self._load = kept
            assert fresh == kept, f"instance {self.index} kept the load {kept} but has {fresh}"
        for rid, r in self.in_flight.items():
            assert r.request_id == rid, f"instance {self.index} files {r.request_id} as {rid}"
        self.pending.check_integrity()
        for t in self.pending:
            r = t.request
            assert r.request_id not in self.engine.requests and r.status is not \
                RequestStatus.RUNNING, f"{r.request_id} both in the engine and pending a seat"
