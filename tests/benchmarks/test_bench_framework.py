"""Micro-benchmarks of the framework alone (no model): `make bench` or
`pytest -m benchmark tests/benchmarks`. Numbers only; nothing here asserts a timing."""

from __future__ import annotations

import random

import pytest
from conftest import load_or_skip, running_engine, scheduler_names

from schedlab.kv_manager import KVCacheManager
from schedlab.plan import SchedulerOutput
from schedlab.request import Request, SamplingParams

pytestmark = pytest.mark.benchmark


@pytest.mark.parametrize("num_seqs", [256, 1024])
@pytest.mark.parametrize("scheduler", scheduler_names())
def test_schedule_update_round(benchmark, scheduler, num_seqs):
    """One `schedule()` + `update_from_output()` with `num_seqs` requests decoding."""
    load_or_skip("scheduler", scheduler)
    eng = running_engine(scheduler, num_seqs)
    sched = eng.scheduler

    def round_():
        plan = sched.schedule()
        sched.update_from_output(plan, [5] * plan.num_scheduled, 0.0)
        return plan

    plan = benchmark.pedantic(round_, rounds=40, iterations=1, warmup_rounds=3)
    assert plan.num_scheduled == num_seqs
    sched.check_integrity()


@pytest.mark.parametrize("num_seqs", [256, 1024])
def test_engine_step(benchmark, num_seqs):
    """A whole `Engine.step()` (schedule, a model-free execute, update, step stats)."""
    eng = running_engine("continuous", num_seqs)
    benchmark.pedantic(eng.step, rounds=40, iterations=1, warmup_rounds=3)
    assert len(eng.scheduler.running) == num_seqs


@pytest.mark.parametrize("num_seqs", [64, 256, 1024, 2048])
def test_engine_step_per_request(benchmark, num_seqs):
    """`Engine.step()` as the batch grows. `extra_info`: microseconds per running request,
    for the whole step and for its schedule + update (`StepStats.framework_time`); flat
    across sizes means the step's cost is linear in the batch, rising means worse."""
    eng = running_engine("continuous", num_seqs)
    benchmark.pedantic(eng.step, rounds=30, iterations=1, warmup_rounds=3)
    assert len(eng.scheduler.running) == num_seqs
    framework = sorted(s.framework_time for s in eng.step_stats[-30:])[15]
    benchmark.extra_info["step_us_per_request"] = round(
        1e6 * benchmark.stats.stats.median / num_seqs, 3)
    benchmark.extra_info["framework_us_per_request"] = round(1e6 * framework / num_seqs, 3)


def _request(i: int, num_tokens: int) -> Request:
    return Request(str(i), [2 + (i * 31 + j) % 900 for j in range(num_tokens)],
                   SamplingParams(max_tokens=16))


@pytest.mark.parametrize("allocator", ["paged", "contiguous"])
def test_allocate_free(benchmark, allocator):
    """Allocate 64 requests of 256 tokens, then free and release them all (one cycle)."""
    cls = load_or_skip("kv_allocator", allocator)
    alloc = cls(num_blocks=4096, block_size=16, max_model_len=512)
    reqs = [_request(i, 256) for i in range(64)]

    def cycle():
        for r in reqs:
            alloc.allocate(r, r.num_tokens)
        for r in reqs:
            alloc.release(alloc.free(r))

    benchmark.pedantic(cycle, rounds=30, iterations=1, warmup_rounds=2)
    alloc.check_integrity()
    assert alloc.num_free_blocks() == 4096


def _prompt(rng: random.Random, n: int = 1024) -> list[int]:
    return [rng.randrange(2, 32000) for _ in range(n)]


@pytest.mark.parametrize("cache", ["hash_block", "radix"])
def test_prefix_insert_1k(benchmark, cache):
    """Insert a new 1,024-token prompt (64 blocks of 16) into a cache holding 32 others."""
    cls = load_or_skip("prefix_cache", cache)
    pc = cls(16)
    rng = random.Random(0)
    for i in range(32):
        pc.insert(_prompt(rng), range(i * 64, (i + 1) * 64))
    next_block = [32 * 64]

    def setup():
        first = next_block[0]
        next_block[0] += 64
        return (_prompt(rng), range(first, first + 64)), {}

    benchmark.pedantic(pc.insert, setup=setup, rounds=40, iterations=1)
    pc.check_integrity()


