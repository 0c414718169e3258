"""The executor interface: the only place that turns a plan into tokens and a duration."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

from schedlab.clock import Clock
from schedlab.plan import SchedulerOutput
from schedlab.shapes import KVCacheSpec, ModelSpec


@dataclass(frozen=True, slots=True)
class ExecutorTimings:
    """Host wall time of one step's parts in a real executor (seconds).

    Args:
        prepare: swaps and batch building (inputs, positions, attention metadata).
        forward: launching the forward pass (on a GPU the call returns before the kernels
            finish; on a CPU it is the whole forward).
        device_wait: waiting for the device to finish the forward (0 on a CPU).
        sample: sampling and reading the tokens back.
    """

    prepare: float
    forward: float
    device_wait: float
    sample: float


@dataclass(slots=True)
class ExecutorOutput:
    """What one step produced: a token (or None for a partial prefill) per scheduled request,
    in plan order, how long the step took on the executor's clock (seconds), and, from a real
    executor, where its host time went (`timings`; None from a simulated one)."""

    sampled_token_ids: list[int | None]
    step_time: float
    timings: ExecutorTimings | None = None


class Executor(ABC):
    """Runs the plans the scheduler makes.

    Built by the engine with the engine config and the model's spec; `initialize_cache` is
    called once the engine has sized the KV pool.
    """

    clock: Clock
    #: the served model's shape (the torch executor reads it from the checkpoint)
    model_spec: ModelSpec

    @abstractmethod
    def kv_cache_spec(self, block_size: int) -> KVCacheSpec:
        """The model's KV footprint (for sizing the pool). No state change."""

    @abstractmethod
    def initialize_cache(self, num_blocks: int, block_size: int) -> None:
        """Allocate the KV cache for `num_blocks` blocks. Changes state."""

    @abstractmethod
    def execute(self, plan: SchedulerOutput) -> ExecutorOutput:
        """Run one step of the plan: forward pass (or its cost model) and sampling.

        Returns:
            One sampled token per scheduled request that completes its prefill, None for the
            others, and the step's duration.
        """

    def set_clock(self, clock: Clock) -> None:
        """Run on `clock` instead of the executor's own (the engine passes an injected clock,
        e.g. a CPU-time clock for calibration). Changes state."""
        self.clock = clock

    def export_kv(self, block_ids: list[int]) -> object | None:
        """Copy these blocks' K/V out, for a request that moves to another engine (KV
        migration, prefill/decode disaggregation). No state change.

        Returns:
            An opaque copy for `import_kv` on the receiving executor; None where there is no
            K/V to move (the simulator).
        """
        return None

    def import_kv(self, block_ids: list[int], data: object) -> None:  # noqa: B027 (optional)
        """Write K/V exported by `export_kv` into these blocks (as many as were exported).
        Changes state."""

    def available_kv_memory(self) -> int | None:
        """Bytes the KV cache may use when the user gave no size (None: engine default)."""
        return None
