"""KV admission mechanism: an allocator and a prefix cache composed behind one narrow API.

Schedulers talk to this class only; they never know which allocator or cache they got.
"""

from __future__ import annotations

from schedlab.kv import KVAllocator, KVUsage
from schedlab.prefix_cache import PrefixCache, PrefixMatch
from schedlab.request import Request

_NO_MATCH = PrefixMatch([], 0)


class KVCacheManager:
    """Allocation, freeing and prefix reuse for the scheduler.

    NOTE: every block is in exactly one state: free (in the allocator's pool), in use
    (referenced by at least one live request) or cached (held only by the prefix cache,
    evictable). free + in use + cached = the pool, checked by `check_integrity`.
    """

    def __init__(self, allocator: KVAllocator, prefix_cache: PrefixCache | None) -> None:
        self.allocator = allocator
        self.prefix_cache = prefix_cache if prefix_cache is not None and prefix_cache.caches else None
        self.block_size = allocator.block_size
        self._num_inserted: dict[str, int] = {}  # request id -> blocks already offered to the cache
        self.num_prefix_hit_tokens = 0
        self.num_prefix_query_tokens = 0

    # ---- queries (no state change) -------------------------------------------------------
    def num_evictable_blocks(self) -> int:
        u = self.allocator.usage()
        return u.num_blocks - u.free_blocks - u.used_blocks

    def num_available_blocks(self) -> int:
        """Free blocks plus cached blocks nobody holds."""
        return self.allocator.num_free_blocks() + self.num_evictable_blocks()

    def match_prefix(self, request: Request) -> PrefixMatch:
        """The reusable cached prefix for a request that holds no KV yet.

        At least one token is always left to compute, so the step produces logits.
        """
        if self.prefix_cache is None or request.num_computed_tokens > 0:
            return _NO_MATCH
        tokens = request.all_token_ids
        m = self.prefix_cache.match(tokens)
        max_blocks = (len(tokens) - 1) // self.block_size
        if len(m.block_ids) > max_blocks:
            m = PrefixMatch(m.block_ids[:max_blocks], max_blocks * self.block_size)
        return m

    def can_allocate(self, request: Request, num_tokens: int, prefix: PrefixMatch = _NO_MATCH) -> bool:
        """Whether the request's KV can grow to `num_tokens` tokens (after sharing `prefix`)."""
        evictable = self.num_evictable_blocks() if self.prefix_cache is not None else 0
        if not prefix.block_ids:
            return self.allocator.can_allocate(request, num_tokens, num_extra_free=evictable)
        # A shared block that nobody holds stops being evictable once shared.
        revived = sum(1 for b in prefix.block_ids if self.allocator.ref_count(b) == 0)
        have = len(self.allocator.block_table(request)) + len(prefix.block_ids)
        needed = max(0, self.allocator.blocks_for(num_tokens) - have)
        return needed <= self.allocator.num_free_blocks() + evictable - revived

    # ---- changes -------------------------------------------------------------------------
    def allocate(self, request: Request, num_tokens: int, prefix: PrefixMatch = _NO_MATCH) -> None:
        """Give the request KV for `num_tokens` tokens, reusing `prefix` first.

        Raises:
            RuntimeError: not enough blocks (call `can_allocate` first).
        """
        if prefix.block_ids:
            self.allocator.share(request, prefix.block_ids)
            request.num_computed_tokens = prefix.num_tokens
            request.metrics.num_cached_tokens += prefix.num_tokens
            self._num_inserted[request.request_id] = len(prefix.block_ids)
        if self.prefix_cache is not None:
            short = self.allocator.blocks_needed(request, num_tokens) - self.allocator.num_free_blocks()
            if short > 0:
                evicted = self.prefix_cache.evict(short, self._is_unused)
                self.allocator.release(evicted)
        self.allocator.allocate(request, num_tokens)

    def record_lookup(self, request: Request, prefix: PrefixMatch) -> None:
        """Count a request's first prefix lookup for the hit rate (in tokens)."""
        self.num_prefix_query_tokens += request.num_prompt_tokens
        self.num_prefix_hit_tokens += prefix.num_tokens

    def cache_computed(self, request: Request) -> None:
        """Offer the request's newly completed full blocks to the prefix cache. Changes state."""
        if self.prefix_cache is None:
            return
        num_full = request.num_computed_tokens // self.block_size
        done = self._num_inserted.get(request.request_id, 0)
        if num_full <= done:
            return
        table = self.allocator.block_table(request)
        tokens = request.token_slice(0, num_full * self.block_size)
        self.prefix_cache.insert(tokens, table[:num_full])
        self._num_inserted[request.request_id] = num_full

    def free(self, request: Request) -> None:
        """Release the request's KV; blocks the prefix cache holds stay cached. Changes state."""
        self._num_inserted.pop(request.request_id, None)
        orphaned = self.allocator.free(request)
        if self.prefix_cache is not None:
            orphaned = [b for b in orphaned if not self.prefix_cache.is_cached(b)]
        self.allocator.release(orphaned)

    def _is_unused(self, block_id: int) -> bool:
        return self.allocator.ref_count(block_id) == 0

    # ---- accounting ----------------------------------------------------------------------
    def usage(self) -> KVUsage:
        return self.allocator.usage()

    @property
    def prefix_hit_rate(self) -> float:
        if self.num_prefix_query_tokens == 0:
            return 0.0
        return self.num_prefix_hit_tokens / self.num_prefix_query_tokens

    def check_integrity(self) -> None:
        self.allocator.check_integrity()
        u = self.allocator.usage()
        cached = u.num_blocks - u.free_blocks - u.used_blocks
        assert cached >= 0, f"free {u.free_blocks} + used {u.used_blocks} exceed {u.num_blocks}"
        if self.prefix_cache is None:
            assert cached == 0, f"{cached} blocks neither free nor used without a prefix cache"
        else:
            self.prefix_cache.check_integrity()
            assert cached <= self.prefix_cache.num_cached_blocks(), (
                f"{cached} orphaned blocks but the prefix cache holds only "
                f"{self.prefix_cache.num_cached_blocks()}"
            )
