"""Unit contracts per interface: what any plugin of that interface must do, on its own.

Each `*_contract(cls, options)` builds the plugin and exercises its documented methods,
raising AssertionError (with a sentence) at the first broken promise. `CONTRACTS` maps an
interface to its contract; interfaces without one are covered by `runs.run_engine` alone.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from schedlab import registry
from schedlab.kv_allocator import KVAllocator
from schedlab.kv_manager import KVCacheManager
from schedlab.prefix_cache import PrefixCache
from schedlab.request import Request, SamplingParams

if TYPE_CHECKING:
    from schedlab.attention import AttentionBackend


def _req(i: int, n: int = 10, max_tokens: int = 5, priority: int = 0) -> Request:
    return Request(f"r{i}", list(range(2, 2 + n)), SamplingParams(max_tokens=max_tokens),
                   arrival_time=float(i), priority=priority, expected_output_len=max_tokens)


def queue_contract(cls: type, options: dict[str, Any] | None = None) -> None:
    """add / peek / pop / prepend / remove / len / iter agree, and nothing is lost."""
    q = registry.build(registry.resolve("queue", cls, options))
    rng = random.Random(0)
    reqs = [_req(i, n=rng.randint(1, 30), priority=rng.randint(0, 3)) for i in range(20)]
    for r in reqs:
        q.add(r)
        q.check_integrity()
    assert len(q) == 20 and bool(q), f"len() is {len(q)} after 20 add()s"
    assert sorted(r.request_id for r in q) == sorted(r.request_id for r in reqs), (
        "iteration does not yield every queued request once")
    head = q.peek()
    assert q.pop() is head, "pop() returned another request than peek()"
    q.prepend(head)
    q.remove(reqs[7])
    q.check_integrity()
    popped = []
    while q:
        nxt = q.peek()
        assert q.pop() is nxt, "pop() returned another request than peek()"
        popped.append(nxt)
    assert {r.request_id for r in popped} == {r.request_id for r in reqs} - {"r7"}, (
        "requests were lost or duplicated")
    for call in (q.peek, q.pop):
        try:
            call()
        except IndexError:
            continue
        raise AssertionError(f"{call.__name__}() on an empty queue must raise IndexError")
    victim = q.select_victim(reqs[:5])
    assert victim in reqs[:5], "select_victim() returned a request that was not a candidate"


def allocator_contract(cls: type, options: dict[str, Any] | None = None) -> None:
    """Random allocate / grow / free: tables cover the tokens, no block owned twice, the pool
    adds up and comes back whole."""
    alloc = registry.build(registry.resolve("kv_allocator", cls, options), 64, 4, 32)
    rng = random.Random(1)
    live: list[Request] = []
    for i in range(200):
        if live and rng.random() < 0.4:
            r = live.pop(rng.randrange(len(live)))
            alloc.release(alloc.free(r))
            assert alloc.block_table(r) == [], "a freed request still has a block table"
        else:
            r = _req(i, n=rng.randint(1, 20), max_tokens=rng.randint(1, 12))
            n = r.num_prompt_tokens
            if alloc.can_allocate(r, n):
                alloc.allocate(r, n)
                assert len(alloc.block_table(r)) * 4 >= n, "the block table is short of tokens"
                live.append(r)
            else:
                try:
                    alloc.allocate(r, n)
                except RuntimeError:
                    pass
                else:
                    raise AssertionError("allocate() after can_allocate() said no must raise "
                                         "RuntimeError")
        if live:  # grow a random live request by a token, as a decode step would
            r = rng.choice(live)
            n = min(len(alloc.block_table(r)) * 4 + 1, r.max_total_tokens)
            if alloc.can_allocate(r, n):
                alloc.allocate(r, n)
        alloc.check_integrity()
        u = alloc.usage()
        assert u.used_blocks + u.free_blocks + u.cached_blocks == u.num_blocks, (
            "used + free + cached blocks do not add up to the pool")
        assert 0 <= u.used_tokens <= u.reserved_tokens, "used tokens exceed reserved tokens"
        tables = [b for r in live for b in alloc.block_table(r)]
        assert len(tables) == len(set(tables)), "a block is owned by two requests"
    for r in live:
        alloc.release(alloc.free(r))
    alloc.check_integrity()
    assert alloc.num_free_blocks() == 64, "blocks leaked after every request was freed"
    _next_tokens_contract(cls, options)


def _next_tokens_contract(cls: type, options: dict[str, Any] | None) -> None:
    """`allocate_next_tokens` leaves the state the default (`block_table`, `can_allocate`,
    `allocate` each) leaves: the same tables, None in the same places, the same usage, on a
    pool small enough to run short."""
    mine, ref = (registry.build(registry.resolve("kv_allocator", cls, options), 16, 4, 32)
                 for _ in range(2))
    rng = random.Random(2)
    reqs = []
    for i in range(6):
        r = _req(i, n=rng.randint(1, 9), max_tokens=24)
        if ref.can_allocate(r, r.num_prompt_tokens):
            for a in (mine, ref):
                a.allocate(r, r.num_prompt_tokens)
            reqs.append(r)
    for step in range(24):
        for r in reqs:  # decoding: the next token's position is its token count so far
            r.num_computed_tokens = min(r.num_prompt_tokens + step, 31)
        got = mine.allocate_next_tokens(reqs)
        want = KVAllocator.allocate_next_tokens(ref, reqs)
        assert got == want, (f"allocate_next_tokens() returned {got}; block_table() + "
                             f"can_allocate() + allocate() give {want}")
        assert mine.usage() == ref.usage(), (
            f"allocate_next_tokens() leaves usage {mine.usage()}; allocate() leaves "
            f"{ref.usage()}")
        mine.check_integrity()
        if step % 6 == 5 and len(reqs) > 1:  # a request ends: its blocks go back to the pool
            r = reqs.pop(rng.randrange(len(reqs)))
            for a in (mine, ref):
                a.release(a.free(r))


def prefix_cache_contract(cls: type[PrefixCache], options: dict[str, Any] | None = None) -> None:
    """Freed full blocks stay cached and match; match changes nothing; a full pool evicts."""
    cache = registry.resolve("prefix_cache", cls, options)
    alloc_name = "paged" if cls.requires_sharing else "contiguous"
    alloc = registry.load("kv_allocator", alloc_name)(32, 4, 64)
    kv = KVCacheManager(alloc, registry.build(cache, 4))
    tokens = list(range(10, 30))  # 5 full blocks
    a = Request("a", tokens, SamplingParams(max_tokens=4))
    kv.allocate(a, len(tokens))
    a.num_computed_tokens = len(tokens)
    kv.cache_computed(a)
    kv.free(a)
    kv.check_integrity()
    b = Request("b", tokens + [99], SamplingParams(max_tokens=4))
    m = kv.match_prefix(b)
    assert m.num_tokens == len(m.block_ids) * 4, "a match must be whole blocks"
    if cls.caches:
        assert m.num_tokens == 20, "a freed request's full blocks must stay cached"
        assert kv.match_prefix(b) == m, "a second match differs from the first"
    else:
        assert m.num_tokens == 0, "a cache with caches=False matched"
    if kv.prefix_cache is not None:
        pc = kv.prefix_cache
        probe = registry.build(cache, 4)  # a fresh cache: two sequences, then lookups only
        probe.insert(tokens[:8], [0, 1])
        probe.insert(list(range(40, 48)), [2, 3])
        first = probe.evict(1, lambda blk: True)
        probe2 = registry.build(cache, 4)
        probe2.insert(tokens[:8], [0, 1])
        probe2.insert(list(range(40, 48)), [2, 3])
        for _ in range(5):
            probe2.match(tokens[:8])
        assert probe2.evict(1, lambda blk: True) == first, (
            "match() changed what evict() gives up: a lookup must change no state (mark reuse "
            "in acquire())")
        pc.check_integrity()
    assert kv.can_allocate(b, b.num_tokens, m), "can_allocate() refused a cached prefix"
    reused = kv.allocate(b, b.num_tokens, m)
    assert reused.num_tokens == m.num_tokens, "allocate() did not reuse the matched prefix"
    b.num_computed_tokens = reused.num_tokens
    kv.check_integrity()
    c = Request("c", list(range(500, 620)), SamplingParams(max_tokens=1))
    kv.free(b)
    assert kv.can_allocate(c, 120), "cached blocks nobody holds must be evictable"
    kv.allocate(c, 120)
    kv.check_integrity()
    kv.free(c)
    kv.check_integrity()
    assert kv.usage().used_blocks == 0, "blocks still in use after every request was freed"


def attention_contract(cls: type[AttentionBackend], options: dict[str, Any] | None = None) -> None:
    """Decodes, a fresh prefill and a chunk over earlier context: output equals dense
    attention, and the new K/V land in the cache. Raises RuntimeError (skip) when the backend
    is not available on the CPU."""
    import torch

    from schedlab.attention import AttentionMetadata
    from schedlab.shapes import KVCacheSpec

    cls.check_available(torch.device("cpu"))
    torch.manual_seed(0)
    H, Hkv, D, bs = 4, 2, 16, 4
    spec = KVCacheSpec(num_layers=1, num_kv_heads=Hkv, head_dim=D, dtype=torch.float32,
                       block_size=bs)
    backend = registry.build(registry.resolve("attention", cls, options), spec, 40, "cpu")
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
            if p < cl - ql:
                kc[slot], vc[slot] = k_ctx[s][p], v_ctx[s][p]
            else:
                slots.append(slot)
                new_k.append(k_ctx[s][p])
                new_v.append(v_ctx[s][p])
    q = torch.randn(sum(q_lens), H, D)
    bt = torch.zeros(4, 4, dtype=torch.int32)
    for i, t in enumerate(tables):
        bt[i, : len(t)] = torch.tensor(t)
    meta = AttentionMetadata(
        slot_mapping=torch.tensor(slots),
        query_start_loc=torch.tensor([0, 1, 2, 9, 14], dtype=torch.int32),
        seq_lens=torch.tensor(ctx_lens, dtype=torch.int32), block_tables=bt,
        query_lens=q_lens, seq_lens_host=ctx_lens, num_decodes=2, max_query_len=7,
        max_seq_len=14)
    out = backend.forward(0, q, torch.stack(new_k), torch.stack(new_v), meta, D ** -0.5)
    ref = _dense_reference(q, k_ctx, v_ctx, q_lens, ctx_lens, D ** -0.5, H // Hkv)
    err = (out - ref).abs().max().item()
    assert err < 1e-3, f"attention output differs from dense attention by {err:.2e}"
    assert torch.equal(kc[torch.tensor(slots)], torch.stack(new_k)), (
        "the new K did not land in the cache slots")


def _dense_reference(q, k_ctx, v_ctx, q_lens, ctx_lens, scale, groups):
    import torch

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


def router_contract(cls: type, options: dict[str, Any] | None = None) -> None:
    """Random loads over pools of 1 to 5 instances: `select` returns an index in `[0, n)`
    every time, the hooks and `check_integrity` hold up, `bind` starts afresh. No model."""
    from schedlab.cluster.router import InstanceLoad

    router = cls(**(options or {}))
    rng = random.Random(2)
    name = cls.__qualname__
    for n in (1, 2, 3, 5):
        router.bind(n)
        routed: list[tuple[Request, int]] = []
        for i in range(60):
            req = _req(i, n=rng.randint(1, 40), priority=rng.randint(0, 3))
            loads = [InstanceLoad(
                index=j, num_running=rng.randint(0, 8), num_waiting=rng.randint(0, 8),
                outstanding_tokens=rng.choice([0, rng.randint(0, 4000)]),
                kv_free_blocks=rng.randint(0, 64), num_kv_blocks=64,
                cached_prefix_tokens=rng.choice([0, rng.randint(0, req.num_prompt_tokens)]))
                for j in range(n)]
            j = router.select(req, loads)
            assert isinstance(j, int) and not isinstance(j, bool) and 0 <= j < n, (
                f"{name}.select returned {j!r} over a pool of {n}; it must return an instance "
                f"index in [0, {n}) every time")
            router.on_routed(req, j)
            routed.append((req, j))
            if routed and rng.random() < 0.4:
                done, where = routed.pop(rng.randrange(len(routed)))
                router.on_finished(done, where)
            router.check_integrity()
        for done, where in routed:
            router.on_finished(done, where)
        router.check_integrity()


#: interface -> its unit contract
CONTRACTS: dict[str, Callable[[type, dict[str, Any] | None], None]] = {
    "queue": queue_contract,
    "kv_allocator": allocator_contract,
    "prefix_cache": prefix_cache_contract,
    "attention": attention_contract,
    "router": router_contract,
}
