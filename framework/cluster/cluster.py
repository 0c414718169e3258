"""N engine instances on one virtual clock behind a router, optionally split into prefill and
decode pools with KV transfer between them (DistServe / Splitwise)."""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field
from typing import Any

from schedlab import registry
from schedlab.cluster.clock import InstanceClock
from schedlab.cluster.config import ClusterConfig
from schedlab.cluster.instance import Instance, InstanceSummary, Role
from schedlab.cluster.router import Router
from schedlab.cluster.transfer import KVTransfer
from schedlab.config import EngineConfig
from schedlab.engine import Engine
from schedlab.executor import VirtualClock
from schedlab.request import Request, RequestStatus, SamplingParams
from schedlab.runs.distributions import WorkloadRequest
from schedlab.runs.driver import RunResult

#: consecutive steps without progress before the cluster gives up
_MAX_STALLED_STEPS = 1000


@dataclass(slots=True)
class ClusterRunResult:
    """A cluster run: the whole cluster as one `RunResult` (every request, every instance's
    steps) plus each instance's share."""

    run: RunResult
    instances: list[InstanceSummary]
    router: str
    disaggregated: bool
    extra: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        """results.json's `cluster` entry."""
        from dataclasses import asdict

        return {"router": self.router, "num_instances": len(self.instances),
                "disaggregated": self.disaggregated,
                "instances": [asdict(s) for s in self.instances], **self.extra}


def build_router(config: ClusterConfig) -> Router:
    """The configured router, built with its options.

    Raises:
        PluginError: an unknown router name.
        ConfigError: options the router does not take, or out of range.
    """
    return registry.build(registry.resolve("router", config.router, config.router_options))


