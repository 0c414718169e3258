"""The engine's telemetry records, read off the scheduler and the KV manager: a `StepStats`
for each step and the cumulative `EngineCounters`. Neither function changes state."""

from __future__ import annotations

from schedlab.executor import ExecutorOutput
from schedlab.kv_manager import KVCacheManager
from schedlab.plan import SchedulerOutput
from schedlab.scheduler import Scheduler
from schedlab.stats import EngineCounters, StepStats


def step_stats(step: int, plan: SchedulerOutput, result: ExecutorOutput, now: float,
               t_sched: float, t_update: float, scheduler: Scheduler,
               kv: KVCacheManager) -> StepStats:
    """The record of step number `step`, which ran `plan` and ended at `now` (engine clock).

    Args:
        t_sched: seconds spent planning the step; t_update: applying its output.
    """
    u = kv.usage()
    num_prefill, num_decode = plan.token_counts()
    st = StepStats(
        step=step,
        time=now,
        step_time=result.step_time,
        num_running=len(scheduler.running),
        num_waiting=len(scheduler.waiting),
        num_scheduled_tokens=num_prefill + num_decode,
        num_prefill_tokens=num_prefill,
        num_decode_tokens=num_decode,
        num_scheduled_seqs=len(plan.scheduled),
        num_preempted=len(plan.preempted),
        kv_used_blocks=u.used_blocks,
        kv_free_blocks=u.free_blocks,
        kv_cached_blocks=u.cached_blocks,
        kv_reserved_tokens=u.reserved_tokens,
        kv_used_tokens=u.used_tokens,
        framework_time=t_sched + t_update,
        schedule_time=t_sched,
        update_time=t_update,
    )
    if result.timings is not None:
        tm = result.timings
        st.prepare_time, st.forward_time = tm.prepare, tm.forward
        st.device_wait_time, st.sample_time = tm.device_wait, tm.sample
    return st


def engine_counters(num_steps: int, scheduler: Scheduler, kv: KVCacheManager) -> EngineCounters:
    """Cumulative counters and the current load after `num_steps` steps."""
    s = scheduler
    u = kv.usage()
    return EngineCounters(
        num_steps=num_steps,
        num_running=len(s.running),
        num_waiting=len(s.waiting),
        num_preemptions=s.num_preemptions,
        num_swaps=s.num_swaps,
        num_prefix_hit_tokens=kv.num_prefix_hit_tokens,
        num_prefix_query_tokens=kv.num_prefix_query_tokens,
        num_kv_blocks=u.num_blocks,
        kv_used_blocks=u.used_blocks,
        kv_free_blocks=u.free_blocks,
    )
