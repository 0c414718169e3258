"""The KV allocator interface: which cache slots each request's tokens occupy."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

from schedlab.request import Request


@dataclass(slots=True)
class KVUsage:
    """A snapshot of the block pool, in blocks and tokens.

    `reserved_tokens` counts slots in blocks that live requests hold; `used_tokens` counts slots
    that hold a token's K/V. Their difference is waste (internal fragmentation and
    over-reservation). `cached_blocks` are held only by the prefix cache (evictable).
    """

    num_blocks: int
    block_size: int
    used_blocks: int
    free_blocks: int
    cached_blocks: int
    reserved_tokens: int
    used_tokens: int


class KVAllocator(ABC):
    """Owns a pool of `num_blocks` blocks of `block_size` token slots and the block tables.

    Every request's K/V lives in whole blocks; the slot of token position p is
    `table[p // block_size] * block_size + p % block_size`. A contiguous allocator is the
    special case of a run of consecutive blocks. Blocks can be held by several requests (a
    shared prefix) where `supports_sharing` is true; the allocator counts references.

    Args:
        num_blocks: blocks in the pool.
        block_size: token slots per block.
        max_model_len: the longest sequence (prompt + output) a request may reach.
    """

    supports_sharing: bool = False

    def __init__(self, num_blocks: int, block_size: int, max_model_len: int) -> None:
        if num_blocks <= 0:
            raise ValueError(f"num_blocks must be positive, got {num_blocks}")
        if block_size <= 0:
            raise ValueError(f"block_size must be positive, got {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.max_model_len = max_model_len

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    @abstractmethod
    def num_free_blocks(self) -> int:
        """Blocks in the free pool (not counting evictable cached blocks). No state change."""

    def num_used_blocks(self) -> int:
        """Blocks that at least one live request holds. No state change.

        The default reads `usage()`; allocators with a running count override it (it is asked
        for on every admission check when a prefix cache is on).
        """
        return self.usage().used_blocks

    @abstractmethod
    def blocks_needed(self, request: Request, num_tokens: int) -> int:
        """Free blocks that `allocate(request, num_tokens)` would take. No state change."""

    @abstractmethod
    def can_allocate(self, request: Request, num_tokens: int, num_extra_free: int = 0) -> bool:
        """Whether the request's table can grow to hold `num_tokens` tokens. No state change.

        Args:
            num_extra_free: blocks the caller could add to the free pool first (evictable cached
                blocks), counted as free.
        """

    @abstractmethod
    def allocate(self, request: Request, num_tokens: int) -> list[int]:
        """Grow the request's table to hold `num_tokens` tokens. Changes state.

        Returns:
            The blocks newly added to the table (possibly empty).

        Raises:
            RuntimeError: not enough free blocks (call `can_allocate` first).
        """

    def allocate_next_tokens(self, requests: Sequence[Request]) -> list[list[int] | None]:
        """`allocate(r, r.num_computed_tokens + 1)` for each request in order (the decodes of a
        step) where the free pool has what that takes (`can_allocate` with nothing extra), up
        to the first request for which it has not; after that one, only requests whose table
        already has the slot (no block moves) are allocated. Changes state.

        The default calls `block_table`, `can_allocate` and `allocate` for each; an
        allocator may override it with one pass (it runs for every decoding request on every
        step) that leaves the same state.

        Returns:
            Per request, in order: its block table after the allocation, or None where
            nothing was allocated (the caller makes room: eviction or preemption).
        """
        tables: list[list[int] | None] = []
        bs = self.block_size
        short = False
        for r in requests:
            n = r.num_computed_tokens + 1
            if len(self.block_table(r)) * bs >= n or (not short and self.can_allocate(r, n)):
                self.allocate(r, n)
                tables.append(self.block_table(r))
            else:
                short = True
                tables.append(None)
        return tables

    @abstractmethod
    def free(self, request: Request) -> list[int]:
        """Drop the request's table and its references. Changes state.

        Returns:
            Blocks whose last reference this was. They are *not* back in the free pool yet: the
            caller either `release`s them or keeps them cached.
        """

    @abstractmethod
    def release(self, block_ids: Sequence[int]) -> None:
        """Return unreferenced blocks to the free pool. Changes state."""

    @abstractmethod
    def block_table(self, request: Request) -> list[int]:
        """The request's blocks in position order (empty if it holds none). No state change."""

    @abstractmethod
    def usage(self) -> KVUsage:
        """Current pool usage. No state change."""

    @abstractmethod
    def check_integrity(self) -> None:
        """Raise AssertionError if tables, reference counts and the free pool disagree."""

    # Sharing (prefix caching). Allocators that cannot share keep these defaults.
    def share(self, request: Request, block_ids: Sequence[int]) -> None:
        """Start the request's table with blocks other holders already computed. Changes state."""
        raise NotImplementedError(f"{type(self).__name__} cannot share blocks between requests")

    def ref_count(self, block_id: int) -> int:
        """How many live tables hold the block. No state change."""
        raise NotImplementedError(f"{type(self).__name__} does not count block references")

    def is_free(self, block_id: int) -> bool:
        """Whether the block is in the free pool. No state change."""
        raise NotImplementedError(f"{type(self).__name__} does not expose its free pool")
