"""Fixtures of the micro-benchmarks: engines on a model-free executor (the framework alone)."""

from __future__ import annotations

import pytest
from fakes import FakeExecutor

from schedlab import registry
from schedlab.config import EngineConfig
from schedlab.engine import Engine
from schedlab.executor import ExecutorOutput
from schedlab.plan import SchedulerOutput
from schedlab.request import SamplingParams
from schedlab.shapes import ModelSpec

#: a Llama-150M-shaped spec: sizes the KV pool realistically, never runs
BENCH_SPEC = ModelSpec(
    architecture="BenchForCausalLM", num_layers=8, hidden_size=1024, num_heads=16,
    num_kv_heads=4, head_dim=64, intermediate_size=2816, vocab_size=32000,
    max_position_embeddings=4096, eos_token_ids=(0,),
)


class BenchExecutor(FakeExecutor):
    """Deterministic tokens, no model and no per-step memory: the engine's own cost only.

    `FakeExecutor`'s tokens (a hash of the request's token count), sampled in one pass
    without a method call per request, so the executor's share of a step stays small.
    """

    spec = BENCH_SPEC
    keep_plans = False

    def execute(self, plan: SchedulerOutput) -> ExecutorOutput:
        # NOTE: the plan's columns, as the torch executor reads them (a decode run's lists,
        # no entries built)
        sampled: list[int | None] = []
        add = sampled.append
        for r, start, q, _ in zip(*plan.columns(), strict=True):
            n = len(r.prompt_token_ids) + len(r.output_token_ids)
            add(2 + (n * 7919) % 997 if start + q == n else None)
        self.num_steps += 1
        self.clock.advance(1e-3)  # type: ignore[attr-defined]
        return ExecutorOutput(sampled, 1e-3)


def build_engine(scheduler: str, num_seqs: int, **kw) -> Engine:
    """An engine over the model-free `BenchExecutor`."""
    cfg = dict(model="bench", scheduler=scheduler, max_num_seqs=num_seqs,
               max_num_batched_tokens=max(8192, 64 * num_seqs), max_model_len=1024,
               num_kv_blocks=num_seqs * 64 + 16)
    cfg.update(kw)
    return Engine(EngineConfig(**cfg), executor_cls=BenchExecutor)


def running_engine(scheduler: str, num_seqs: int, prompt_len: int = 64) -> Engine:
    """An engine with `num_seqs` requests all past their prefill, decoding one token a step."""
    eng = build_engine(scheduler, num_seqs)
    for i in range(num_seqs):
        eng.add_request([2 + (i + j) % 900 for j in range(prompt_len)],
                        SamplingParams(temperature=0.0, max_tokens=900, ignore_eos=True))
    while eng.scheduler.waiting or any(
        r.num_computed_tokens < r.num_prompt_tokens for r in eng.scheduler.running
    ):
        eng.step()
    assert len(eng.scheduler.running) == num_seqs
    return eng


def scheduler_names() -> list[str]:
    return ["static", "continuous", "chunked_prefill"]


def load_or_skip(kind: str, name: str):
    try:
        return registry.load(kind, name)
    except registry.PluginError as e:
        pytest.skip(f"{kind} {name!r} does not load: {e}")
