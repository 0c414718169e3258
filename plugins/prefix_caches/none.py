"""No prefix caching: every request computes its whole prompt."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from schedlab.prefix_cache import PrefixCache, PrefixMatch


class NoPrefixCache(PrefixCache):
    """Caches nothing; works with every allocator."""

    requires_sharing = False
    caches = False

    def match(self, token_ids: Sequence[int]) -> PrefixMatch:
        return PrefixMatch([], 0)

    def insert(self, token_ids: Sequence[int], block_ids: Sequence[int]) -> int:
        return 0

    def evict(self, num_blocks: int, is_unused: Callable[[int], bool]) -> list[int]:
        return []

    def is_cached(self, block_id: int) -> bool:
        return False

    def num_cached_blocks(self) -> int:
        return 0
