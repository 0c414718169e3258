"""Unit tests of the prefix caches: match, insert, evict in LRU order, collisions, the tree."""

from __future__ import annotations

import pytest

from schedlab import registry
from schedlab.plugins.prefix_caches.hash_block import HashBlockPrefixCache

BS = 4
CACHES = ["hash_block", "radix"]
T = list(range(100, 112))  # three full blocks
U = list(range(200, 208))  # two full blocks, different from T from the first token


def make(name: str):
    return registry.load("prefix_cache", name)(BS)


def unused(in_use: set[int] = frozenset()):
    return lambda b: b not in in_use


@pytest.mark.parametrize("name", CACHES)
def test_match_returns_whole_blocks_of_the_longest_cached_prefix(name):
    c = make(name)
    assert c.match(T).block_ids == []
    assert c.insert(T, [0, 1, 2]) == 3
    c.check_integrity()
    assert c.match(T) == ([0, 1, 2], 12)
    assert c.match(T + [1, 2]) == ([0, 1, 2], 12)  # a partial trailing block never matches
    assert c.match(T[:7]) == ([0], 4)
    assert c.match(T[:4] + [999] + T[5:]) == ([0], 4)  # stops at the first differing block
    assert c.match(U) == ([], 0)
    assert all(c.is_cached(b) for b in (0, 1, 2)) and not c.is_cached(3)
    assert c.num_cached_blocks() == 3


@pytest.mark.parametrize("name", CACHES)
def test_insert_is_idempotent_and_extends(name):
    c = make(name)
    assert c.insert(T[:8], [0, 1]) == 2
    assert c.insert(T[:8], [0, 1]) == 0
    assert c.insert(T, [0, 1, 2]) == 1  # the same request, one more block computed
    c.check_integrity()
    assert c.match(T).block_ids == [0, 1, 2]


@pytest.mark.parametrize("name", CACHES)
def test_diverging_sequences_share_their_common_blocks(name):
    c = make(name)
    c.insert(T, [0, 1, 2])
    other = T[:4] + U  # shares block 0, then differs
    assert c.insert(other, [0, 5, 6]) == 2
    c.check_integrity()
    assert c.match(other).block_ids == [0, 5, 6]
    assert c.match(T).block_ids == [0, 1, 2]
    # diverging inside a block: only the blocks before it are shared
    assert c.match(T[:6] + [1, 1]).block_ids == [0]


@pytest.mark.parametrize("name", CACHES)
def test_duplicate_blocks_for_cached_tokens_are_not_cached(name):
    c = make(name)
    c.insert(T[:8], [0, 1])
    # another request computed the same two blocks at the same time in blocks 5 and 6
    c.insert(T[:8], [5, 6])
    c.check_integrity()
    assert not c.is_cached(5) and not c.is_cached(6)
    assert c.match(T).block_ids == [0, 1]


@pytest.mark.parametrize("name", CACHES)
def test_evict_least_recently_used_first_tail_first(name):
    c = make(name)
    c.insert(T[:8], [0, 1])
    c.insert(U, [2, 3])
    c.acquire(c.match(T).block_ids)  # T's blocks are now the most recently used
    assert c.evict(1, unused()) == [3]  # U's tail goes first
    assert c.evict(1, unused()) == [2]
    c.check_integrity()
    assert c.match(U).block_ids == []
    assert c.match(T).block_ids == [0, 1]
    assert c.num_cached_blocks() == 2


@pytest.mark.parametrize("name", CACHES)
def test_evict_skips_blocks_in_use_and_returns_at_most_asked(name):
    c = make(name)
    c.insert(T[:8], [0, 1])
    c.insert(U, [2, 3])
    c.acquire(c.match(T).block_ids)
    assert c.evict(1, unused({2, 3})) == [1]  # U is held by a request
    assert c.evict(5, unused({2, 3})) == [0]
    assert c.evict(5, unused({2, 3})) == []
    c.check_integrity()
    assert c.num_cached_blocks() == 2 and c.match(U).block_ids == [2, 3]


