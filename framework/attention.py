"""The attention-backend interface: write new K/V into the cache, attend over each context."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

import torch

from schedlab.shapes import KVCacheSpec

#: slot_mapping value of a padding token (a CUDA-graph bucket's filler rows): not stored
PAD_SLOT_ID = -1


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
