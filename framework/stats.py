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