@pytest.mark.parametrize("name", CACHES)
def test_evict_then_reinsert(name):
    c = make(name)
    c.insert(T, [0, 1, 2])
    assert sorted(c.evict(10, unused())) == [0, 1, 2]
    assert c.num_cached_blocks() == 0
    assert c.insert(T, [7, 8, 9]) == 3
    c.check_integrity()
    assert c.match(T).block_ids == [7, 8, 9]


def test_hash_block_recompares_tokens_on_a_hash_hit():
    class Colliding(HashBlockPrefixCache):
        def hash_block(self, parent_hash, tokens):
            return 7  # every block collides

    c = Colliding(BS)
    c.insert(T[:4], [0])
    assert c.match(U[:4]).block_ids == []  # same hash, other tokens: a miss
    assert c.insert(U[:4], [1]) == 0  # the colliding block is not cached over the first
    c.check_integrity()
    assert c.match(T[:4]).block_ids == [0]


def test_hash_block_recompares_the_parent_on_a_hash_hit():
    class ParentBlind(HashBlockPrefixCache):
        def hash_block(self, parent_hash, tokens):
            return hash(tokens)  # a chain that forgets its parent

    c = ParentBlind(BS)
    c.insert(T[:8], [0, 1])
    # block 1's tokens after a different first block: same key, different parent
    assert c.match(U[:4] + T[4:8]).block_ids == []


def test_hash_block_keeps_a_duplicate_chain_child():
    c = make("hash_block")
    c.insert(T[:8], [0, 1])
    # the same two blocks computed again as 5, 6 (not cached), then a new third block 7
    assert c.insert(T, [5, 6, 7]) == 1
    assert c.match(T).block_ids == [0, 1, 7]
    # hash chaining: evicting a parent leaves the child cached but unreachable until the
    # parent's tokens are cached again
    assert c.evict(1, unused({0, 7})) == [1]
    assert c.match(T).block_ids == [0]
    c.insert(T[:8], [0, 4])
    assert c.match(T).block_ids == [0, 4, 7]


def test_radix_splits_a_node_where_sequences_part():
    c = make("radix")
    c.insert(T, [0, 1, 2])  # one node of three blocks
    c.insert(T[:8] + U[:4], [0, 1, 3])
    c.check_integrity()
    root_children = list(c._root.children.values())
    assert len(root_children) == 1 and root_children[0].blocks == [0, 1]
    assert sorted(n.blocks[0] for n in root_children[0].children.values()) == [2, 3]


def test_radix_keeps_a_node_whose_child_is_in_use():
    c = make("radix")
    c.insert(T[:8], [0, 1])
    c.insert(T, [0, 1, 2])
    c.insert(U, [3, 4])
    # 2 is held, so its ancestors 0 and 1 are too; only U's blocks can go
    assert sorted(c.evict(5, unused({0, 1, 2}))) == [3, 4]
    c.check_integrity()
    assert c.match(T).block_ids == [0, 1, 2]


def test_radix_stops_caching_where_a_request_holds_duplicates():
    c = make("radix")
    c.insert(T[:8], [0, 1])
    # computed concurrently: the same tokens in 5, 6 and a third block 7
    assert c.insert(T, [5, 6, 7]) == 0
    assert not any(c.is_cached(b) for b in (5, 6, 7))
    c.check_integrity()


def test_radix_evicts_part_of_a_leaf():
    c = make("radix")
    c.insert(T, [0, 1, 2])
    assert c.evict(1, unused()) == [2]
    c.check_integrity()
    assert c.match(T).block_ids == [0, 1]


@pytest.mark.parametrize("name", CACHES)
def test_match_changes_nothing_only_acquire_and_release_mark_use(name):
    c = make(name)
    c.insert(T[:8], [0, 1])
    c.insert(U, [2, 3])
    for _ in range(5):  # lookups, as a cache-aware queue makes them, are not reuse
        assert c.match(T).block_ids == [0, 1]
    assert c.evict(1, unused()) == [1], "a lookup must not refresh T's blocks"
    c.acquire(c.match(U).block_ids)
    c.release([0])
    assert c.evict(1, unused()) == [3], "acquire and release mark blocks used"
    c.check_integrity()
