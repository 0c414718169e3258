"""The prefix-cache interface: reuse of computed KV blocks across requests."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import NamedTuple


class PrefixMatch(NamedTuple):
    """The longest cached prefix of a token sequence, in whole blocks."""

    block_ids: list[int]
    num_tokens: int


class PrefixCache(ABC):
    """Maps token prefixes (whole blocks) to the blocks holding their K/V.

    The allocator counts references; the cache remembers which blocks hold which tokens,
    keeps unreferenced ones after their requests finish, and gives them up (evicts) only
    when the pool needs them.

    A lookup (`match`) changes nothing: policies may call it as often as they like (a
    cache-aware queue does, per waiting request, per step). Reuse is reported separately:
    `acquire` when a request starts using matched blocks, `release` when a request that held
    cached blocks lets go of them. Recency or frequency bookkeeping for eviction belongs there.

    The KV manager calls, per request: `match` (any number of times while it waits), then
    `acquire(match.block_ids)` once when it is admitted with a hit, `insert` as its blocks fill
    up, and `release` with its cached prefix when its KV is freed.

    Args:
        block_size: token slots per block (the unit of caching).
    """

    #: whether the cache needs an allocator that shares blocks (`KVAllocator.supports_sharing`)
    requires_sharing: bool = True
    #: False only for the `none` cache: the engine then skips prefix bookkeeping entirely
    caches: bool = True

    def __init__(self, block_size: int, **options: object) -> None:
        if options:
            raise TypeError(f"{type(self).__name__} takes no options, got {sorted(options)}")
        self.block_size = block_size

    @abstractmethod
    def match(self, token_ids: Sequence[int]) -> PrefixMatch:
        """Find the longest cached prefix made of whole blocks. No state change.

        Returns:
            The blocks, in order, and how many tokens they hold (a multiple of block_size).
        """

    def acquire(self, block_ids: Sequence[int]) -> None:  # noqa: B027 (optional hook)
        """A request is admitted reusing these cached blocks (a prefix of a `match` result):
        a real hit. Changes state: the place to count reuse or mark recent use.
        Default: nothing."""

    def release(self, block_ids: Sequence[int]) -> None:  # noqa: B027 (optional hook)
        """A request that used these cached blocks freed its KV (it finished, was preempted or
        aborted); a block becomes evictable once no request holds it. Changes state: an LRU
        cache counts a block's last use from here. Default: nothing."""

    @abstractmethod
    def insert(self, token_ids: Sequence[int], block_ids: Sequence[int]) -> int:
        """Record that `block_ids[i]` holds tokens `token_ids[i*bs:(i+1)*bs]`. Changes state.

        Only whole blocks are passed. Blocks already cached for the same tokens are kept as
        they are (the new duplicate is not cached).

        Returns:
            The number of blocks newly cached.
        """

    @abstractmethod
    def evict(self, num_blocks: int, is_unused: Callable[[int], bool]) -> list[int]:
        """Forget up to `num_blocks` cached blocks that no request holds, least recently used
        first. Changes state.

        Returns:
            The evicted blocks, which the caller returns to the free pool.
        """

    @abstractmethod
    def is_cached(self, block_id: int) -> bool:
        """Whether the cache holds this block. No state change."""

    @abstractmethod
    def num_cached_blocks(self) -> int:
        """Blocks the cache holds (referenced or not). No state change."""

    def check_integrity(self) -> None:  # noqa: B027 (optional hook)
        """Raise AssertionError if the cache's internal structures disagree."""
