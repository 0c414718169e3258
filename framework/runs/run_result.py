"""What a run leaves behind for metrics, plots and reports (`schedlab run`, a cluster,
`LLM.generate`, `bench serve`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from schedlab.request import Request
from schedlab.runs.request_stats import RequestStats
from schedlab.stats import StepStats, StepTotals


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
        num_prefix_hit_tokens: prompt tokens served from the prefix cache.
        num_swaps: see above.
        kv_used_blocks: KV blocks in use in the whole cluster (every instance) after each
            step of `step_stats`; empty: each step's own `kv_used_blocks` (one engine).
        num_running: requests running in the whole cluster after each step; empty: each
            step's own `num_running` (one engine).
        stats: a streaming run's (`save_detailed=False`): what was kept of each request as it
            ended, `requests` then empty; None: `requests` holds them all.
        step_totals: what the engine metrics read of its steps, counted as they were taken
            from the engines (a streaming run's: `step_stats`, `kv_used_blocks` and
            `num_running` then empty) or handed to steps.csv as the run went (a detailed
            `schedlab run`'s: `step_stats` holds them all too); None: counted from
            `step_stats`, which holds them all.
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
    kv_used_blocks: list[int] = field(default_factory=list)
    num_running: list[int] = field(default_factory=list)
    stats: RequestStats | None = None
    step_totals: StepTotals | None = None
