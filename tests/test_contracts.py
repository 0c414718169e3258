"""Contract tests per interface, parametrized over every registered plugin.

A new plugin (built-in or third-party) gets these for free. `check_integrity()` runs after
every engine step, and every run must end with the whole KV pool free or cached.
"""

from __future__ import annotations

import random

import pytest
import torch
from fakes import FakeExecutor

from schedlab import registry
from schedlab.attention import AttentionMetadata, KVCacheSpec
from schedlab.config import EngineConfig
from schedlab.engine import Engine
from schedlab.kv_manager import KVCacheManager
from schedlab.request import Request, RequestStatus, SamplingParams


def plugins(kind: str) -> list[str]:
    return registry.available(kind)


def _req(i: int, n: int = 10, max_tokens: int = 5, arrival: float | None = None,
         priority: int = 0) -> Request:
    return Request(f"r{i}", list(range(2, 2 + n)), SamplingParams(max_tokens=max_tokens),
                   arrival_time=float(i) if arrival is None else arrival, priority=priority)


# ---- RequestQueue ---------------------------------------------------------------------
@pytest.mark.parametrize("name", plugins("queue"))
def test_queue_contract(name):
    q = registry.load("queue", name)()
    rng = random.Random(0)
    reqs = [_req(i, n=rng.randint(1, 30), priority=rng.randint(0, 3)) for i in range(20)]
    for r in reqs:
        q.add(r)
        q.check_integrity()
    assert len(q) == 20 and bool(q)
    head = q.peek()
    assert q.pop() is head
    q.prepend(head)
    q.remove(reqs[7])
    q.check_integrity()
    popped = []
    while q:
        nxt = q.peek()
        assert q.pop() is nxt
        popped.append(nxt)
    assert {r.request_id for r in popped} == {r.request_id for r in reqs} - {"r7"}
    with pytest.raises(IndexError):
        q.peek()
    victim = q.select_victim(reqs[:5])
    assert victim in reqs[:5]


# ---- KVAllocator ----------------------------------------------------------------------
@pytest.mark.parametrize("name", plugins("kv_allocator"))
def test_allocator_contract(name):
    alloc = registry.load("kv_allocator", name)(num_blocks=64, block_size=4, max_model_len=32)
    rng = random.Random(1)
    live: list[Request] = []
    for i in range(200):
        if live and rng.random() < 0.4:
            r = live.pop(rng.randrange(len(live)))
            alloc.release(alloc.free(r))
            assert alloc.block_table(r) == []
        else:
            r = _req(i, n=rng.randint(1, 20), max_tokens=rng.randint(1, 12))
            n = r.num_prompt_tokens
            if alloc.can_allocate(r, n):
                alloc.allocate(r, n)
                assert len(alloc.block_table(r)) * 4 >= n
                live.append(r)
            else:
                with pytest.raises(RuntimeError):
                    alloc.allocate(r, n)
        # grow a random live request by a token, as a decode step would
        if live:
            r = rng.choice(live)
            n = min(len(alloc.block_table(r)) * 4 + 1, r.max_total_tokens)
            if alloc.can_allocate(r, n):
                alloc.allocate(r, n)
        alloc.check_integrity()
        u = alloc.usage()
        assert u.used_blocks + u.free_blocks + u.cached_blocks == u.num_blocks
        assert 0 <= u.used_tokens <= u.reserved_tokens
        tables = [b for r in live for b in alloc.block_table(r)]
        assert len(tables) == len(set(tables)), "a block is owned by two requests"
    for r in live:
        alloc.release(alloc.free(r))
    alloc.check_integrity()
    assert alloc.num_free_blocks() == 64


# ---- PrefixCache ----------------------------------------------------------------------
@pytest.mark.parametrize("name", plugins("prefix_cache"))
def test_prefix_cache_contract(name):
    cls = registry.load("prefix_cache", name)
    alloc_name = "paged" if cls.requires_sharing else "contiguous"
    alloc = registry.load("kv_allocator", alloc_name)(32, 4, 64)
    kv = KVCacheManager(alloc, cls(4))
    tokens = list(range(10, 30))  # 5 full blocks
    a = Request("a", tokens, SamplingParams(max_tokens=4))
    kv.allocate(a, len(tokens))
    a.num_computed_tokens = len(tokens)
    kv.cache_computed(a)
    kv.free(a)
    kv.check_integrity()
    b = Request("b", tokens + [99], SamplingParams(max_tokens=4))
    m = kv.match_prefix(b)
    assert m.num_tokens == len(m.block_ids) * 4
    if cls.caches:
        assert m.num_tokens == 20, "a freed request's full blocks stay cached"
    else:
        assert m.num_tokens == 0
    assert kv.can_allocate(b, b.num_tokens, m)
    kv.allocate(b, b.num_tokens, m)
    assert b.num_computed_tokens == m.num_tokens
    kv.check_integrity()
    # fill the pool: cached blocks are evicted to make room
    c = Request("c", list(range(500, 620)), SamplingParams(max_tokens=1))
    kv.free(b)
    assert kv.can_allocate(c, 120)
    kv.allocate(c, 120)
    kv.check_integrity()
    kv.free(c)
    kv.check_integrity()
    u = kv.usage()
    assert u.used_blocks == 0


