"""The engine's telemetry: a `StepStats` per step (the raw series behind plots and W&B) and the
cumulative `EngineCounters`, and the functions that read them off the scheduler and the KV
manager (neither changes state)."""

from __future__ import annotations

from array import array
from collections.abc import Sequence
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
    instance: int = 0  # the cluster instance that stepped (`Instance.index`; 0: one engine)


#: the per-step phases of `StepStats`, in step order, as metric-name stems
STEP_PHASES = ("schedule", "prepare", "forward", "device_wait", "sample", "update")


def step_phase_metrics(steps: list[StepStats]) -> dict[str, float]:
    """Mean host milliseconds per step of each phase: `mean_<phase>_time_ms` for every
    `STEP_PHASES` entry (0.0 without steps)."""
    return StepTotals.of(steps).phase_metrics()


#: the integer fields whose run sums the engine metrics read
_SUMMED = ("num_scheduled_seqs", "num_waiting", "num_scheduled_tokens", "kv_reserved_tokens",
           "kv_used_tokens")
_GET_SUMMED = tuple(attrgetter(f) for f in _SUMMED)
_GET_PHASES = tuple(attrgetter(f"{p}_time") for p in STEP_PHASES)
_STEP_TIME = attrgetter("step_time")
_FRAMEWORK_TIME = attrgetter("framework_time")
_KV_USED_BLOCKS = attrgetter("kv_used_blocks")
_NUM_RUNNING = attrgetter("num_running")


class StepTotals:
    """What the engine metrics read of a run's steps, taken a chunk at a time in the run's
    step order, so a streaming run need not keep its step records: the count, the integer
    sums and peaks, the host phases' sums, and `step_time` and `framework_time` as float64
    columns (8 bytes a step).

    NOTE: the metrics equal those of the whole list bit for bit: an integer field's sum is
    exact in any order, and its `np.mean` (a float64 sum of integers, exact below 2**53,
    over the count) is that sum over the count; the phase sums are Python's `sum`, in order
    (Python 3.11's is plain left-to-right addition); `np.mean` of a float needs every
    value: those are kept.
    """

    def __init__(self) -> None:
        self.num_steps = 0
        #: `_SUMMED`'s sums, in its order
        self.sums = [0] * len(_SUMMED)
        #: the host phases' sums of seconds, in `STEP_PHASES` order
        self.phase_sums = [0.0] * len(STEP_PHASES)
        self.step_time = array("d")
        self.framework_time = array("d")
        #: KV blocks in use (a cluster's: over every instance) after each step: sum, peak
        self.kv_used_blocks = 0
        self.peak_kv_used_blocks = 0
        #: requests running (a cluster's: over every instance) after each step: sum, peak
        self.num_running = 0
        self.max_num_running = 0

    @classmethod
    def of(cls, steps: Sequence[StepStats], kv_used_blocks: Sequence[int] = (),
           num_running: Sequence[int] = ()) -> StepTotals:
        """The totals of `steps` (see `add`)."""
        t = cls()
        t.add(steps, kv_used_blocks, num_running)
        return t

    def add(self, steps: Sequence[StepStats], kv_used_blocks: Sequence[int] = (),
            num_running: Sequence[int] = ()) -> None:
        """Count the next `steps` of the run. Changes state.

        Args:
            kv_used_blocks, num_running: the cluster's after each of `steps` (empty: each
                step's own, one engine).
        """
        if not steps:
            return
        self.num_steps += len(steps)
        sums = self.sums
        for k, get in enumerate(_GET_SUMMED):
            sums[k] += sum(map(get, steps))
        phases = self.phase_sums
        for k, get in enumerate(_GET_PHASES):
            phases[k] = sum(map(get, steps), phases[k])
        self.step_time.extend(map(_STEP_TIME, steps))
        self.framework_time.extend(map(_FRAMEWORK_TIME, steps))
        blocks = kv_used_blocks or list(map(_KV_USED_BLOCKS, steps))
        running = num_running or list(map(_NUM_RUNNING, steps))
        self.kv_used_blocks += sum(blocks)
        self.peak_kv_used_blocks = max(self.peak_kv_used_blocks, max(blocks))
        self.num_running += sum(running)
        self.max_num_running = max(self.max_num_running, max(running))

    def total(self, field: str) -> int:
        """The run's sum of an integer field of `_SUMMED`."""
        return self.sums[_SUMMED.index(field)]

    def mean(self, field: str) -> float:
        """The mean per step of an integer field of `_SUMMED` (0.0 without steps)."""
        return self.total(field) / self.num_steps if self.num_steps else 0.0

    def phase_metrics(self) -> dict[str, float]:
        """`mean_<phase>_time_ms` for every `STEP_PHASES` entry (0.0 without steps)."""
        n = self.num_steps
        return {f"mean_{p}_time_ms": 1000.0 * s / n if n else 0.0
                for p, s in zip(STEP_PHASES, self.phase_sums, strict=True)}


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
               now: float, t_sched: float, t_update: float, num_running: int,
               num_waiting: int, kv: KVCacheManager) -> StepStats:
    """The record of step number `step`, which ran `plan` and ended at `now` (engine clock).

    Args:
        totals: the plan's aggregates (`SchedulerOutput.totals`, from `check_plan`).
        t_sched: seconds spent planning the step; t_update: applying its output.
        num_running, num_waiting: the scheduler's requests after the step.
    """
    u = kv.allocator.usage()  # NOTE: `kv.usage()`, one call less
    num_prefill, num_decode = totals.num_prefill_tokens, totals.num_decode_tokens
    # NOTE: positional, in the field order (once per step; keywords cost twice as much)
    st = StepStats(step, now, result.step_time, num_running, num_waiting,
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
