"""Property-based invariants of every scheduler x queue x allocator x prefix cache.

Random workloads (prompt lengths, shared prefixes, arrival steps, priorities, tiny KV pools,
both preemption modes) run through the scheduler stack built from the registry, with a fake
executor that keeps a model-free KV cache (`schedlab.testing`'s `CheckingExecutor`): each slot
records which (token, position) was written there, so a request that attends over a wrong or
stale block is caught, and sampled tokens are a deterministic function of the sequence, so
preemption must not change outputs.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, given, settings, target
from hypothesis import strategies as st

from schedlab import registry
from schedlab.config import EngineConfig
from schedlab.kv_manager import KVCacheManager
from schedlab.plan import SchedulerConfig, SchedulerOutput
from schedlab.request import Request, RequestStatus, SamplingParams
from schedlab.scheduler import Scheduler
from schedlab.testing.executor import EOS, VOCAB, CheckingExecutor, reference_output


@dataclass
class Workload:
    block_size: int
    max_len: int
    num_blocks: int
    budget: int
    max_num_seqs: int
    long_prefill_threshold: int
    num_swap_blocks: int
    reserve: str
    requests: list[tuple[int, list[int], int, int, int | None]]  # arrival, prompt, max, prio, exp


@st.composite
def workloads(draw, chunks_prefill: bool) -> Workload:
    bs = draw(st.sampled_from([1, 2, 4]))
    max_len = draw(st.integers(6, 40))
    budget = draw(st.integers(1, 24) if chunks_prefill else st.integers(max_len, 2 * max_len))
    tok = st.integers(1, VOCAB - 1)
    prefixes = draw(st.lists(st.lists(tok, max_size=16), min_size=1, max_size=3))
    reqs = []
    for _ in range(draw(st.integers(1, 8))):
        prefix = draw(st.sampled_from(prefixes))
        # max_tokens now and then one too many for max_len: the request is rejected
        prompt = (prefix + draw(st.lists(tok, max_size=10)))[: max_len - 1] or [1]
        reqs.append((
            draw(st.integers(0, 3)),
            prompt,
            draw(st.integers(1, max_len - len(prompt) + draw(st.sampled_from([0] * 9 + [1])))),
            draw(st.integers(0, 2)),
            draw(st.none() | st.integers(1, 10)),
        ))
    # a pool that fits the largest request (now and then not), too small for them all at once
    largest = max(-(-min(len(p) + m, max_len) // bs) for _, p, m, _, _ in reqs)
    num_blocks = draw(st.integers(max(1, largest - 1), largest + 4))
    return Workload(
        block_size=bs,
        max_len=max_len,
        num_blocks=num_blocks,
        budget=budget,
        max_num_seqs=draw(st.integers(1, 4)),
        long_prefill_threshold=draw(st.sampled_from([0, 0, 1, 3, 8])),
        num_swap_blocks=draw(st.sampled_from([0, 0, 2, 8, 64])),
        reserve=draw(st.sampled_from(["max_model_len", "request"])),
        requests=reqs,
    )


def build(names: tuple[str, str, str, str], w: Workload) -> Scheduler:
    sched_name, queue_name, alloc_name, cache_name = names
    alloc_cls = registry.load("kv_allocator", alloc_name)
    opts = {"reserve": w.reserve} if alloc_name == "contiguous" else {}
    alloc = alloc_cls(w.num_blocks, w.block_size, w.max_len, **opts)
    cache = registry.load("prefix_cache", cache_name)(w.block_size)
    kv = KVCacheManager(alloc, cache, w.num_swap_blocks)
    cfg = SchedulerConfig(max_num_seqs=w.max_num_seqs, max_num_batched_tokens=w.budget,
                          max_model_len=w.max_len, long_prefill_threshold=w.long_prefill_threshold)
    return registry.load("scheduler", sched_name)(cfg, kv, registry.load("queue", queue_name)())


def check_plan(sched: Scheduler, plan: SchedulerOutput) -> None:
    cfg, bs = sched.config, sched.kv.block_size
    assert plan.num_batched_tokens <= cfg.max_num_batched_tokens, "token budget exceeded"
    assert len(plan.scheduled) <= cfg.max_num_seqs, "max_num_seqs exceeded"
    ids = [id(s.request) for s in plan.scheduled]
    assert len(set(ids)) == len(ids), "a request scheduled twice in one step"
    running = {id(r) for r in sched.running}
    for s in plan.scheduled:
        r = s.request
        assert id(r) in running and s.num_new_tokens >= 1
        assert s.start == r.num_computed_tokens and s.start + s.num_new_tokens <= r.num_tokens
        assert len(s.block_ids) * bs >= s.start + s.num_new_tokens, "KV not allocated"
        if sched.chunks_prefill and cfg.long_prefill_threshold:
            assert s.num_new_tokens <= cfg.long_prefill_threshold, "chunk over the threshold"
    assert not {id(r) for r in plan.preempted} & set(ids), "a preempted request was scheduled"


def check_pool(sched: Scheduler) -> None:
    kv, alloc = sched.kv, sched.kv.allocator
    bs = kv.block_size
    holders: dict[int, list[tuple[Request, int]]] = defaultdict(list)
    for r in sched.running:
        for i, b in enumerate(alloc.block_table(r)):
            holders[b].append((r, i))
    for r in sched.waiting:
        assert not alloc.block_table(r), "a waiting request holds KV"
    for b in range(alloc.num_blocks):
        hs = holders.get(b, [])
        assert alloc.ref_count(b) == len(hs), f"block {b}: refs {alloc.ref_count(b)} != {len(hs)}"
        if len(hs) > 1:
            assert kv.prefix_cache is not None and kv.prefix_cache.is_cached(b), (
                f"block {b} owned by several requests but not through the prefix cache")
            pos = {i for _, i in hs}
            assert len(pos) == 1, f"shared block {b} at different positions"
            end = (pos.pop() + 1) * bs
            assert len({tuple(r.token_slice(0, end)) for r, _ in hs}) == 1, (
                f"block {b} shared by requests whose prefixes differ")
            assert all(r.num_computed_tokens >= end for r, _ in hs)
        if not hs and not alloc.is_free(b):
            assert kv.prefix_cache is not None and kv.prefix_cache.is_cached(b), f"{b} leaked"
    u = alloc.usage()
    assert u.used_blocks + u.free_blocks + u.cached_blocks == u.num_blocks
    assert u.used_blocks == len(holders)


def drive(names: tuple[str, str, str, str], w: Workload) -> Scheduler:
    sched = build(names, w)
    kv = sched.kv
    fake = CheckingExecutor(EngineConfig(model='checking', block_size=w.block_size))
    fake.bind(kv)
    pending: dict[int, list[Request]] = defaultdict(list)
    live: list[Request] = []
    for i, (arrival, prompt, max_tokens, prio, exp) in enumerate(w.requests):
        sp = SamplingParams(temperature=0.0, max_tokens=max_tokens)
        r = Request(f"r{i}", prompt, sp, arrival_time=float(arrival), priority=prio,
                    expected_output_len=exp, eos_token_ids=frozenset({EOS}))
        pending[arrival].append(r)
    max_steps = 40 + 20 * sum(len(p) + m for _, p, m, _, _ in w.requests)
    for step in range(max_steps):
        for r in pending.pop(step, []):
            # the engine's admission check: a request that can never fit is rejected
            if r.max_total_tokens > w.max_len or (
                kv.allocator.blocks_needed(r, r.max_total_tokens) > w.num_blocks
            ):
                r.status = RequestStatus.REJECTED
            else:
                sched.add_request(r)
            live.append(r)
        if not pending and not sched.has_unfinished():
            break
        plan = sched.schedule()
        check_plan(sched, plan)
        if plan.is_empty:
            assert not sched.has_unfinished(), f"stuck at step {step}: nothing could be scheduled"
        for s in plan.scheduled:
            if s.request.metrics.first_scheduled_time is None:
                s.request.metrics.first_scheduled_time = float(step)
        sampled = fake.execute(plan).sampled_token_ids
        sched.update_from_output(plan, sampled, float(step))
        sched.check_integrity()
        check_pool(sched)
    else:
        pytest.fail(f"not done after {max_steps} steps")
    for r in live:
        assert r.is_finished, f"{r.request_id} lost in state {r.status}"
        if r.status is not RequestStatus.REJECTED:
            assert r.output_token_ids == reference_output(r, w.max_len), r.request_id
    u = kv.usage()
    assert u.used_blocks == 0 and u.free_blocks + u.cached_blocks == u.num_blocks, "pool not whole"
    assert kv.num_free_host_blocks() == w.num_swap_blocks, "host slots not returned"
    assert not fake.host, "host copies left behind"
    return sched


def combos() -> list[tuple[str, str, str, str]]:
    out = []
    for s in registry.available("scheduler"):
        for q in registry.available("queue"):
            for a in registry.available("kv_allocator"):
                for c in registry.available("prefix_cache"):
                    alloc = registry.load("kv_allocator", a)
                    if registry.load("prefix_cache", c).requires_sharing and not (
                        alloc.supports_sharing
                    ):
                        continue  # the engine refuses this combination
                    out.append((s, q, a, c))
    return out


COMBOS = combos()


def _test(names, max_examples):
    chunks = registry.load("scheduler", names[0]).chunks_prefill

    @settings(max_examples=max_examples, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(w=workloads(chunks))
    def run(w):
        sched = drive(names, w)
        target(float(sched.num_preemptions), label="preemptions")

    run()


@pytest.mark.parametrize("names", COMBOS, ids=["-".join(c) for c in COMBOS])
def test_invariants(names):
    _test(names, max_examples=25)


@pytest.mark.slow
@pytest.mark.parametrize("names", COMBOS, ids=["-".join(c) for c in COMBOS])
def test_invariants_many(names):
    _test(names, max_examples=300)


def test_every_combination_is_covered():
    assert len(COMBOS) >= 3 * 4 * 4, COMBOS  # schedulers x queues x (paged x 3 + contiguous)


def test_preempted_again_before_its_kv_came_back_keeps_the_host_copy():
    alloc = registry.load("kv_allocator", "paged")(8, 2, 32)
    kv = KVCacheManager(alloc, None, num_swap_blocks=4)
    r = Request("r", [1, 2, 3, 4, 5], SamplingParams(max_tokens=4))
    kv.allocate(r, 5)
    r.num_computed_tokens = 5
    out = kv.swap_out(r)
    assert [d for d, _ in out] == [0, 1, 2] and kv.is_swapped(r) and not alloc.block_table(r)
    kv.allocate(r, 6)  # re-admitted ...
    assert kv.swap_out(r) == []  # ... and preempted again before it ran: nothing to copy
    assert kv.is_swapped(r) and kv.num_free_host_blocks() == 1
    kv.allocate(r, 6)
    back = kv.swap_in(r)
    assert [h for h, _ in back] == [h for _, h in out] and not kv.is_swapped(r)
    assert [d for _, d in back] == alloc.block_table(r)[:3]
    kv.check_integrity()
    kv.free(r)
    assert kv.num_free_host_blocks() == 4 and alloc.num_free_blocks() == 8
