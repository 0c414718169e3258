"""Paged KV allocation (vLLM's PagedAttention): fixed-size blocks from a free pool."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from schedlab.kv_allocator import KVAllocator, KVUsage
from schedlab.request import Request


class PagedKVAllocator(KVAllocator):
    """Blocks are handed out one at a time as a request grows; any free block will do.

    Waste is bounded by one partly filled block per request. Blocks carry reference counts
    so a prefix cache can share them between requests.
    """

    supports_sharing = True

    def __init__(self, num_blocks: int, block_size: int, max_model_len: int) -> None:
        super().__init__(num_blocks, block_size, max_model_len)
        self._free: deque[int] = deque(range(num_blocks))
        self._is_free = [True] * num_blocks
        self._refs = [0] * num_blocks
        self._tables: dict[str, list[int]] = {}
        self._tokens: dict[str, int] = {}  # request id -> tokens its table was grown for
        self._num_used = 0  # blocks with a reference
        # a running total over all tables (the token total is one C-level sum in usage(),
        # cheaper than keeping it on every decode)
        self._num_table_slots = 0

    def num_free_blocks(self) -> int:
        return len(self._free)

    def num_used_blocks(self) -> int:
        return self._num_used

    def blocks_needed(self, request: Request, num_tokens: int) -> int:
        have = len(self._tables.get(request.request_id, ()))
        return max(0, self.blocks_for(num_tokens) - have)

    def can_allocate(self, request: Request, num_tokens: int, num_extra_free: int = 0) -> bool:
        table = self._tables.get(request.request_id)
        if table is not None and len(table) * self.block_size >= num_tokens:
            return True
        return self.blocks_needed(request, num_tokens) <= len(self._free) + num_extra_free

    def allocate(self, request: Request, num_tokens: int) -> list[int]:
        rid = request.request_id
        table = self._tables.get(rid)
        if table is not None and len(table) * self.block_size >= num_tokens:
            # NOTE: the common decode step: the last block still has room
            if num_tokens > self._tokens[rid]:
                self._tokens[rid] = num_tokens
            return []
        need = self.blocks_needed(request, num_tokens)
        if need > len(self._free):
            raise RuntimeError(f"need {need} blocks, {len(self._free)} free")
        new = self._take(self._tables.setdefault(request.request_id, []), need)
        if num_tokens > self._tokens.get(rid, 0):
            self._tokens[rid] = num_tokens
        return new

    def _take(self, table: list[int], need: int) -> list[int]:
        """Move `need` blocks from the free pool to the end of `table` (the caller checked
        there are that many). Returns them. Changes state."""
        new = [self._free.popleft() for _ in range(need)]
        for b in new:
            self._is_free[b] = False
            self._refs[b] = 1
        self._num_used += need
        table.extend(new)
        self._num_table_slots += need * self.block_size
        return new

    def allocate_next_tokens(self, requests: Sequence[Request]) -> list[list[int] | None]:
        tables, tokens, bs, free = self._tables, self._tokens, self.block_size, self._free
        out: list[list[int] | None] = []
        add = out.append
        short = False
        for r in requests:
            rid = r.request_id
            table = tables.get(rid)
            n = r.num_computed_tokens + 1
            if table is None or len(table) * bs < n:  # a new block (one in every block_size)
                if not short and table is not None and free and (len(table) + 1) * bs >= n:
                    # NOTE: `allocate(r, n)` of the one block it takes, without its checks
                    # (the tokens the table was grown for are below its old size, so below n)
                    self._take(table, 1)
                    tokens[rid] = n
                    add(table)
                elif not short and self.can_allocate(r, n):
                    self.allocate(r, n)
                    add(tables[rid])
                else:
                    short = True
                    add(None)
                continue
            if n > tokens[rid]:
                tokens[rid] = n
            add(table)
        return out

    def share(self, request: Request, block_ids: Sequence[int]) -> None:
        table = self._tables.setdefault(request.request_id, [])
        assert not table, "share() starts a table; this request already holds blocks"
        for b in block_ids:
            assert not self._is_free[b], f"cannot share free block {b}"
            if self._refs[b] == 0:
                self._num_used += 1
            self._refs[b] += 1
        table.extend(block_ids)
        slots = len(block_ids) * self.block_size
        self._num_table_slots += slots
        self._tokens[request.request_id] = slots

    def free(self, request: Request) -> list[int]:
        table = self._tables.pop(request.request_id, [])
        self._tokens.pop(request.request_id, None)
        self._num_table_slots -= len(table) * self.block_size
        refs = self._refs
        orphaned: list[int] = []
        add = orphaned.append
        # Freed in reverse so a request's tail blocks are evicted/reused first.
        for b in reversed(table):
            left = refs[b] - 1
            refs[b] = left
            if not left:
                add(b)
        self._num_used -= len(orphaned)
        return orphaned

    def release(self, block_ids: Sequence[int]) -> None:
        refs, is_free, add = self._refs, self._is_free, self._free.append
        for b in block_ids:
            assert refs[b] == 0 and not is_free[b], f"block {b} cannot be released"
            is_free[b] = True
            add(b)

    def ref_count(self, block_id: int) -> int:
        return self._refs[block_id]

    def is_free(self, block_id: int) -> bool:
        return self._is_free[block_id]

    def block_table(self, request: Request) -> list[int]:
        table = self._tables.get(request.request_id)
        return [] if table is None else table

    def usage(self) -> KVUsage:
        free = len(self._free)
        # NOTE: positional, in the field order: asked for on every step
        return KVUsage(self.num_blocks, self.block_size, self._num_used, free,
                       self.num_blocks - free - self._num_used, self._num_table_slots,
                       sum(self._tokens.values()))

    def check_integrity(self) -> None:
        assert len(set(self._free)) == len(self._free), "a block is in the free pool twice"
        refs = [0] * self.num_blocks
        for table in self._tables.values():
            for b in table:
                refs[b] += 1
        assert refs == self._refs, "reference counts disagree with the block tables"
        free = set(self._free)
        for b in range(self.num_blocks):
            assert self._is_free[b] == (b in free), f"block {b} free flag is stale"
            assert not (self._is_free[b] and refs[b]), f"block {b} is free and held"
        assert self._num_used == sum(1 for r in refs if r), "used-block count is stale"
        slots = sum(len(t) for t in self._tables.values()) * self.block_size
        assert self._num_table_slots == slots, "reserved-slot total is stale"
        for rid, table in self._tables.items():
            assert self._tokens[rid] <= len(table) * self.block_size, f"{rid} outgrew its table"
