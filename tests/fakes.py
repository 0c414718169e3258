"""The model-free executor for tests of the framework alone: `schedlab.testing`'s, without
its KV checks, sampling by a cheap rule."""

from __future__ import annotations

from schedlab.config import EngineConfig
from schedlab.engine import Engine
from schedlab.plan import ScheduledRequest
from schedlab.testing.executor import CheckingExecutor


class FakeExecutor(CheckingExecutor):
    """Deterministic tokens (a hash of the request's token count; EOS every `eos_every`-th
    when set), one virtual ms per step, every plan kept in `plans` unless `keep_plans` is
    off (micro-benchmarks)."""

    check_kv = False
    keep_plans = True

    def __init__(self, config: EngineConfig, eos_every: int = 0) -> None:
        super().__init__(config)
        self.eos_every = eos_every

    def sample(self, s: ScheduledRequest) -> int:
        n = s.request.num_tokens
        return 0 if self.eos_every and n % self.eos_every == 0 else 2 + (n * 7919) % 997


def fake_engine(**kw) -> Engine:
    """A model-free engine on `FakeExecutor` with a small pool (max_model_len 64, 64 blocks
    of 4 tokens unless given)."""
    kw.setdefault("max_model_len", 64)
    kw.setdefault("num_kv_blocks", 64)
    kw.setdefault("block_size", 4)
    return Engine(EngineConfig(model="fake", **kw), executor_cls=FakeExecutor)
