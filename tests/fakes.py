"""A model-free executor for tests of the framework alone."""

from __future__ import annotations

from schedlab.config import EngineConfig
from schedlab.executor import Executor, ExecutorOutput, VirtualClock
from schedlab.scheduler import SchedulerOutput
from schedlab.shapes import KVCacheSpec, ModelSpec

FAKE_SPEC = ModelSpec(
    architecture="FakeForCausalLM", num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2,
    head_dim=16, intermediate_size=128, vocab_size=1000, max_position_embeddings=4096,
    eos_token_ids=(0,),
)


class FakeExecutor(Executor):
    """Deterministic tokens (a hash of the request's token count), one virtual ms per step.

    Every plan is kept in `plans` unless `keep_plans` is off (micro-benchmarks).
    """

    spec: ModelSpec = FAKE_SPEC
    keep_plans: bool = True

    def __init__(self, config: EngineConfig, eos_every: int = 0) -> None:
        import torch

        self.model_spec = self.spec
        self.clock = VirtualClock()
        self.eos_every = eos_every
        self.dtype = torch.float32
        self.plans: list[SchedulerOutput] = []

    def kv_cache_spec(self, block_size: int) -> KVCacheSpec:
        s = self.model_spec
        return KVCacheSpec(s.num_layers, s.num_kv_heads, s.head_dim, self.dtype, block_size)

    def initialize_cache(self, num_blocks: int, block_size: int) -> None:
        self.num_blocks = num_blocks

    def execute(self, plan: SchedulerOutput) -> ExecutorOutput:
        if self.keep_plans:
            self.plans.append(plan)
        out: list[int | None] = []
        for s in plan.scheduled:
            if not s.samples:
                out.append(None)
                continue
            n = s.request.num_tokens
            tok = 0 if self.eos_every and n % self.eos_every == 0 else 2 + (n * 7919) % 997
            out.append(tok)
        self.clock.advance(1e-3)
        return ExecutorOutput(out, 1e-3)
