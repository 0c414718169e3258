"""Contract tests per interface, parametrized over every registered plugin.

A new plugin (built-in or third-party) gets these for free; the unit contracts are the ones
`schedlab.testing` ships (`schedlab plugins --check`). `check_integrity()` runs after
every engine step, and every run must end with the whole KV pool free or cached.
"""

from __future__ import annotations

import random

import pytest
from fakes import FakeExecutor

from schedlab import registry
from schedlab.config import EngineConfig
from schedlab.engine import Engine
from schedlab.request import RequestStatus, SamplingParams
from schedlab.testing import contracts


def plugins(kind: str) -> list[str]:
    return registry.available(kind)


# ---- unit contracts, as shipped in schedlab.testing (what `schedlab plugins --check` runs) ----
@pytest.mark.parametrize("name", plugins("queue"))
def test_queue_contract(name):
    contracts.queue_contract(registry.load("queue", name))


@pytest.mark.parametrize("name", plugins("kv_allocator"))
def test_allocator_contract(name):
    contracts.allocator_contract(registry.load("kv_allocator", name))


@pytest.mark.parametrize("name", plugins("prefix_cache"))
def test_prefix_cache_contract(name):
    contracts.prefix_cache_contract(registry.load("prefix_cache", name))


@pytest.mark.parametrize("name", plugins("attention"))
def test_attention_contract(name):
    try:
        contracts.attention_contract(registry.load("attention", name))
    except RuntimeError as e:  # not available here (triton without its interpreter)
        pytest.skip(str(e))


def test_every_installed_plugin_passes_plugins_check():
    from schedlab.testing import all_targets, check_plugin

    for kind, name in all_targets():
        failed = [r for r in check_plugin(kind, name, seeds=(0,)) if r.ok is False]
        assert not failed, f"{kind} {name!r}: {failed[0].check}: {failed[0].message}"


# ---- Scheduler x allocator x prefix cache x queue through the engine -------------------
def _engine(**kw) -> Engine:
    return Engine(EngineConfig(model="fake", **kw), executor_cls=FakeExecutor)


def _combos():
    out = []
    for s in plugins("scheduler"):
        for a in plugins("kv_allocator"):
            for p in plugins("prefix_cache"):
                for q in plugins("queue"):
                    out.append((s, a, p, q))
    return out


@pytest.mark.parametrize("sched,alloc,pc,queue", _combos())
def test_engine_contract(sched, alloc, pc, queue):
    cls_pc = registry.load("prefix_cache", pc)
    if cls_pc.requires_sharing and not registry.load("kv_allocator", alloc).supports_sharing:
        pytest.skip(f"{pc} over {alloc} is refused at build time (tested elsewhere)")
    eng = _engine(scheduler=sched, kv_allocator=alloc, prefix_cache=pc, queue=queue,
                  block_size=4, max_model_len=48, max_num_batched_tokens=48, num_kv_blocks=30,
                  max_num_seqs=6, kv_allocator_options={"reserve": "request"}
                  if alloc == "contiguous" else {})
    rng = random.Random(7)
    shared = [rng.randrange(2, 900) for _ in range(12)]
    reqs = []
    for i in range(24):
        own = [rng.randrange(2, 900) for _ in range(rng.randint(1, 20))]
        prompt = (shared if i % 2 else []) + own
        reqs.append(eng.add_request(prompt, SamplingParams(max_tokens=rng.randint(1, 14),
                                                           ignore_eos=True), priority=i % 3))
    for _ in range(2000):
        if not eng.has_unfinished():
            break
        plan_count = len(eng.executor.plans)
        eng.step()
        eng.check_integrity()
        if len(eng.executor.plans) > plan_count:
            plan = eng.executor.plans[-1]
            assert plan.num_batched_tokens <= eng.max_num_batched_tokens
            assert len(plan.scheduled) <= 6
    assert not eng.has_unfinished(), "requests left stuck"
    for r in reqs:
        assert r.status in (RequestStatus.FINISHED_LENGTH, RequestStatus.REJECTED)
        if r.status is RequestStatus.FINISHED_LENGTH:
            assert r.num_output_tokens == r.sampling_params.max_tokens
    u = eng.kv.usage()
    assert u.used_blocks == 0 and u.free_blocks + u.cached_blocks == u.num_blocks


# ---- Executor -------------------------------------------------------------------------
@pytest.mark.parametrize("name", plugins("executor"))
def test_executor_contract(name, llama_dir):
    eng = Engine(EngineConfig(model=llama_dir, executor=name, max_model_len=64, block_size=4))
    reqs = [eng.add_request(list(range(2, 2 + n)), SamplingParams(max_tokens=5, ignore_eos=True))
            for n in (3, 9, 17)]
    t0 = eng.clock.now()
    eng.run_until_done(check=True)
    assert all(r.num_output_tokens == 5 for r in reqs)
    assert eng.clock.now() > t0
    for r in reqs:
        times = r.metrics.token_times
        assert times == sorted(times) and r.metrics.first_token_time == times[0]
        assert r.metrics.finished_time == times[-1]
    assert all(s.step_time > 0 for s in eng.step_stats)


def test_every_eos_id_ends_a_request():
    """A checkpoint may have several EOS ids (Llama-3-Instruct's <|eot_id|>): each one stops."""
    import dataclasses

    class TwoEos(FakeExecutor):
        spec = dataclasses.replace(FakeExecutor.spec, eos_token_ids=(0, 7))

        def execute(self, plan):
            out = super().execute(plan)
            return type(out)([7 if t is not None else None for t in out.sampled_token_ids],
                             out.step_time)

    eng = Engine(EngineConfig(model="fake", max_model_len=64), executor_cls=TwoEos)
    stops = eng.add_request([5, 6], SamplingParams(max_tokens=5))
    runs_on = eng.add_request([5, 6], SamplingParams(max_tokens=5, ignore_eos=True))
    eng.run_until_done(check=True)
    assert stops.output_token_ids == [7] and stops.finish_reason == "stop"
    assert runs_on.output_token_ids == [7] * 5 and runs_on.finish_reason == "length"
