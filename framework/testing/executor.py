"""The model-free executor: one fake model for the framework's tests and benchmarks.

Every slot of its fake cache records which (token, position) was written there, so a plan
that attends over a wrong, stale or shared-and-overwritten block is caught; sampled tokens are
a deterministic function of the whole sequence, so preemption (recompute or swap) must not
change any request's output (`reference_output`). A subclass may turn the cache checks off
(`check_kv`), keep every plan (`keep_plans`), or sample by another rule (`sample`).
"""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING, ClassVar

from schedlab.clock import VirtualClock
from schedlab.config import EngineConfig
from schedlab.executor import Executor, ExecutorOutput
from schedlab.plan import ScheduledRequest, SchedulerOutput
from schedlab.request import Request
from schedlab.shapes import KVCacheSpec, ModelSpec

if TYPE_CHECKING:
    from schedlab.kv_manager import KVCacheManager

#: tokens the fake model samples (`next_token`); the spec's vocabulary is larger, so random
#: prompts of other tests (drawn from `SPEC.vocab_size`) rarely repeat
VOCAB = 50
EOS = 0

SPEC = ModelSpec(
    architecture="CheckingForCausalLM", num_layers=2, hidden_size=64, num_heads=4,
    num_kv_heads=2, head_dim=16, intermediate_size=128, vocab_size=1000,
    max_position_embeddings=4096, eos_token_ids=(EOS,),
)


class KVContractError(AssertionError):
    """A plan read or wrote KV it must not have (the message names the request and block)."""


def next_token(tokens: list[int]) -> int:
    """The fake model: a deterministic function of the whole sequence (EOS now and then)."""
    h = len(tokens)
    for t in tokens:
        h = (h * 1000003 + t) % 2_147_483_647
    return h % VOCAB


def reference_output(req: Request, max_len: int) -> list[int]:
    """What `req` must produce, whatever the scheduling: greedy tokens of the fake model."""
    tokens, out = list(req.prompt_token_ids), []
    sp = req.sampling_params
    while True:
        t = next_token(tokens)
        out.append(t)
        tokens.append(t)
        if (t == EOS and not sp.ignore_eos) or len(out) >= sp.max_tokens or len(tokens) >= max_len:
            return out


class CheckingExecutor(Executor):
    """Runs plans against a fake KV cache of (token, position) per slot, one virtual ms a step.

    Call `bind(engine.kv)` after building the engine to also check that no step writes into a
    block shared with another request or held by the prefix cache.

    Class attributes a subclass may set: `spec` (the fake model's shape), `check_kv` (False:
    no fake cache, for tests of the framework alone and micro-benchmarks), `keep_plans`
    (every plan kept in `plans`).
    """

    spec: ClassVar[ModelSpec] = SPEC
    check_kv: ClassVar[bool] = True
    keep_plans: ClassVar[bool] = False

    def __init__(self, config: EngineConfig) -> None:
        self.model_spec = self.spec
        self.dtype = "float32"
        self.plans: list[SchedulerOutput] = []
        self.clock = VirtualClock()
        self.kv: KVCacheManager | None = None
        self.block_size = config.block_size
        self.device: dict[int, list] = defaultdict(lambda: [None] * self.block_size)
        self.host: dict[int, list] = {}
        self.num_steps = 0

    def bind(self, kv: KVCacheManager) -> None:
        self.kv = kv

    def kv_cache_spec(self, block_size: int) -> KVCacheSpec:
        s = self.model_spec
        return KVCacheSpec(s.num_layers, s.num_kv_heads, s.head_dim, self.dtype, block_size)

    def initialize_cache(self, num_blocks: int, block_size: int) -> None:
        self.num_blocks = num_blocks

    def sample(self, s: ScheduledRequest) -> int:
        """The token sampled after a request's scheduled tokens (the fake model)."""
        return next_token(s.request.token_slice(0, s.start + s.num_new_tokens))

    def execute(self, plan: SchedulerOutput) -> ExecutorOutput:
        self.num_steps += 1
        if self.keep_plans:
            self.plans.append(plan)
        if self.check_kv:
            self._check(plan)
        sampled = [self.sample(s) if s.samples else None for s in plan.scheduled]
        clock = self.clock
        assert isinstance(clock, VirtualClock), "a model-free executor runs on a VirtualClock"
        clock.advance(1e-3)
        return ExecutorOutput(sampled, 1e-3)

    def _check(self, plan: SchedulerOutput) -> None:
        """Write the plan's tokens into the fake cache and check what each request reads."""
        bs, kv = self.block_size, self.kv
        # reads before writes, as the torch executor does
        out_data = [list(self.device[d]) for d, _ in plan.swap_out]
        in_data = [self.host.pop(h) for h, _ in plan.swap_in]
        for (_, h), data in zip(plan.swap_out, out_data, strict=True):
            self.host[h] = data
        for (_, d), data in zip(plan.swap_in, in_data, strict=True):
            self.device[d] = list(data)
        for s in plan.scheduled:
            rid = s.request.request_id
            tokens = s.request.token_slice(s.start, s.start + s.num_new_tokens)
            for p, t in enumerate(tokens, s.start):
                b = s.block_ids[p // bs]
                if kv is not None and kv.allocator.ref_count(b) != 1:
                    raise KVContractError(f"request {rid!r} writes position {p} into block {b}, "
                                          f"which {kv.allocator.ref_count(b)} requests hold")
                if kv is not None and kv.prefix_cache is not None and kv.prefix_cache.is_cached(b):
                    raise KVContractError(f"request {rid!r} writes position {p} into block {b}, "
                                          "which the prefix cache holds")
                self.device[b][p % bs] = (t, p)
        for s in plan.scheduled:
            end = s.start + s.num_new_tokens
            want = s.request.token_slice(0, end)
            for p in range(end):
                got = self.device[s.block_ids[p // bs]][p % bs]
                if got != (want[p], p):
                    raise KVContractError(
                        f"request {s.request.request_id!r} attends over {got} at position {p} "
                        f"(block {s.block_ids[p // bs]}), expected {(want[p], p)}: its KV was "
                        "lost, overwritten or never computed")