# ---- AttentionBackend -----------------------------------------------------------------
def _dense_reference(q, k_ctx, v_ctx, q_lens, ctx_lens, scale, groups):
    outs, start = [], 0
    for s, (ql, cl) in enumerate(zip(q_lens, ctx_lens, strict=True)):
        qs = q[start:start + ql]
        k = k_ctx[s][:cl].repeat_interleave(groups, dim=1)
        v = v_ctx[s][:cl].repeat_interleave(groups, dim=1)
        att = torch.einsum("qhd,khd->hqk", qs, k) * scale
        qpos = torch.arange(cl - ql, cl)[:, None]
        att = att.masked_fill(torch.arange(cl)[None, :] > qpos, float("-inf"))
        outs.append(torch.einsum("hqk,khd->qhd", att.softmax(-1), v))
        start += ql
    return torch.cat(outs)


@pytest.mark.parametrize("name", plugins("attention"))
def test_attention_contract(name):
    cls = registry.load("attention", name)
    try:
        cls.check_available(torch.device("cpu"))
    except RuntimeError as e:
        pytest.skip(str(e))
    torch.manual_seed(0)
    H, Hkv, D, bs = 4, 2, 16, 4
    spec = KVCacheSpec(num_layers=1, num_kv_heads=Hkv, head_dim=D, dtype=torch.float32,
                       block_size=bs)
    backend = cls(spec, 40, "cpu")
    # two decodes, a fresh prefill and a chunk on top of earlier context
    q_lens, ctx_lens = [1, 1, 7, 5], [9, 3, 7, 14]
    tables = [[5, 2, 30], [11], [1, 0], [20, 21, 3, 39]]
    k_ctx = [torch.randn(c, Hkv, D) for c in ctx_lens]
    v_ctx = [torch.randn(c, Hkv, D) for c in ctx_lens]
    kc = backend.k_caches[0].view(-1, Hkv, D)
    vc = backend.v_caches[0].view(-1, Hkv, D)
    new_k, new_v, slots = [], [], []
    for s, (ql, cl) in enumerate(zip(q_lens, ctx_lens, strict=True)):
        for p in range(cl):
            slot = tables[s][p // bs] * bs + p % bs
            if p < cl - ql:  # earlier context is already in the cache
                kc[slot], vc[slot] = k_ctx[s][p], v_ctx[s][p]
            else:
                slots.append(slot)
                new_k.append(k_ctx[s][p])
                new_v.append(v_ctx[s][p])
    T = sum(q_lens)
    q = torch.randn(T, H, D)
    bt = torch.zeros(4, 4, dtype=torch.int32)
    for i, t in enumerate(tables):
        bt[i, : len(t)] = torch.tensor(t)
    meta = AttentionMetadata(
        slot_mapping=torch.tensor(slots), query_start_loc=torch.tensor([0, 1, 2, 9, 14],
                                                                       dtype=torch.int32),
        seq_lens=torch.tensor(ctx_lens, dtype=torch.int32), block_tables=bt,
        query_lens=q_lens, seq_lens_host=ctx_lens, num_decodes=2, max_query_len=7,
        max_seq_len=14)
    out = backend.forward(0, q, torch.stack(new_k), torch.stack(new_v), meta, D ** -0.5)
    ref = _dense_reference(q, k_ctx, v_ctx, q_lens, ctx_lens, D ** -0.5, H // Hkv)
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)
    # the new K/V landed in the cache
    torch.testing.assert_close(kc[torch.tensor(slots)], torch.stack(new_k))


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
            assert sum(s.num_new_tokens for s in plan.scheduled) == plan.num_batched_tokens
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

    from fakes import FAKE_SPEC

    class TwoEos(FakeExecutor):
        spec = dataclasses.replace(FAKE_SPEC, eos_token_ids=(0, 7))

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
