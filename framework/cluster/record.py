"""A cluster run's books: what it noted at its start, the requests it routed, and the run they
make (one `RunResult` over every instance, plus each instance's share)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from operator import itemgetter
from typing import Any

from schedlab.cluster.instance import Instance, InstanceSummary
from schedlab.request import Request
from schedlab.runs.request_stats import RequestStats
from schedlab.runs.run_result import RunResult
from schedlab.stats import EngineCounters, StepStats

_TIME = itemgetter(0)


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

    @classmethod
    def begin(cls, instances: Sequence[Instance], stream: int | None = None) -> RunRecord:
        """A run starting now; `stream`: the workload's size, for a streaming run."""
        start = max(i.now() for i in instances)
        return cls(start=start,
                   counters=[i.engine.counters() for i in instances],
                   first_step=[len(i.engine.step_stats) for i in instances],
                   stats=None if stream is None else RequestStats(stream, start))

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
            first = self.first_step[n] if self.first_step else 0
            per_instance.append(e.step_stats[first:])
        # NOTE: one instance: its steps as they are (in time order: an engine's clock only
        # moves forward, by each step's non-negative time), and no cluster-wide series
        steps, cluster_used, cluster_running = (_merged(per_instance) if several
                                                else (per_instance[0], [], []))

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
        )


def _merged(per_instance: list[list[StepStats]]) -> tuple[list[StepStats], list[int], list[int]]:
    """Every instance's steps in time order (ties: the lower instance first, each instance's
    in its order), and the cluster's KV blocks in use and running requests after each."""
    tagged = [(s.time, n, s) for n, steps in enumerate(per_instance) for s in steps]
    tagged.sort(key=_TIME)  # stable: one instance's steps keep their order
    used = [0] * len(per_instance)
    running = [0] * len(per_instance)
    cluster_used, cluster_running = [], []
    total_used = total_running = 0  # NOTE: sums over instances, kept as one changes
    for _, n, s in tagged:
        total_used += s.kv_used_blocks - used[n]
        total_running += s.num_running - running[n]
        used[n], running[n] = s.kv_used_blocks, s.num_running
        cluster_used.append(total_used)
        cluster_running.append(total_running)
    return [s for _, _, s in tagged], cluster_used, cluster_running
