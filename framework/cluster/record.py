"""A cluster run's books: what it noted at its start, the requests it routed, and the run they
make (one `RunResult` over every instance, plus each instance's share)."""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from operator import attrgetter, itemgetter
from typing import Any

from schedlab.cluster.instance import Instance, InstanceSummary
from schedlab.request import Request
from schedlab.runs.interrupt import sigint_deferred
from schedlab.runs.request_stats import RequestStats
from schedlab.runs.run_result import RunResult
from schedlab.stats import EngineCounters, StepStats, StepTotals

_TIME = itemgetter(0)
_STEP_TIME = attrgetter("time")
_KV_USED_BLOCKS = attrgetter("kv_used_blocks")

#: a streaming run takes the step records from its engines every this many steps (cluster
#: wide); it holds about as many at once, plus those an idle instance holds back (see
#: `StepStream`)
DRAIN_STEPS = 4096

#: what a streaming run hands its step records to, a list at a time in the run's step order
StepsOut = Callable[[list[StepStats]], object]


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
        return {"router": self.router, "num_instances": len(self.instances),
                "disaggregated": self.disaggregated,
                "instances": [asdict(s) for s in self.instances], **self.extra}


@dataclass(slots=True)
class RunRecord:
    """One run on a cluster: the start time (the latest instance clock), each engine's
    counters and held step records at the start, and the requests routed by workload index."""

    start: float = 0.0
    counters: list[EngineCounters] = field(default_factory=list)
    #: step records each engine held at the start (not `num_steps`:
    #: `Engine.drain_step_stats` empties the list while the step count goes on)
    first_step: list[int] = field(default_factory=list)
    #: the requests routed (streaming: those not yet retired)
    routed: dict[int, Request] = field(default_factory=dict)
    #: streaming: what is kept of each retired request (None: `routed` keeps them all)
    stats: RequestStats | None = None
    #: streaming: the steps, taken from the engines as the run goes (None: the engines
    #: keep them)
    steps: StepStream | None = None
    #: a detailed run's steps handed on as the run goes, the engines keeping them
    #: (`StepStream` with `keep`; None: none)
    tap: StepStream | None = None

    @classmethod
    def begin(cls, instances: Sequence[Instance], stream: int | None = None) -> RunRecord:
        """A run starting now; `stream`: the workload's size, for a streaming run."""
        start = max(i.now() for i in instances)
        first_step = [len(i.engine.step_stats) for i in instances]
        return cls(start=start,
                   counters=[i.engine.counters() for i in instances],
                   first_step=first_step,
                   stats=None if stream is None else RequestStats(stream, start),
                   steps=None if stream is None else StepStream(instances, first_step))

    def retire(self, k: int) -> None:
        """Streaming: file routed request `k`, ended, and forget it. Changes state."""
        assert self.stats is not None, "retire() is for a streaming run"
        self.stats.add(k, self.routed.pop(k))

    def result(self, instances: Sequence[Instance], block_size: int,
               max_concurrency: int | None = None) -> RunResult:
        """The run as one `RunResult`: every routed request in workload order (streaming: their
        stats), every instance's steps in time order, the counters summed over instances, and
        (several instances) the cluster's KV blocks in use and running requests after each
        step. No state change, except that a streaming run files what is still routed."""
        requests = [self.routed[k] for k in sorted(self.routed)]
        if self.stats is not None:  # streaming: what an interrupt left in flight, ended
            for k, r in zip(sorted(self.routed), requests, strict=True):
                self.stats.add(k, r)
            self.routed.clear()
            requests = []
        several = len(instances) > 1
        counters = []
        per_instance = []
        for n, inst in enumerate(instances):
            e = inst.engine
            c0 = self.counters[n] if self.counters else None
            counters.append((c0, e.counters()))
            if self.steps is None:
                per_instance.append(e.step_stats[self.first_step[n] if self.first_step
                                                 else 0:])
        totals = None
        steps: list[StepStats]
        cluster_used: list[int]
        cluster_running: list[int]
        if self.steps is not None:  # streaming: the steps left, handed on
            self.steps.take(final=True)
            totals = self.steps.totals
            steps, cluster_used, cluster_running = [], [], []
        elif several:
            steps, cluster_used, cluster_running = _merged(per_instance)
        else:
            # NOTE: one instance: its steps as they are (in time order: an engine's clock
            # only moves forward, by each step's non-negative time), no cluster-wide series
            steps, cluster_used, cluster_running = per_instance[0], [], []

        def delta(name: str) -> int:
            return sum(getattr(c1, name) - (getattr(c0, name) if c0 else 0)
                       for c0, c1 in counters)

        hits, queried = delta("num_prefix_hit_tokens"), delta("num_prefix_query_tokens")
        return RunResult(
            requests=requests,
            duration_s=max(i.now() for i in instances) - self.start,
            step_stats=steps,
            num_preemptions=delta("num_preemptions"),
            prefix_hit_rate=hits / queried if queried else 0.0,
            start_time=self.start,
            num_kv_blocks=sum(c1.num_kv_blocks for _, c1 in counters),
            block_size=block_size,
            max_concurrency=max_concurrency,
            num_prefix_hit_tokens=hits,
            num_swaps=delta("num_swaps"),
            kv_used_blocks=cluster_used,
            num_running=cluster_running,
            stats=self.stats,
            step_totals=totals,
        )


