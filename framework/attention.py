"""The attention-backend interface: write new K/V into the cache, attend over each context."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import torch

#: slot_mapping value of a padding token (a CUDA-graph bucket's filler rows): not stored
PAD_SLOT_ID = -1


def padded_decode_groups(
    contexts: Sequence[int], max_waste: float, max_tokens: int | None = None
) -> list[tuple[int, int]]:
    """Cut decodes sorted longest context first into groups attended as one padded batch each.

    A group starts at its longest context and grows while its padded K/V tokens (rows x the
    longest context) stay within `(1 + max_waste)` x the tokens it really reads and within
    `max_tokens`; `inf` and `None` make one group of everything. One pass, no tensor work.

    Args:
        contexts: context lengths, non-increasing.
        max_waste: the padding a group may add, as a fraction of its real K/V tokens (>= 0).
        max_tokens: the most padded K/V tokens one group may gather (None: no cap); a group
            always takes at least one row.

    Returns:
        `[lo, hi)` row ranges covering `contexts` in order.
    """
    groups: list[tuple[int, int]] = []
    lo, n = 0, len(contexts)
    while lo < n:
        longest, total, hi = contexts[lo], contexts[lo], lo + 1
        limit = 1.0 + max_waste
        cap = n if max_tokens is None else max(1, max_tokens // max(1, longest))
        while (hi < n and hi - lo < cap
               and longest * (hi - lo + 1) <= limit * (total + contexts[hi])):
            total += contexts[hi]
            hi += 1
        groups.append((lo, hi))
        lo = hi
    return groups


def padded_decode_kv(contexts: Sequence[int], max_waste: float | None) -> int:
    """K/V tokens read by decodes of `contexts` under `padded_decode_groups` (`None`: each
    decode reads only its own context, as paged kernels do)."""
    if max_waste is None:
        return sum(contexts)
    ctx = sorted(contexts, reverse=True)
    return sum(ctx[lo] * (hi - lo) for lo, hi in padded_decode_groups(ctx, max_waste))


@dataclass(frozen=True, slots=True)
class KVCacheSpec:
    """The shape of the KV cache of one model.

    Memory follows M = 2 x layers x kv_heads x head_dim x tokens x bytes per element.
    """

    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype
    block_size: int

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

    A decode step padded to a CUDA-graph bucket carries filler decodes after the real ones:
    slot `PAD_SLOT_ID` (nothing is stored), context length 1, block-table row of zeros; their
    outputs are discarded. When the step is captured (`graph_capture`), the host copies are
    upper bounds fixed at capture time (`seq_lens_host` = the longest context a replay may
    see), so a backend must read real lengths from the device tensors. A backend may derive
    per-step state once per metadata object (at its first layer): every forward the graph
    runner runs or captures gets a new object.
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
    graph_capture: bool = False

    @property
    def num_seqs(self) -> int:
        return len(self.query_lens)


class AttentionBackend(ABC):
    """Owns the paged KV cache tensors and computes attention over them.

    Each layer's cache is `[num_blocks, block_size, num_kv_heads, head_dim]` for K and for V;
    token slot s is `(s // block_size, s % block_size)`; a negative slot (`PAD_SLOT_ID`) is
    padding and is not stored. The backend never knows the scheduler.

    Class attributes a backend declares (read by the executor and the simulator):
        supports_cuda_graphs: `forward` of a decode-only step can be captured in a CUDA graph
            (no host sync, no shape read from the host copies in `AttentionMetadata`); a
            backend that cannot makes the executor run its steps eagerly.
        decode_pad_waste: `None` when each decode reads only its own context (paged kernels);
            else decodes are attended in padded groups (`padded_decode_groups`) that may read
            up to this fraction more K/V than the contexts hold. The simulator charges the
            padded reads.
        graph_context_buckets: a captured decode step reads K/V up to the width of its block
            tables (not each context's length), so the graph runner captures every batch
            bucket once per context bucket (`graph_context_lens`) and hands a step block
            tables of its context bucket's width; `False`: one capture per batch bucket over
            `max_model_len`.

    Args:
        spec: the model's KV shape.
        num_blocks: blocks in the pool.
        device: where the cache lives.
    """

    supports_cuda_graphs: ClassVar[bool] = False
    decode_pad_waste: ClassVar[float | None] = None
    graph_context_buckets: ClassVar[bool] = False

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