@pytest.mark.parametrize("hit", [True, False], ids=["hit", "miss"])
@pytest.mark.parametrize("cache", ["hash_block", "radix"])
def test_prefix_match_1k(benchmark, cache, hit):
    """Match a 1,024-token prompt: fully cached (hit) or sharing nothing (miss)."""
    cls = load_or_skip("prefix_cache", cache)
    pc = cls(16)
    rng = random.Random(0)
    prompts = [_prompt(rng) for _ in range(32)]
    for i, p in enumerate(prompts):
        pc.insert(p, range(i * 64, (i + 1) * 64))
    query = prompts[7] if hit else _prompt(rng)
    m = benchmark.pedantic(pc.match, args=(query,), rounds=100, iterations=1, warmup_rounds=3)
    assert m.num_tokens == (1024 if hit else 0)


@pytest.mark.parametrize("prefix_cache", ["hash_block", "radix"])
def test_kv_manager_match_1k(benchmark, prefix_cache):
    """`KVCacheManager.match_prefix` of a request whose 1,024-token prompt is cached."""
    cls = load_or_skip("prefix_cache", prefix_cache)
    alloc = load_or_skip("kv_allocator", "paged")(4096, 16, 2048)
    kv = KVCacheManager(alloc, cls(16))
    owner = _request(0, 1024)
    kv.allocate(owner, 1024)
    owner.num_computed_tokens = 1024
    kv.cache_computed(owner)
    query = _request(0, 1024)
    query.request_id = "q"
    m = benchmark.pedantic(kv.match_prefix, args=(query,), rounds=100, iterations=1)
    assert m.num_tokens == 1008  # one token is always left to compute


def decode_plan(num_seqs: int, block_size: int = 16, seed: int = 0) -> SchedulerOutput:
    """A decode step of `num_seqs` requests with contexts of 16..512 tokens, as a decode run
    (what the built-in schedulers hand the executor)."""
    rng = random.Random(seed)
    plan = SchedulerOutput()
    reqs, starts, tables = [], [], []
    next_block = 0
    for i in range(num_seqs):
        n_prompt, n_out = rng.randint(16, 448), rng.randint(1, 64)
        req = _request(i, n_prompt)
        req.output_token_ids = [7] * n_out
        n = req.num_tokens
        req.num_computed_tokens = n - 1
        nblocks = -(-n // block_size)
        blocks = list(range(next_block, next_block + nblocks))
        next_block += nblocks
        reqs.append(req)
        starts.append(n - 1)
        tables.append(blocks)
    plan.add_decodes(reqs, starts, tables)
    return plan


@pytest.fixture(scope="module")
def tiny_executor(tmp_path_factory):
    """A real TorchExecutor (tiny random Llama) whose `prepare` is measured."""
    from schedlab.config import EngineConfig
    from schedlab.plugins.executors.torch_executor import TorchExecutor
    from schedlab.tiny import build_tiny_model

    path = build_tiny_model(tmp_path_factory.mktemp("bench") / "llama-tiny",
                            max_position_embeddings=1024)
    ex = TorchExecutor(EngineConfig(model=str(path), device="cpu"))
    ex.initialize_cache(1024 * 40, 16)
    return ex


@pytest.mark.parametrize("num_seqs", [256, 1024])
def test_prepare_decode(benchmark, tiny_executor, num_seqs):
    """`TorchExecutor.prepare`: pack a decode plan into [1, T] inputs + AttentionMetadata."""
    plan = decode_plan(num_seqs)
    input_ids, positions, meta, logits_idx, order = benchmark.pedantic(
        tiny_executor.prepare, args=(plan,), rounds=50, iterations=1, warmup_rounds=3)
    assert input_ids.shape == (1, num_seqs)
    assert meta.num_decodes == num_seqs
    assert logits_idx.shape == (num_seqs,)