class Cluster:
    """Instances that run in parallel, simulated one step at a time on one timeline.

    NOTE: a discrete-event loop. Each instance has its own clock; the cluster always steps
    the busy instance whose clock is furthest behind, routes an arrival (or delivers a KV
    transfer) once every busy instance has reached its time, and jumps an idle instance's
    clock forward when work reaches it. Real executors get an `InstanceClock` each, which
    counts only that instance's own steps, so instances stepped one after another in one
    process behave as if they ran side by side.

    Args:
        config: instance counts, router, KV link.
        engine_config: every instance's engine.
        executor_cls: an executor class for every instance (tests), as `Engine` takes.

    Raises:
        ConfigError, PluginError: a bad value or an unknown plugin.
    """

    def __init__(self, config: ClusterConfig, engine_config: EngineConfig,
                 executor_cls: type | None = None) -> None:
        self.config = config
        self.engine_config = engine_config
        self.instances = self._build_instances(executor_cls)
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
        #: the current run's submitted requests, in workload order (None: not yet arrived)
        self._submitted: list[Request | None] = []

    def _build_instances(self, executor_cls: type | None) -> list[Instance]:
        cfg = self.config
        roles = ([Role.PREFILL] * cfg.prefill_instances + [Role.DECODE] * cfg.decode_instances
                 if cfg.disaggregated else [Role.MIXED] * cfg.total_instances)
        first = Engine(self.engine_config, executor_cls)
        # a simulating executor keeps its own virtual time; a real one gets a clock per
        # instance that counts only that instance's steps
        real = not isinstance(first.clock, VirtualClock)
        if real:
            first.set_clock(InstanceClock(self.config.clock))
        engines = [first] + [
            Engine(self.engine_config, executor_cls,
                   clock=InstanceClock(self.config.clock) if real else None)
            for _ in roles[1:]]
        return [Instance(i, e, r) for i, (e, r) in enumerate(zip(engines, roles, strict=True))]

    # ---- the run -------------------------------------------------------------------------
    def run(self, workload: list[WorkloadRequest], *, temperature: float = 0.0,
            ignore_eos: bool = True, check: bool = False) -> ClusterRunResult:
        """Release the workload at its arrival times (cluster time starts at 0), route each
        request, and step the instances until every request has ended.

        Args:
            workload: the requests, `arrival_s` from the start.
            temperature: every request's sampling temperature (0: greedy).
            ignore_eos: generate exactly `max_tokens` per request.
            check: run `check_integrity()` after every step (tests).

        Returns:
            The run, every request finished or rejected, with per-instance summaries.
        """
        order = sorted(range(len(workload)), key=lambda i: (workload[i].arrival_s, i))
        submitted: list[Request | None] = [None] * len(workload)
        self._submitted = submitted
        pos = 0
        stalled = 0
        while pos < len(order) or self._transfers or any(i.has_work() for i in self.instances):
            busy = [i for i in self.instances if i.is_busy()]
            t_busy = min((i.now() for i in busy), default=float("inf"))
            t_arrival = workload[order[pos]].arrival_s if pos < len(order) else float("inf")
            t_transfer = self._transfers[0][0] if self._transfers else float("inf")
            if t_arrival <= t_busy and t_arrival <= t_transfer and pos < len(order):
                k = order[pos]
                inst, submitted[k] = self._route(k, workload[k], temperature, ignore_eos)
                pos += 1
                self._collect(inst)
                continue
            if self._transfers and t_transfer <= t_busy:
                _, _, t = heapq.heappop(self._transfers)
                dst = self.instances[t.dst]
                dst.receive(t)
                self._collect(dst)
                continue
            if not busy:  # only pending transfers that wait for nothing: admit or reject
                for inst in self.instances:
                    inst.admit_pending()
                    self._collect(inst)
                continue
            inst = min(busy, key=lambda i: (i.now(), i.index))
            steps = inst.engine.counters().num_steps
            inst.step()
            progressed = self._collect(inst)
            if check:
                self.check_integrity()
            if progressed or inst.engine.counters().num_steps > steps:
                stalled = 0
            else:
                stalled += 1
                if stalled > _MAX_STALLED_STEPS:
                    raise RuntimeError(f"instance {inst.index} made no progress in {stalled} "
                                       f"steps (scheduler {self.engine_config.scheduler!r})")
        return self._result([r for r in submitted if r is not None])

    def _route(self, k: int, w: WorkloadRequest, temperature: float,
               ignore_eos: bool) -> tuple[Instance, Request]:
        params = SamplingParams(temperature=temperature, max_tokens=w.max_tokens,
                                ignore_eos=ignore_eos)
        probe = Request(request_id=str(k), prompt_token_ids=list(w.prompt_token_ids),
                        sampling_params=params, arrival_time=w.arrival_s, priority=w.priority,
                        client_id=w.client_id, deadline_ms=w.deadline_ms,
                        slo_class=w.slo_class)
        pool = self.entry
        use_prefix = self.router.uses_prefix
        loads = [inst.load(inst.cached_prefix_tokens(probe) if use_prefix else 0)
                 for inst in pool]
        loads = [_reindex(x, j) for j, x in enumerate(loads)]
        j = self._checked(self.router, self.router.select(probe, loads), len(pool))
        inst = pool[j]
        req = inst.add(str(k), probe.prompt_token_ids, params, w.arrival_s,
                       priority=w.priority, expected_output_len=w.expected_output_len,
                       client_id=w.client_id, deadline_ms=w.deadline_ms,
                       slo_class=w.slo_class)
        self.router.on_routed(req, j)
        return inst, req

    def _checked(self, router: Router, j: object, n: int) -> int:
        if isinstance(j, bool) or not isinstance(j, int) or not 0 <= j < n:
            raise registry.PluginError(
                f"router {type(router).__name__}.select returned {j!r}; it must return an "
                f"instance index in [0, {n})")
        return j

    def _collect(self, inst: Instance) -> bool:
        """After an instance changed: hand prefilled requests to the decode pool and tell the
        routers what ended. Returns whether anything moved."""
        moved = False
        if inst.role is Role.PREFILL:
            for req, num_tokens, data in inst.take_prefilled():
                self._start_transfer(inst, req, num_tokens, data)
                self.router.on_finished(req, self.entry.index(inst))
                moved = True
        for req in inst.take_done():
            moved = True
            if inst.role is Role.DECODE:
                assert self.decode_router is not None, "a decode pool comes with its router"
                self.decode_router.on_finished(req, self.decode.index(inst))
            else:
                self.router.on_finished(req, self.entry.index(inst))
        return moved

    def _start_transfer(self, src: Instance, req: Request, num_tokens: int,
                        data: list | None) -> None:
        assert self.decode_router is not None
        loads = [_reindex(d.load(), j) for j, d in enumerate(self.decode)]
        j = self._checked(self.decode_router, self.decode_router.select(req, loads),
                          len(self.decode))
        dst = self.decode[j]
        self.decode_router.on_routed(req, j)
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
            for req in list(inst.in_flight.values()):
                if req.request_id in inst.engine.requests and not req.is_finished:
                    inst.engine.abort(req.request_id)
            inst.pending.clear()
            inst.in_flight.clear()
        now = max(i.now() for i in self.instances)
        for req in (r for r in self._submitted if r is not None and not r.is_finished):
            req.end(RequestStatus.FINISHED_ABORTED, now)  # in transfer or waiting for a seat
        self._transfers.clear()
        return self._result([r for r in self._submitted if r is not None])

    def _result(self, requests: list[Request]) -> ClusterRunResult:
        engines = [i.engine for i in self.instances]
        counters = [e.counters() for e in engines]
        steps = sorted((s for e in engines for s in e.step_stats), key=lambda s: s.time)
        ends = [r.metrics.finished_time for r in requests if r.metrics.finished_time is not None]
        hits = sum(c.num_prefix_hit_tokens for c in counters)
        queried = sum(c.num_prefix_query_tokens for c in counters)
        run = RunResult(
            requests=requests,
            duration_s=max(ends, default=0.0),
            step_stats=steps,
            num_preemptions=sum(c.num_preemptions for c in counters),
            prefix_hit_rate=hits / queried if queried else 0.0,
            start_time=0.0,
            num_kv_blocks=sum(c.num_kv_blocks for c in counters),
            block_size=self.engine_config.block_size,
            num_prefix_hit_tokens=hits,
            num_swaps=sum(c.num_swaps for c in counters),
        )
        extra: dict[str, Any] = {}
        if self.config.disaggregated:
            extra = {"prefill_instances": self.config.prefill_instances,
                     "decode_instances": self.config.decode_instances,
                     "link_bandwidth_bytes_per_s": self.config.bandwidth_bytes_per_s,
                     "link_latency_s": float(self.config.link_latency)}
        return ClusterRunResult(run, [i.summary() for i in self.instances], self.router_name,
                                self.config.disaggregated, extra)

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


def _reindex(load, j: int):
    """The load with its index in the router's pool (decode pools start at 0)."""
    if load.index == j:
        return load
    from dataclasses import replace

    return replace(load, index=j)
