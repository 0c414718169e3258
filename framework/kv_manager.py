"""KV admission mechanism: an allocator, a prefix cache and a host swap pool behind one API.

Schedulers talk to this class only; they never know which allocator or cache they got.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from schedlab.faults import PluginFault
from schedlab.kv_allocator import KVAllocator, KVUsage
from schedlab.prefix_cache import PrefixCache, PrefixMatch
from schedlab.request import Request

_NO_MATCH = PrefixMatch([], 0)


class Reused(NamedTuple):
    """What `KVCacheManager.allocate` reused from the prefix cache: the leading tokens whose
    KV is already computed (the scheduler counts them as computed), in whole blocks."""

    num_tokens: int
    num_blocks: int


_NOTHING_REUSED = Reused(0, 0)


class KVCacheManager:
    """Allocation, freeing and prefix reuse for the scheduler.

    NOTE: every block is in exactly one state: free (in the allocator's pool), in use
    (referenced by at least one live request) or cached (held only by the prefix cache,
    evictable). free + in use + cached = the pool, checked by `check_integrity`.

    Swap preemption: `num_swap_blocks` host slots hold the KV of swapped-out requests. A slot
    pair list ((device block, host slot) out, (host slot, device block) in) goes into the
    step's plan and the executor copies; 0 slots (recompute mode) means nothing is ever swapped.
    """

    def __init__(
        self, allocator: KVAllocator, prefix_cache: PrefixCache | None, num_swap_blocks: int = 0
    ) -> None:
        self.allocator = allocator
        caches = prefix_cache is not None and prefix_cache.caches
        self.prefix_cache = prefix_cache if caches else None
        self.block_size = allocator.block_size
        self._num_inserted: dict[str, int] = {}  # request id -> blocks already offered to the cache
        self.num_prefix_hit_tokens = 0
        self.num_prefix_query_tokens = 0
        self.num_swap_blocks = num_swap_blocks
        self._free_host: list[int] = list(range(num_swap_blocks - 1, -1, -1))  # pop() -> slot 0
        self._swapped: dict[str, list[int]] = {}  # request id -> host slots, in position order

    # ---- queries (no state change) -------------------------------------------------------
    def num_evictable_blocks(self) -> int:
        a = self.allocator
        return a.num_blocks - a.num_free_blocks() - a.num_used_blocks()

    def match_prefix(self, request: Request) -> PrefixMatch:
        """The reusable cached prefix for a request that holds no KV yet. No state change
        (cache-aware policies may call it freely).

        At least one token is always left to compute, so the step produces logits.
        """
        if self.prefix_cache is None or request.num_computed_tokens > 0:
            return _NO_MATCH
        tokens = request.all_token_ids
        m = self.prefix_cache.match(tokens)
        bs = self.block_size
        if m.num_tokens != len(m.block_ids) * bs or m.num_tokens > len(tokens):
            raise PluginFault("prefix_cache", (
                f"match() returned {len(m.block_ids)} blocks holding {m.num_tokens} tokens for "
                f"a {len(tokens)}-token sequence; a match is whole blocks of {bs} tokens "
                "(num_tokens == len(block_ids) * block_size) within the sequence"))
        max_blocks = (len(tokens) - 1) // bs
        if len(m.block_ids) > max_blocks:
            m = PrefixMatch(m.block_ids[:max_blocks], max_blocks * bs)
        return m

    def can_allocate(
        self, request: Request, num_tokens: int, prefix: PrefixMatch = _NO_MATCH
    ) -> bool:
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
    def allocate(self, request: Request, num_tokens: int,
                 prefix: PrefixMatch | None = None) -> Reused:
        """Give the request KV for `num_tokens` tokens, reusing `prefix` (a `match_prefix`
        result) first. Changes the KV state, not the request: the caller counts the reused
        tokens as computed.

        Returns:
            What was reused (nothing without a prefix).

        Raises:
            RuntimeError: not enough blocks (call `can_allocate` first).
            PluginFault: the prefix names blocks the prefix cache does not hold.
        """
        reused = _NOTHING_REUSED
        if prefix is not None and prefix.block_ids:
            self._check_cached(prefix)
            self.allocator.share(request, prefix.block_ids)
            self._num_inserted[request.request_id] = len(prefix.block_ids)
            if self.prefix_cache is not None:
                self.prefix_cache.acquire(prefix.block_ids)
            reused = Reused(prefix.num_tokens, len(prefix.block_ids))
        if self.prefix_cache is not None:
            need = self.allocator.blocks_needed(request, num_tokens)
            short = need - self.allocator.num_free_blocks()
            if short > 0:
                evicted = self.prefix_cache.evict(short, self._is_unused)
                self.allocator.release(evicted)
        self.allocator.allocate(request, num_tokens)
        return reused

    def allocate_next_tokens(self, requests: Sequence[Request]) -> list[list[int] | None]:
        """KV for each request's next token, in order, from the free pool, up to the first
        request the pool is short for (the decodes of a step): `KVAllocator.
        allocate_next_tokens`. Changes the KV state, not the requests.

        NOTE: what this allocates is what `can_allocate` / `allocate` of each in turn would:
        with free blocks, `allocate` evicts nothing from the prefix cache.

        Returns:
            Per request: its block table, or None where nothing was allocated (then
            `can_allocate` / `allocate` it as usual, evicting or preempting).

        Raises:
            PluginFault: the allocator returned another number of entries.
        """
        tables = self.allocator.allocate_next_tokens(requests)
        if len(tables) != len(requests):
            raise PluginFault("kv_allocator", (
                f"allocate_next_tokens() returned {len(tables)} entries for {len(requests)} "
                "requests; one per request, in order (None where a new block is needed)"))
        return tables

    def _check_cached(self, prefix: PrefixMatch) -> None:
        """Raise PluginFault unless every block of `prefix` is a distinct block of the pool that
        the prefix cache holds and the allocator has not freed."""
        pc, alloc = self.prefix_cache, self.allocator
        blocks = prefix.block_ids
        for b in blocks:
            if not 0 <= b < alloc.num_blocks:
                what = f"is not a block of the pool (0..{alloc.num_blocks - 1})"
            elif pc is None or not pc.is_cached(b):
                what = "it does not hold (is_cached() is False)"
            elif alloc.is_free(b):
                what = "is in the allocator's free pool"
            else:
                continue
            raise PluginFault("prefix_cache", (
                f"match() returned block {b}, which {what}; a match names only blocks the "
                "cache holds (inserted and not evicted)"))
        if len(set(blocks)) != len(blocks):
            raise PluginFault("prefix_cache", (
                f"match() returned blocks {list(blocks)[:8]} with a block twice; each block "
                "of a match holds a different part of the prefix"))

    def record_lookup(self, num_prompt_tokens: int, num_hit_tokens: int) -> None:
        """Count a request's first prefix lookup for the hit rate, in tokens (vLLM: the prompt
        tokens found cached when first scheduled; a re-admission after preemption reuses the
        cache too but is not counted). Changes state (the counters)."""
        self.num_prefix_query_tokens += num_prompt_tokens
        self.num_prefix_hit_tokens += num_hit_tokens

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
        """Release the request's KV (device and host); blocks the prefix cache holds stay
        cached. Changes state."""
        self._free_device(request)
        self._free_host.extend(self._swapped.pop(request.request_id, ()))

    def _free_device(self, request: Request) -> None:
        self._num_inserted.pop(request.request_id, None)
        if self.prefix_cache is not None and self.allocator.block_table(request):
            # NOTE: LRU counts from a block's last use, as vLLM's free queue does: the request's
            # cached prefix was in use until now, so releasing it marks it recently used.
            pc = self.prefix_cache
            pc.release(pc.match(request.token_slice(0, request.num_computed_tokens)).block_ids)
        orphaned = self.allocator.free(request)
        if self.prefix_cache is not None:
            orphaned = [b for b in orphaned if not self.prefix_cache.is_cached(b)]
        self.allocator.release(orphaned)

    # ---- swap preemption -----------------------------------------------------------------
    def is_swapped(self, request: Request) -> bool:
        """Whether the request's KV waits in host slots. No state change."""
        return request.request_id in self._swapped

    def has_swapped(self) -> bool:
        """Whether any request's KV waits in host slots. No state change."""
        return bool(self._swapped)

    def num_free_host_blocks(self) -> int:
        return len(self._free_host)

    def swap_out(self, request: Request) -> list[tuple[int, int]] | None:
        """Move the request's computed KV to host slots and free its device KV. Changes state.

        Returns:
            (device block, host slot) pairs for the executor to copy before the step runs, or
            None, changing nothing, when the host pool cannot hold it (the caller recomputes).
        """
        if request.request_id in self._swapped:
            # re-admitted but preempted again before it ran: its KV is still on the host
            self._free_device(request)
            return []
        n = self.allocator.blocks_for(request.num_computed_tokens)
        if n == 0 or n > len(self._free_host):
            return None
        table = self.allocator.block_table(request)[:n]
        slots = [self._free_host.pop() for _ in range(n)]
        self._swapped[request.request_id] = slots
        self._free_device(request)
        return list(zip(table, slots, strict=True))

    def swap_in(self, request: Request) -> list[tuple[int, int]]:
        """Hand a re-admitted request's host slots back once it holds device blocks again (the
        scheduler calls this whenever it plans a request). Changes state.

        Returns:
            (host slot, device block) pairs for the executor to copy before the step runs;
            empty for a request that was not swapped out.
        """
        if not self._swapped:
            return []
        slots = self._swapped.pop(request.request_id, [])
        if not slots:
            return []
        table = self.allocator.block_table(request)
        assert len(table) >= len(slots), "allocate the device blocks before swapping in"
        self._free_host.extend(slots)
        return list(zip(slots, table[: len(slots)], strict=True))

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
            pc = self.prefix_cache
            pc.check_integrity()
            num_cached = 0
            for b in range(u.num_blocks):
                if pc.is_cached(b):
                    num_cached += 1
                    assert not self.allocator.is_free(b), f"cached block {b} is in the free pool"
                elif not self.allocator.is_free(b):
                    assert self.allocator.ref_count(b) > 0, f"block {b} leaked: unheld, uncached"
            assert num_cached == pc.num_cached_blocks(), "prefix cache miscounts its blocks"
        held = [s for slots in self._swapped.values() for s in slots]
        assert len(set(held)) == len(held), "a host slot is held twice"
        assert not set(held) & set(self._free_host), "a host slot is both free and held"
        assert len(held) + len(self._free_host) == self.num_swap_blocks, "host slots leaked"
