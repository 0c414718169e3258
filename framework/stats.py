"""The engine's telemetry: a `StepStats` per step (the raw series behind plots and W&B) and the
cumulative `EngineCounters`, and the functions that read them off the scheduler and the KV
manager (neither changes state)."""

from __future__ import annotations

from dataclasses import dataclass
from operator import attrgetter
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from schedlab.executor import ExecutorOutput
    from schedlab.kv_manager import KVCacheManager
    from schedlab.plan import PlanTotals, SchedulerOutput
    from schedlab.scheduler import Scheduler


@dataclass(slots=True)
class StepStats:
    """One engine step, as seen by the engine."""

    step: int
    time: float  # engine clock at the end of the step (s)
    step_time: float  # duration of the forward pass (or its cost model) (s)
    num_running: int
    num_waiting: int
    num_scheduled_tokens: int
    num_prefill_tokens: int
    num_decode_tokens: int
    num_scheduled_seqs: int
    num_preempted: int
    kv_used_blocks: int
    kv_free_blocks: int
    kv_cached_blocks: int
    kv_reserved_tokens: int
    kv_used_tokens: int
    framework_time: float = 0.0  # schedule + update_from_output wall time (s)
    # host wall time per phase (s); the executor's four are 0 under a simulated executor
    schedule_time: float = 0.0  # scheduler.schedule()
    prepare_time: float = 0.0  # batch building (and swaps) in the executor
    forward_time: float = 0.0  # launching the forward pass (the whole forward on a CPU)
    device_wait_time: float = 0.0  # waiting for the GPU to finish the forward
    sample_time: float = 0.0  # sampling and reading tokens back
    update_time: float = 0.0  # scheduler.update_from_output()


#: the per-step phases of `StepStats`, in step order, as metric-name stems
STEP_PHASES = ("schedule", "prepare", "forward", "device_wait", "sample", "update")


def step_phase_metrics(steps: list[StepStats]) -> dict[str, float]:
    """Mean host milliseconds per step of each phase: `mean_<phase>_time_ms` for every
    `STEP_PHASES` entry (0.0 without steps)."""
    n = len(steps)
    # NOTE: one C-level getter per phase (a run has a record per step)
    return {f"mean_{p}_time_ms": 1000.0 * sum(map(attrgetter(f"{p}_time"), steps)) / n
            if n else 0.0 for p in STEP_PHASES}


@dataclass(frozen=True, slots=True)
class EngineCounters:
    """Cumulative counters since the engine was built, and its load now (`Engine.counters()`).

    A run's share is the difference of two snapshots.
    """

    num_steps: int
    num_running: int
    num_waiting: int
    num_preemptions: int  # recompute and swap
    num_swaps: int  # preemptions whose KV went to host memory
    num_prefix_hit_tokens: int  # prompt tokens served from the prefix cache
    num_prefix_query_tokens: int  # prompt tokens looked up in the prefix cache
    num_kv_blocks: int
    kv_used_blocks: int
    kv_free_blocks: int

    @property
    def kv_usage(self) -> float:
        """Fraction of the KV pool held by live requests."""
        return self.kv_used_blocks / self.num_kv_blocks if self.num_kv_blocks else 0.0


def step_stats(step: int, plan: SchedulerOutput, totals: PlanTotals, result: ExecutorOutput,
               now: float, t_sched: float, t_update: float, scheduler: Scheduler,
               kv: KVCacheManager) -> StepStats:
    """The record of step number `step`, which ran `plan` and ended at `now` (engine clock).

    Args:
        totals: the plan's aggregates (`SchedulerOutput.totals`, from `check_plan`).
        t_sched: seconds spent planning the step; t_update: applying its output.
    """
    u = kv.usage()
    num_prefill, num_decode = totals.num_prefill_tokens, totals.num_decode_tokens
    # NOTE: positional, in the field order (once per step; keywords cost twice as much)
    st = StepStats(step, now, result.step_time, len(scheduler.running), len(scheduler.waiting),
                   num_prefill + num_decode, num_prefill, num_decode, totals.num_seqs,
                   len(plan.preempted), u.used_blocks, u.free_blocks, u.cached_blocks,
                   u.reserved_tokens, u.used_tokens, t_sched + t_update, t_sched, 0.0, 0.0, 0.0,
                   0.0, t_update)
    if result.timings is not None:
        tm = result.timings
        st.prepare_time, st.forward_time = tm.prepare, tm.forward
        st.device_wait_time, st.sample_time = tm.device_wait, tm.sample
    return st


def engine_counters(num_steps: int, scheduler: Scheduler, kv: KVCacheManager) -> EngineCounters:
    """Cumulative counters and the current load after `num_steps` steps."""
    s = scheduler
    u = kv.usage()
    # NOTE: positional, in the field order (a router may read it after every step)
    return EngineCounters(num_steps, len(s.running), len(s.waiting), s.num_preemptions,
                          s.num_swaps, kv.num_prefix_hit_tokens, kv.num_prefix_query_tokens,
                          u.num_blocks, u.used_blocks, u.free_blocks)