def _merged(per_instance: list[list[StepStats]]) -> tuple[list[StepStats], list[int], list[int]]:
    """Every instance's steps in time order (ties: the lower instance first, each instance's
    in its order), and the cluster's KV blocks in use and running requests after each."""
    return _Series(len(per_instance)).merged(per_instance)


class _Series:
    """The cluster's KV blocks in use and running requests after each step, over steps
    merged a batch at a time."""

    def __init__(self, num_instances: int) -> None:
        self.used = [0] * num_instances
        self.running = [0] * num_instances
        self.total_used = self.total_running = 0  # NOTE: sums over instances, kept as one changes

    def merged(self, per_instance: Sequence[Sequence[StepStats]]
               ) -> tuple[list[StepStats], list[int], list[int]]:
        """The steps of `per_instance` in time order (ties: the lower instance first, each
        instance's in its order), and the cluster's series after each. Changes state."""
        tagged = [(s.time, n, s) for n, steps in enumerate(per_instance) for s in steps]
        tagged.sort(key=_TIME)  # stable: one instance's steps keep their order
        used, running = self.used, self.running
        total_used, total_running = self.total_used, self.total_running
        cluster_used, cluster_running = [], []
        for _, n, s in tagged:
            total_used += s.kv_used_blocks - used[n]
            total_running += s.num_running - running[n]
            used[n], running[n] = s.kv_used_blocks, s.num_running
            cluster_used.append(total_used)
            cluster_running.append(total_running)
        self.total_used, self.total_running = total_used, total_running
        return [s for _, _, s in tagged], cluster_used, cluster_running


def drain_records(inst: Any, skip: list[int], n: int) -> list[StepStats]:
    """Instance `n`'s step records taken from its engine (`Engine.drain_step_stats`), their
    KV peak noted on the instance (`drained_kv_peak`), the `skip[n]` it held before the run
    dropped the first time (then 0). Changes state."""
    got = inst.engine.drain_step_stats()
    if got:
        inst.drained_kv_peak = max(inst.drained_kv_peak, max(map(_KV_USED_BLOCKS, got)))
        if skip[n]:
            del got[:skip[n]]
            skip[n] = 0
    return got


