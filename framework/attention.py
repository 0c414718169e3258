"""The attention-backend interface: write new K/V into the cache, attend over each context."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class KVCacheSpec:
    """The shape of the KV cache of one model.

    Memory follows M = 2 x layers x kv_heads x head_dim x tokens x bytes per element.
    """

    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype
    block_size: int = 16

    @property
    def bytes_per_token(self) -> int:
        elem = torch.empty((), dtype=self.dtype).element_size()
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * elem

    @property
    def bytes_per_block(self) -> int:
        return self.bytes_per_token * self.block_size

    def bytes_for(self, num_tokens: int, num_seqs: int = 1) -> int:
        return self.bytes_per_token * num_tokens * num_seqs

    def num_blocks_for(self, memory_bytes: int) -> int:
        return int(memory_bytes // self.bytes_per_block)


@dataclass(slots=True)
class AttentionMetadata:
    """Everything a backend needs about one packed step, built once per step by the executor.

    Sequences are packed back to back; the first `num_decodes` have exactly one query token.
    Sequence i's queries are rows `query_start_loc[i]:query_start_loc[i+1]` and sit at the
    last `query_lens[i]` positions of its context of `seq_lens[i]` tokens (causal).
    """

    slot_mapping: torch.Tensor  # [T] int64: cache slot of each new token
    query_start_loc: torch.Tensor  # [B+1] int32
    seq_lens: torch.Tensor  # [B] int32: context length including this step's tokens
    block_tables: torch.Tensor  # [B, max_blocks] int32, padded with 0
    query_lens: list[int]  # host copies, so backends need no device sync
    seq_lens_host: list[int]
    num_decodes: int
    max_query_len: int
    max_seq_len: int

    @property
    def num_seqs(self) -> int:
        return len(self.query_lens)


class AttentionBackend(ABC):
    """Owns the paged KV cache tensors and computes attention over them.

    Each layer's cache is `[num_blocks, block_size, num_kv_heads, head_dim]` for K and for V;
    token slot s is `(s // block_size, s % block_size)`. The backend never knows the scheduler.

    Args:
        spec: the model's KV shape.
        num_blocks: blocks in the pool.
        device: where the cache lives.
    """

    def __init__(self, spec: KVCacheSpec, num_blocks: int, device: torch.device | str) -> None:
        self.spec = spec
        self.num_blocks = num_blocks
        self.block_size = spec.block_size
        self.device = torch.device(device)
        shape = (num_blocks, spec.block_size, spec.num_kv_heads, spec.head_dim)
        # NOTE: zero-filled, not empty: padded reads past a context's end are masked out, but
        # a NaN left in uninitialised memory would still poison the weighted sum (0 * NaN).
        self.k_caches = [torch.zeros(shape, dtype=spec.dtype, device=self.device)
                         for _ in range(spec.num_layers)]
        self.v_caches = [torch.zeros(shape, dtype=spec.dtype, device=self.device)
                         for _ in range(spec.num_layers)]

    @classmethod  # noqa: B027 - an optional hook: most backends run anywhere
    def check_available(cls, device: torch.device) -> None:
        """Raise RuntimeError with a sentence saying what is missing to run on `device`."""

    @abstractmethod
    def forward(
        self,
        layer_idx: int,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor:
        """Store this step's K/V for `layer_idx` and attend. Changes the cache.

        Args:
            query: [T, num_heads, head_dim], post-RoPE.
            key, value: [T, num_kv_heads, head_dim], the new tokens' K/V.
            meta: the packed step.
            scale: softmax scale.

        Returns:
            [T, num_heads, head_dim] attention output.
        """

    def copy_blocks_out(self, block_ids: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Copy blocks of every layer to host memory (swap-out). No state change."""
        idx = torch.tensor(block_ids, device=self.device, dtype=torch.long)
        return [(k.index_select(0, idx).cpu(), v.index_select(0, idx).cpu())
                for k, v in zip(self.k_caches, self.v_caches, strict=True)]

    def copy_blocks_in(
        self, block_ids: list[int], data: list[tuple[torch.Tensor, torch.Tensor]]
    ) -> None:
        """Write host copies back into blocks of every layer (swap-in). Changes the cache."""
        idx = torch.tensor(block_ids, device=self.device, dtype=torch.long)
        caches = zip(self.k_caches, self.v_caches, strict=True)
        for (k, v), (hk, hv) in zip(caches, data, strict=True):
            k.index_copy_(0, idx, hk.to(self.device))
            v.index_copy_(0, idx, hv.to(self.device))
