"""Contiguous KV allocation: one reserved region per request, as before PagedAttention."""

from __future__ import annotations

from collections.abc import Sequence

from schedlab.kv_allocator import KVAllocator, KVUsage
from schedlab.request import Request

RESERVE_MODES = ("max_model_len", "request")


class ContiguousKVAllocator(KVAllocator):
    """Each request gets one run of consecutive blocks, reserved in full at admission.

    Args:
        reserve: "max_model_len" (default; what FasterTransformer-era systems did) sizes the
            region to the longest allowed sequence; "request" sizes it to prompt + max_tokens.

    The unused tail of each region is reserved but holds no token (internal waste), and free
    space between regions may be too short for the next request (external fragmentation).
    """

    def __init__(
        self, num_blocks: int, block_size: int, max_model_len: int, reserve: str = "max_model_len"
    ) -> None:
        super().__init__(num_blocks, block_size, max_model_len)
        if reserve not in RESERVE_MODES:
            accepted = ", ".join(RESERVE_MODES)
            raise ValueError(f"kv_allocator reserve={reserve!r}; accepted: {accepted}")
        self.reserve = reserve
        self._owner: list[str | None] = [None] * num_blocks
        self._regions: dict[str, tuple[int, int]] = {}  # request id -> (first block, num blocks)
        self._tokens: dict[str, int] = {}
        self._num_free = num_blocks

    def region_blocks(self, request: Request) -> int:
        """Blocks reserved for a request at admission."""
        if self.reserve == "request":
            tokens = min(request.max_total_tokens, self.max_model_len)
        else:
            tokens = self.max_model_len
        return self.blocks_for(tokens)

    def num_free_blocks(self) -> int:
        return self._num_free

    def _find_run(self, length: int) -> int | None:
        run = 0
        for b, owner in enumerate(self._owner):
            run = run + 1 if owner is None else 0
            if run == length:
                return b - length + 1
        return None

    def blocks_needed(self, request: Request, num_tokens: int) -> int:
        if request.request_id in self._regions:
            return 0
        return self.region_blocks(request)

    def can_allocate(self, request: Request, num_tokens: int, num_extra_free: int = 0) -> bool:
        region = self._regions.get(request.request_id)
        if region is not None:
            return num_tokens <= region[1] * self.block_size
        n = self.region_blocks(request)
        return n <= self._num_free and self._find_run(n) is not None

    def allocate(self, request: Request, num_tokens: int) -> list[int]:
        rid = request.request_id
        region = self._regions.get(rid)
        if region is not None:
            if num_tokens > region[1] * self.block_size:
                raise RuntimeError(f"{rid} outgrew its reserved region of {region[1]} blocks")
            self._tokens[rid] = max(self._tokens[rid], num_tokens)
            return []
        n = self.region_blocks(request)
        first = self._find_run(n)
        if first is None:
            raise RuntimeError(f"no run of {n} free consecutive blocks")
        for b in range(first, first + n):
            self._owner[b] = rid
        self._num_free -= n
        self._regions[rid] = (first, n)
        self._tokens[rid] = num_tokens
        return list(range(first, first + n))

    def allocate_next_tokens(self, requests: Sequence[Request]) -> list[list[int] | None]:
        regions, tokens, bs = self._regions, self._tokens, self.block_size
        out: list[list[int] | None] = []
        short = False
        for r in requests:
            rid = r.request_id
            region = regions.get(rid)
            n = r.num_computed_tokens + 1
            if region is None or n > region[1] * bs:  # NOTE: a region is reserved whole
                if not short and self.can_allocate(r, n):
                    self.allocate(r, n)
                    out.append(self.block_table(r))
                else:
                    short = True
                    out.append(None)
                continue
            if n > tokens[rid]:
                tokens[rid] = n
            out.append(list(range(region[0], region[0] + region[1])))
        return out

    def free(self, request: Request) -> list[int]:
        region = self._regions.pop(request.request_id, None)
        self._tokens.pop(request.request_id, None)
        if region is None:
            return []
        return list(range(region[0], region[0] + region[1]))

    def release(self, block_ids: Sequence[int]) -> None:
        for b in block_ids:
            assert self._owner[b] is not None, f"block {b} released twice"
            self._owner[b] = None
        self._num_free += len(block_ids)

    def ref_count(self, block_id: int) -> int:
        owner = self._owner[block_id]
        return int(owner is not None and owner in self._regions)

    def is_free(self, block_id: int) -> bool:
        return self._owner[block_id] is None

    def block_table(self, request: Request) -> list[int]:
        region = self._regions.get(request.request_id)
        return [] if region is None else list(range(region[0], region[0] + region[1]))

    def usage(self) -> KVUsage:
        used_blocks = sum(n for _, n in self._regions.values())
        # NOTE: positional, in the field order: asked for on every step
        return KVUsage(self.num_blocks, self.block_size, used_blocks, self._num_free,
                       self.num_blocks - self._num_free - used_blocks,
                       used_blocks * self.block_size, sum(self._tokens.values()))

    def check_integrity(self) -> None:
        owned = 0
        for rid, (first, n) in self._regions.items():
            assert all(self._owner[b] == rid for b in range(first, first + n)), f"{rid} region torn"
            owned += n
        assert self._num_free == sum(o is None for o in self._owner), "free count is stale"
        assert owned + self._num_free == self.num_blocks, "blocks owned by no live request"