class StepStream:
    """A streaming run's steps, taken from the engines as the run goes
    (`Engine.drain_step_stats`, every `DRAIN_STEPS` steps and at the end): counted into
    `totals`, each instance's KV peak noted (`Instance.drained_kv_peak`), handed to `out`
    (`schedlab run`: steps.csv's rows) in the run's step order, then forgotten. With `keep`
    (a detailed run's tap) the engines keep their records and the stream reads past what it
    took, so that steps.csv's writer formats the rows as the run goes; `finish` hands on the
    rest. `handed` counts the records handed on (with `keep`: the first of the run's
    `step_stats`).

    NOTE: the order is the one `_merged` gives the whole run: by time, ties by the lower
    instance, each instance's in its order. An instance's later steps end at or after its
    clock (an engine's clock only moves forward), so a record taken at (time t, instance n)
    is handed on once (t, n) < (clock, index) of every instance; an idle instance's clock
    holds the others' records back until work reaches it or the run ends.

    Args:
        instances: the cluster's.
        skip: the records each engine held before the run (in its KV peak, not handed on).
        keep: read the engines' records without taking them.
    """

    def __init__(self, instances: Sequence[Instance], skip: Sequence[int],
                 keep: bool = False) -> None:
        self.instances = instances
        self.out: StepsOut | None = None
        self.totals = StepTotals()
        self.handed = 0
        self._skip = list(skip)
        #: keep: each engine's first record not read yet (None: the records are drained)
        self._next = list(skip) if keep else None
        self._held: list[list[StepStats]] = [[] for _ in instances]
        self._series = _Series(len(instances)) if len(instances) > 1 else None
        self._steps = 0  # since the last take

    def rebind(self, instances: Sequence[Any]) -> None:
        """Take the records from `instances` instead, one per instance in order, none skipped:
        a split run's stand-ins for instances that step in workers
        (`schedlab.cluster.parallel.WorkerInstance`). Before any record was taken. Changes
        state."""
        assert not self.held() and len(instances) == len(self.instances), "rebind() first"
        self.instances = instances
        self._skip = [0] * len(instances)

    def stepped(self) -> None:
        """An instance ran a step: take the records every `DRAIN_STEPS`. Changes state."""
        self._steps += 1
        if self._steps >= DRAIN_STEPS:
            self.take()

    def held(self) -> int:
        """Step records taken and not yet handed on. No state change."""
        return sum(map(len, self._held))

    def take(self, final: bool = False) -> None:
        """Take every engine's records, hand on those no instance can still precede (`final`:
        all). A Ctrl-C waits for the end (records taken and not handed on would be lost).
        Changes state."""
        with sigint_deferred():
            self._take(final)

    def _take(self, final: bool) -> None:
        self._steps = 0
        held, skip, nxt = self._held, self._skip, self._next
        for n, inst in enumerate(self.instances):
            if nxt is None:
                got = drain_records(inst, skip, n)
            else:
                records = inst.engine.step_stats
                got, nxt[n] = records[nxt[n]:], len(records)
            if not got:
                continue
            if held[n]:
                held[n].extend(got)
            else:
                held[n] = got
        if self._series is None:
            ready, held[0] = held[0], []
            self._hand(ready, [], [])
            return
        if final:
            ready_per = held
            self._held = [[] for _ in held]
        else:
            bound, j = min((inst.now(), n) for n, inst in enumerate(self.instances))
            ready_per = []
            for n, steps in enumerate(held):
                # (t, n) < (bound, j): t <= bound below instance j, t < bound from it on
                cut = (bisect_right if n < j else bisect_left)(steps, bound, key=_STEP_TIME)
                ready_per.append(steps[:cut])
                del steps[:cut]
        self._hand(*self._series.merged(ready_per))

    def _hand(self, steps: list[StepStats], used: list[int], running: list[int]) -> None:
        if not steps:
            return
        self.totals.add(steps, used, running)
        if self.out is not None:
            self.out(steps)
        self.handed += len(steps)

    def finish(self, run: RunResult) -> None:
        """With `keep`: the run has ended (`run`, its result): hand on its steps not handed
        yet and count them, and give `run` the totals (`RunResult.step_totals`). Changes
        state (and `run`)."""
        assert self._next is not None, "finish() is for a stream that keeps the records"
        h = self.handed
        with sigint_deferred():
            self._hand(run.step_stats[h:], run.kv_used_blocks[h:], run.num_running[h:])
        run.step_totals = self.totals
