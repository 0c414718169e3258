"""Hash-based block prefix caching, as vLLM's automatic prefix caching and nano-vllm."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from schedlab.prefix_cache import PrefixCache, PrefixMatch

#: the parent hash of a sequence's first block
ROOT_HASH = 0


@dataclass(slots=True)
class _Entry:
    block_id: int
    parent_hash: int
    tokens: tuple[int, ...]
    hash: int


class HashBlockPrefixCache(PrefixCache):
    """Full blocks keyed by a chained hash: hash(parent block's hash, this block's tokens).

    A block's key thus stands for its whole prefix, so a lookup walks the prompt block by
    block and stops at the first miss. On a hit the stored tokens and parent hash are compared
    with the query's, so a hash collision is a miss, never a wrong block. Blocks stay cached
    after their requests finish; reference counts live in the allocator, and `evict` gives up
    unreferenced blocks least recently used first (a block's last use is its insert, its
    reuse by an admitted request (`acquire`), or the moment a request let go of it (`release`);
    a lookup alone does not count).
    """

    def __init__(self, block_size: int, **options: object) -> None:
        super().__init__(block_size, **options)
        self._by_hash: dict[int, _Entry] = {}
        self._by_block: dict[int, _Entry] = {}
        # NOTE: oldest first. Blocks of one sequence are touched tail first, so its tail
        # blocks are evicted before its head (the head is the more widely shared part).
        self._lru: OrderedDict[int, None] = OrderedDict()

    def hash_block(self, parent_hash: int, tokens: tuple[int, ...]) -> int:
        """The key of a block with these tokens after the block hashed `parent_hash`."""
        return hash((parent_hash, tokens))

    def _blocks(self, token_ids: Sequence[int], num_blocks: int):
        bs = self.block_size
        parent = ROOT_HASH
        for i in range(num_blocks):
            tokens = tuple(token_ids[i * bs : (i + 1) * bs])
            h = self.hash_block(parent, tokens)
            yield i, parent, tokens, h
            parent = h

    def _touch(self, block_ids: Sequence[int]) -> None:
        for b in reversed(block_ids):
            self._lru.move_to_end(b)

    def match(self, token_ids: Sequence[int]) -> PrefixMatch:
        blocks: list[int] = []
        for _, parent, tokens, h in self._blocks(token_ids, len(token_ids) // self.block_size):
            e = self._by_hash.get(h)
            if e is None or e.tokens != tokens or e.parent_hash != parent:
                break
            blocks.append(e.block_id)
        return PrefixMatch(blocks, len(blocks) * self.block_size)

    def acquire(self, block_ids: Sequence[int]) -> None:
        self._touch(block_ids)

    def release(self, block_ids: Sequence[int]) -> None:
        self._touch(block_ids)

    def insert(self, token_ids: Sequence[int], block_ids: Sequence[int]) -> int:
        new: list[int] = []
        for i, parent, tokens, h in self._blocks(token_ids, len(block_ids)):
            e = self._by_hash.get(h)
            if e is not None:
                if e.tokens != tokens or e.parent_hash != parent:
                    break  # a collision: nothing below this block could be found again
                continue  # already cached (this block or a duplicate holding the same tokens)
            b = block_ids[i]
            if b in self._by_block:
                continue
            e = _Entry(b, parent, tokens, h)
            self._by_hash[h] = e
            self._by_block[b] = e
            self._lru[b] = None
            new.append(b)
        self._touch(new)
        return len(new)

    def evict(self, num_blocks: int, is_unused: Callable[[int], bool]) -> list[int]:
        evicted: list[int] = []
        for b in self._lru:
            if len(evicted) >= num_blocks:
                break
            if is_unused(b):
                evicted.append(b)
        for b in evicted:
            e = self._by_block.pop(b)
            del self._by_hash[e.hash]
            del self._lru[b]
        return evicted

    def is_cached(self, block_id: int) -> bool:
        return block_id in self._by_block

    def num_cached_blocks(self) -> int:
        return len(self._by_block)

    def check_integrity(self) -> None:
        assert len(self._by_hash) == len(self._by_block) == len(self._lru), "indexes disagree"
        for b, e in self._by_block.items():
            assert e.block_id == b, f"block {b} filed under block {e.block_id}"
            assert self._by_hash.get(e.hash) is e, f"block {b} missing from the hash index"
            assert len(e.tokens) == self.block_size, f"block {b} is not a full block"
            assert e.hash == self.hash_block(e.parent_hash, e.tokens), f"block {b} hash is stale"
            assert b in self._lru, f"block {b} missing from the LRU order"
