"""Ordering policies: the contract every queue keeps, and each policy's order and victims."""

from __future__ import annotations

import random

import pytest

from schedlab import registry
from schedlab.kv_manager import KVCacheManager
from schedlab.request import Request, SamplingParams

QUEUES = registry.available("queue")


def req(rid: str, n: int = 4, t: float = 0.0, prio: int = 0, exp: int | None = None,
        tokens: list[int] | None = None) -> Request:
    return Request(rid, tokens if tokens is not None else [1] * n, SamplingParams(max_tokens=4),
                   arrival_time=t, priority=prio, expected_output_len=exp)


def make(name: str):
    return registry.load("queue", name)()


def ids(q) -> list[str]:
    return [r.request_id for r in q]


@pytest.mark.parametrize("name", QUEUES)
def test_contract_under_random_operations(name):
    rng = random.Random(0)
    q, inside, n = make(name), [], 0
    for _ in range(400):
        op = rng.random()
        if op < 0.45 or not inside:
            r = req(f"r{n}", n=rng.randint(1, 9), t=float(n), prio=rng.randint(0, 3),
                    exp=rng.choice([None, rng.randint(1, 9)]))
            n += 1
            q.add(r)
            inside.append(r)
        elif op < 0.75:
            head = q.peek()
            assert ids(q)[0] == head.request_id, "iteration disagrees with peek"
            assert q.pop() is head
            inside.remove(head)
            if rng.random() < 0.3:  # preempted and put back
                q.prepend(head)
                inside.append(head)
        else:
            r = rng.choice(inside)
            q.remove(r)
            inside.remove(r)
        q.check_integrity()
        assert len(q) == len(inside) and bool(q) == bool(inside)
        assert sorted(ids(q)) == sorted(r.request_id for r in inside)
        if inside:
            assert q.select_victim(inside) in inside
    while q:
        q.pop()
    with pytest.raises(IndexError):
        q.peek()
    with pytest.raises(IndexError):
        q.pop()
    with pytest.raises(ValueError):
        q.remove(req("absent"))


@pytest.mark.parametrize("name", QUEUES)
def test_options_are_refused_by_name(name):
    with pytest.raises(TypeError, match="bogus"):
        registry.load("queue", name)(bogus=1)


def test_fcfs_order_and_victim():
    q = make("fcfs")
    a, b, c = req("a", t=0), req("b", t=1), req("c", t=2)
    for r in (a, b, c):
        q.add(r)
    assert ids(q) == ["a", "b", "c"]
    assert q.select_victim([a, b, c]) is c
    q.pop()
    q.prepend(a)
    assert q.peek() is a



def test_a_subclass_that_counts_its_own_requests_is_empty_only_when_its_len_says_so():
    """FCFS answers `bool()` from its own deque; a subclass keeping requests elsewhere (its
    own `__len__`) is asked through its `len()`, so the engine never takes it for empty."""
    fcfs = registry.load("queue", "fcfs")

    class SideLane(fcfs):
        def __init__(self, **options):
            super().__init__(**options)
            self.side: list[Request] = []

        def add(self, request):
            self.side.append(request)

        def __len__(self):
            return super().__len__() + len(self.side)

    q = SideLane()
    assert not q
    q.add(req("a"))
    assert len(q) == 1 and q
    plain = make("fcfs")
    assert not plain
    plain.add(req("b"))
    assert plain

def test_priority_lower_value_first_fcfs_among_equals():
    q = make("priority")
    rs = [req("a", t=0, prio=2), req("b", t=1, prio=0), req("c", t=2, prio=1),
          req("d", t=3, prio=0), req("e", t=4, prio=2)]
    for r in rs:
        q.add(r)
    assert ids(q) == ["b", "d", "c", "a", "e"]
    # the victim is the lowest priority (highest value), then the latest arrival
    assert q.select_victim(rs).request_id == "e"
    assert q.select_victim(rs[:4]).request_id == "a"
    assert q.select_victim([rs[1], rs[3]]).request_id == "d"
    # a preempted request goes back to its place, ahead of later equals
    b = q.pop()
    q.add(req("f", t=5, prio=0))
    q.prepend(b)
    assert ids(q)[:3] == ["b", "d", "f"]


