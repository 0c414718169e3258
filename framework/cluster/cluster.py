"""1..N engine instances on one timeline behind a router, optionally split into prefill and
decode pools with KV transfer between them (DistServe / Splitwise). The run loop that drives
them is `schedlab.runs.driver.run_workload`."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from schedlab import registry
from schedlab.clock import InstanceClock, VirtualClock
from schedlab.cluster.config import ClusterConfig
from schedlab.cluster.instance import Instance, Role
from schedlab.cluster.record import ClusterRunResult, RunRecord, StepsOut, StepStream
from schedlab.cluster.router import Router
from schedlab.cluster.routing import Loads, build_router, choose, reindex, tell
from schedlab.cluster.transfer import KVTransfer
from schedlab.config import EngineConfig
from schedlab.engine import Engine
from schedlab.request import Request, RequestStatus, SamplingParams
from schedlab.runs.distributions import WorkloadRequest
from schedlab.runs.run_result import RunResult

_INF = float("inf")


class Cluster:
    """Instances that run in parallel on one timeline, behind a router: the topology the run
    loop (`schedlab.cluster.loop`) drives, one instance or many.

    NOTE: each instance has its own clock; the run loop always steps the busy instance whose
    clock is furthest behind, routes a release (or delivers a KV transfer) once every busy
    instance has reached its time, and an idle instance's clock jumps forward when work
    reaches it. Real executors in a cluster of more than one get an `InstanceClock` each,
    which counts only that instance's own steps, so instances stepped one after another in one
    process behave as if they ran side by side; a single instance keeps its engine's clock.

    Args:
        config: instance counts, router, KV link.
        engine_config: every instance's engine.
        executor_cls: an executor class for every instance (tests), as `Engine` takes.

    Raises:
        ConfigError, PluginError: a bad value or an unknown plugin.
    """

    def __init__(self, config: ClusterConfig, engine_config: EngineConfig,
                 executor_cls: type | None = None) -> None:
        self._setup(config, engine_config, self._build_instances(config, engine_config,
                                                                 executor_cls))

    @classmethod
    def around(cls, engine: Engine) -> Cluster:
        """A cluster of one instance over an engine already built (`schedlab run`'s engine,
        `LLM.generate`'s): the same run loop as any cluster, on the engine's own clock."""
        self = cls.__new__(cls)
        self._setup(ClusterConfig(), engine.config, [Instance(0, engine, Role.MIXED)])
        return self

    def _setup(self, config: ClusterConfig, engine_config: EngineConfig,
               instances: list[Instance]) -> None:
        self.config = config
        #: the router as messages name it (`'round_robin'`, `'my_module:MyRouter'`)
        self.router_label = registry.describe(config.router)
        self.engine_config = engine_config
        self.instances = instances
        if config.disaggregated:
            p = config.prefill_instances
            self.entry = self.instances[:p]
            self.decode = self.instances[p:]
        else:
            self.entry, self.decode = self.instances, []
        self.router = build_router(config)
        self.router.bind(len(self.entry))
        self.decode_router: Router | None = None
        if self.decode:
            self.decode_router = build_router(config)
            self.decode_router.bind(len(self.decode))
        self.router_name = registry.describe(config.router).strip("'")
        self._transfers: list[tuple[float, int, KVTransfer]] = []
        self._seq = itertools.count()
        self._ids: Iterator[int] = itertools.count()
        #: the current run: its start and the requests routed (`begin_run` starts one)
        self._record = RunRecord()

    @staticmethod
    def _build_instances(config: ClusterConfig, engine_config: EngineConfig,
                         executor_cls: type | None) -> list[Instance]:
        roles = ([Role.PREFILL] * config.prefill_instances + [Role.DECODE] *
                 config.decode_instances if config.disaggregated
                 else [Role.MIXED] * config.total_instances)
        first = Engine(engine_config, executor_cls)
        # a simulating executor keeps its own virtual time; real ones get a clock per
        # instance that counts only that instance's steps (one instance: the engine's own)
        timed = len(roles) > 1 and not isinstance(first.clock, VirtualClock)
        if timed:
            first.set_clock(InstanceClock(config.clock))
        engines = [first] + [
            Engine(engine_config, executor_cls,
                   clock=InstanceClock(config.clock) if timed else None)
            for _ in roles[1:]]
        return [Instance(i, e, r) for i, (e, r) in enumerate(zip(engines, roles, strict=True))]

    # ---- what the run loop calls -------------------------------------------------------------
    def run(self, workload: list[WorkloadRequest], *, temperature: float = 0.0,
            ignore_eos: bool = True, max_concurrency: int | None = None,
            check: bool = False) -> ClusterRunResult:
        """The run loop over this cluster (`run_workload`), with each instance's share.

        Args:
            workload: the requests, `arrival_s` from the start.
            temperature: every request's sampling temperature (0: greedy).
            ignore_eos: generate exactly `max_tokens` per request.
            max_concurrency: at most this many requests in flight in the whole cluster.
            check: run `check_integrity()` after every step (tests).
        """
        from schedlab.cluster.loop import RunLoop, WorkloadParams

        workload = list(workload)
        params = WorkloadParams(workload, temperature, ignore_eos)
        RunLoop(self, workload, params, None, max_concurrency, check).run()
        return self.result_with_summary(self.result(max_concurrency))

    def begin_run(self, stream: int | None = None) -> float:
        """Start a run: forget the last run's requests, note each engine's counters. Returns
        the run's start time (the latest instance clock). Changes state.

        Args:
            stream: the workload's size, for a streaming run (ended requests are `retire`d).
        """
        self._record = RunRecord.begin(self.instances, stream)
        return self._record.start

    @property
    def run_record(self) -> RunRecord:
        """The current run's books (`begin_run` starts them): its start, the requests routed,
        and streaming, the stats filed and the steps taken."""
        return self._record

    def take_ids(self, n: int) -> range:
        """The ids the next `n` requests routed without one would get (the counter moves past
        them). Changes state."""
        first = next(self._ids)
        self._ids = itertools.count(first + n)
        return range(first, first + n)

    def use_ids(self, ids: Iterable[int]) -> None:
        """Number the next requests routed without an id from `ids`, in order, instead of the
        counter (a split run's worker: the ids its requests get in one process). Changes
        state."""
        self._ids = iter(ids)

    def stream_steps(self, out: StepsOut) -> None:
        """Streaming: hand this run's step records to `out` as they are taken, a list at a
        time in the run's step order (`RunRecord.result`'s). Changes state."""
        assert self._record.steps is not None, "stream_steps() is for a streaming run"
        self._record.steps.out = out

    def tap_steps(self, out: StepsOut) -> None:
        """A detailed run: hand its step records to `out` as the run goes as well, a list at
        a time in the run's step order, the engines keeping them (`finish_tap` hands the rest).
        Changes state."""
        assert self._record.steps is None, "tap_steps() is for a detailed run"
        tap = self._record.tap = StepStream(self.instances, self._record.first_step, keep=True)
        tap.out = out

    def finish_tap(self, run: RunResult) -> bool:
        """A detailed run has ended (`run`, its result): hand `tap_steps`' `out` the steps it
        has not taken yet, and give `run` the totals counted as they were handed on
        (`RunResult.step_totals`, what the engine metrics read). Returns False, changing
        nothing, when the run was not tapped. Changes state (and `run`)."""
        tap = self._record.tap
        if tap is None:
            return False
        self._record.tap = None
        tap.finish(run)
        return True

    def retire(self, k: int, inst: Instance, req: Request) -> None:
        """Streaming: workload request `k` ended for good on `inst`; keep its stats, and
        nothing of it here or in the engine. Changes state."""
        self._record.retire(k)
        engine = inst.engine
        if engine.requests.get(req.request_id) is req:
            engine.forget(req.request_id)

    def is_busy(self) -> list[Instance]:
        """The instances with a request to step. No state change."""
        return [i for i in self.instances if i.is_busy()]

    def has_pending(self) -> bool:
        """Whether a transfer waits for a seat on a decode instance. No state change."""
        return any(i.pending for i in self.instances)

    def next_transfer_time(self) -> float:
        """When the next KV transfer in flight arrives (inf: none). No state change."""
        return self._transfers[0][0] if self._transfers else _INF

    def now(self) -> float:
        """The latest instance clock. No state change."""
        return max(i.now() for i in self.instances)

    def route(self, k: int, prompt: Sequence[int], params: SamplingParams, arrival: float,
              w: WorkloadRequest, request_id: str | None = None) -> tuple[Instance, Request]:
        """Route workload request `k` (its prompt, and `w`'s metadata) to an entry instance and
        submit it there; with one entry instance the router is not asked. Changes state.

        Args:
            request_id: the request's id (None: the engine's counter, or with several
                instances the cluster's).
        """
        if request_id is None and len(self.instances) > 1:
            request_id = str(next(self._ids))  # unique across instances (engines count apart)
        pool = self.entry
        if len(pool) == 1:
            j = 0
        else:
            if not isinstance(prompt, list):
                prompt = list(prompt)
            probe = Request(request_id=request_id or "?", prompt_token_ids=prompt,
                            sampling_params=params, arrival_time=arrival, priority=w.priority,
                            client_id=w.client_id, deadline_ms=w.deadline_ms,
                            slo_class=w.slo_class, expected_output_len=w.expected_output_len)
            loads = Loads(pool, probe if self.router.uses_prefix else None)
            j = choose(self.router, self.router_label, probe, loads)
        inst = pool[j]
        req = inst.add(request_id, prompt, params, arrival, w)
        tell(self.router, self.router_label, "on_routed", req, j)
        self._record.routed[k] = req
        return inst, req

    def step(self, inst: Instance, check: bool = False) -> bool:
        """Step one instance. Returns whether it ran a step. Changes state."""
        inst.step()
        rec = self._record
        steps = rec.steps if rec.steps is not None else rec.tap
        if steps is not None:  # the records taken (streaming) or handed on as the run goes
            steps.stepped()
        if check:
            self.check_integrity()
        plan = inst.engine.last_plan
        return plan is not None and not plan.is_empty

    def deliver_next(self) -> Instance:
        """The earliest KV transfer has arrived: queue it on its decode instance. Returns that
        instance. Changes state."""
        _, _, t = heapq.heappop(self._transfers)
        dst = self.instances[t.dst]
        dst.receive(t)
        return dst

    def admit_pending(self) -> None:
        """Nothing is busy: admit (or reject) the transfers waiting for a seat. Changes state."""
        for inst in self.instances:
            inst.admit_pending()

    def collect(self, inst: Instance) -> tuple[list[Request], bool]:
        """After an instance changed: hand prefilled requests to the decode pool and tell the
        routers what ended. Changes state.

        Returns:
            The requests that ended for good there (finished, rejected, aborted), and whether
            anything moved (ended or went to a decode instance).
        """
        moved = False
        role = inst.role
        if role is Role.PREFILL:
            for req, num_tokens, data in inst.take_prefilled():
                self._start_transfer(inst, req, num_tokens, data)
                tell(self.router, self.router_label, "on_finished", req, inst.index)
                moved = True
        done = inst.take_done()
        if not done:
            return done, moved
        # NOTE: an instance's position in its pool: the entry pool is the first instances
        if role is Role.DECODE:
            assert self.decode_router is not None, "a decode pool comes with its router"
            router, j = self.decode_router, inst.index - len(self.entry)
        else:
            router, j = self.router, inst.index
        for req in done:
            tell(router, self.router_label, "on_finished", req, j)
        return done, True

    def _start_transfer(self, src: Instance, req: Request, num_tokens: int,
                        data: list | None) -> None:
        assert self.decode_router is not None
        loads = [reindex(d.load(), j) for j, d in enumerate(self.decode)]
        j = choose(self.decode_router, self.router_label, req, loads)
        dst = self.decode[j]
        tell(self.decode_router, self.router_label, "on_routed", req, j)
        spec = dst.engine.kv_spec
        num_blocks = -(-num_tokens // spec.block_size)  # whole blocks move, as paged KV does
        num_bytes = num_blocks * spec.bytes_per_block
        start = src.now()
        t = KVTransfer(req, src.index, dst.index, num_tokens, num_bytes, start,
                       start + self.config.transfer_time(num_bytes), data)
        src.record_transfer_out(t)
        heapq.heappush(self._transfers, (t.ready_time, next(self._seq), t))

    def interrupt(self) -> ClusterRunResult:
        """After a run was cut short (Ctrl-C): abort every request still in flight, on an
        instance, waiting for a decode seat or in transfer, and return the run over the
        requests submitted so far. Changes state."""
        for inst in self.instances:
            inst.abort_all()
        now = self.now()
        for req in self._record.routed.values():
            if not req.is_finished:  # in transfer or waiting for a seat
                req.end(RequestStatus.FINISHED_ABORTED, now)
        self._transfers.clear()
        return self.result_with_summary(self.result())

    # ---- results -------------------------------------------------------------------------
    def result(self, max_concurrency: int | None = None) -> RunResult:
        """The run since `begin_run` as one `RunResult` (see `RunRecord.result`). No state
        change."""
        return self._record.result(self.instances, self.engine_config.block_size,
                                   max_concurrency)

    def result_with_summary(self, run: RunResult) -> ClusterRunResult:
        """`run` with each instance's share (results.json's `cluster` entry)."""
        extra: dict[str, Any] = {}
        if self.config.disaggregated:
            extra = {"prefill_instances": self.config.prefill_instances,
                     "decode_instances": self.config.decode_instances,
                     "link_bandwidth_bytes_per_s": self.config.bandwidth_bytes_per_s,
                     "link_latency_s": float(self.config.link_latency)}
        return ClusterRunResult(run, [i.summary() for i in self.instances],
                                self.router_name, self.config.disaggregated, extra)

    def check_integrity(self) -> None:
        """Raise AssertionError if an instance, a router or the transfers in flight disagree
        (a request in two places, say). No state change."""
        seen: dict[int, str] = {}
        for inst in self.instances:
            inst.check_integrity()
            for r in inst.in_flight.values():
                other = seen.setdefault(id(r), f"instance {inst.index}")
                assert other == f"instance {inst.index}", (
                    f"request {r.request_id} is in flight on {other} and instance {inst.index}")
        for _, _, t in self._transfers:
            assert id(t.request) not in seen, f"{t.request.request_id} in transfer and on an " \
                "instance"
        self.router.check_integrity()
        if self.decode_router is not None:
            self.decode_router.check_integrity()
