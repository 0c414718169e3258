"""The paged allocator's one-pass `allocate_next_tokens` against the ABC's general one
(`block_table`, `can_allocate` and `allocate` per request): the same tables, the same blocks
in the same order, the same usage, step after step, a pool running short included."""

from __future__ import annotations

import random

import pytest

from schedlab.kv_allocator import KVAllocator
from schedlab.plugins.kv_allocators.paged import PagedKVAllocator
from schedlab.request import Request, SamplingParams


def _requests(rng: random.Random, num: int) -> list[Request]:
    reqs = []
    for i in range(num):
        r = Request(str(i), [2] * rng.randint(1, 40), SamplingParams(max_tokens=64))
        reqs.append(r)
    return reqs


@pytest.mark.parametrize("seed", range(12))
def test_one_pass_matches_the_general_path(seed):
    rng = random.Random(seed)
    num_blocks = rng.choice([8, 24, 64])
    fast = PagedKVAllocator(num_blocks, 4, 512)
    general = PagedKVAllocator(num_blocks, 4, 512)
    twins = [_requests(random.Random(seed), 10) for _ in range(2)]
    for step in range(40):
        for reqs, alloc in zip(twins, (fast, general), strict=True):
            for r in reqs:  # a table shorter than the computed tokens needs more than a block
                n = len(r.prompt_token_ids)
                if step == 0 and int(r.request_id) % 3 == 0 and alloc.can_allocate(r, n):
                    alloc.allocate(r, n)
                    r.num_computed_tokens = len(r.prompt_token_ids) + 4
        got = fast.allocate_next_tokens(twins[0])
        want = KVAllocator.allocate_next_tokens(general, twins[1])
        assert [t is None for t in got] == [t is None for t in want]
        assert [t for t in got if t is not None] == [t for t in want if t is not None]
        for a, b in zip(*twins, strict=True):
            assert fast.block_table(a) == general.block_table(b)
        assert fast.usage() == general.usage()
        fast.check_integrity()
        for reqs, alloc, tables in zip(twins, (fast, general), (got, want), strict=True):
            for r, t in zip(reqs, tables, strict=True):
                if t is not None:
                    r.num_computed_tokens += 1
            if step % 7 == 6:  # one leaves: its blocks go back to the pool
                r = reqs[step % len(reqs)]
                alloc.release(alloc.free(r))
                r.num_computed_tokens = 0