def test_sjf_shortest_prompt_first_or_shortest_known_output():
    q = make("sjf")
    rs = [req("long", n=30, t=0), req("short", n=3, t=1), req("mid", n=10, t=2),
          req("short2", n=3, t=3)]
    for r in rs:
        q.add(r)
    assert ids(q) == ["short", "short2", "mid", "long"]
    assert q.select_victim(rs).request_id == "long"
    q2 = make("sjf")
    known = [req("out9", n=2, exp=9, t=0), req("out1", n=50, exp=1, t=1),
             req("unknown", n=1, t=2)]
    for r in known:
        q2.add(r)
    assert ids(q2) == ["out1", "out9", "unknown"]


def test_lpm_unbound_is_fcfs():
    q = make("lpm")
    for i in range(4):
        q.add(req(f"r{i}", t=i))
    assert q.peek().request_id == "r0" and ids(q) == ["r0", "r1", "r2", "r3"]


def test_lpm_longest_cached_prefix_first(bound_lpm):
    q, kv = bound_lpm
    shared = list(range(10, 22))  # three blocks of 4, all cached
    rs = [req("miss", tokens=[7] * 12, t=0), req("one", tokens=shared[:4] + [9] * 8, t=1),
          req("all", tokens=shared + [5], t=2), req("two", tokens=shared[:8] + [1], t=3)]
    for r in rs:
        q.add(r)
    assert q.peek().request_id == "all"
    assert [q.num_matched_tokens(r) for r in rs] == [0, 4, 12, 8]
    assert ids(q) == ["all", "two", "one", "miss"]
    assert q.pop().request_id == "all"
    q.prepend(rs[0])  # a preempted request goes first whatever its match
    assert q.pop().request_id == "miss"
    assert [q.pop().request_id for _ in range(2)] == ["two", "one"]


@pytest.fixture
def bound_lpm():
    alloc = registry.load("kv_allocator", "paged")(16, 4, 64)
    cache = registry.load("prefix_cache", "radix")(4)
    kv = KVCacheManager(alloc, cache)
    owner = req("owner", tokens=list(range(10, 22)) + [0])
    kv.allocate(owner, 12)
    owner.num_computed_tokens = 12
    kv.cache_computed(owner)
    kv.free(owner)
    q = make("lpm")
    scheduler = registry.load("scheduler", "continuous")
    from schedlab.plan import SchedulerConfig

    limits = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=64,
                             long_prefill_threshold=0)
    scheduler(limits, kv, q)  # the scheduler binds its queue to the KV manager
    return q, kv


def test_a_queues_own_hooks_see_every_token_and_every_step():
    """`on_token` once per output token and `expire` once per step, whether the hook is the
    queue class's or set on the instance (the engine skips only the base's no-ops)."""
    from fakes import fake_engine

    from schedlab.plugins.queues.fcfs import FCFSQueue

    class Counting(FCFSQueue):
        def __init__(self) -> None:
            super().__init__()
            self.tokens = self.steps = 0
            self.expire = self._expire  # an instance attribute, set before the engine binds

        def on_token(self, request: Request) -> None:
            self.tokens += 1

        def _expire(self, now: float) -> list:
            self.steps += 1
            return []

    eng = fake_engine(queue=Counting)
    for i in range(5):
        eng.add_request([1 + i, 2, 3], SamplingParams(temperature=0.0, max_tokens=4 + i,
                                                      ignore_eos=True))
    eng.run_until_done(check=True)
    q = eng.scheduler.waiting
    assert q.tokens == sum(len(r.output_token_ids) for r in eng.requests.values()) == 30
    assert q.steps == eng.counters().num_steps
