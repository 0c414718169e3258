"""Per-step statistics the engine records (the raw series behind plots and W&B)."""

from __future__ import annotations

from dataclasses import dataclass


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
    return {f"mean_{p}_time_ms": 1000.0 * sum(getattr(s, f"{p}_time") for s in steps) / n
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
