"""Attention with Triton kernels reading the paged KV cache in place (no gather)."""

from __future__ import annotations

import os

import torch

from schedlab.attention import AttentionBackend, AttentionMetadata
from schedlab.shapes import KVCacheSpec

ENABLE_HINT = "set TRITON_INTERPRET=1 before starting, or run on a CUDA device"


class TritonBackend(AttentionBackend):
    """Paged-attention backend: one Triton kernel per phase, run over the cache in place.

    New K/V are written by slot (`store_kv`); the batch's decode tokens are attended in one
    `paged_decode` launch (split-K over the context when the batch is too small to fill the
    GPU); all prefill chunks are attended in one `paged_prefill` launch, causal within each
    chunk, over the sequence's whole context. Block tables describe both allocators: a
    contiguous region is a run of consecutive blocks.

    On a CPU the kernels run in Triton's interpreter (`TRITON_INTERPRET=1`, set before the
    process imports the kernels); it is slow and meant for tests.

    A decode step can be captured in a CUDA graph (`supports_cuda_graphs`): the kernels read
    each context's length from the device, and the host copies only size the launch grid
    (upper bounds when captured), with padding slots skipped by `store_kv`.

    Args:
        spec: the model's KV shape.
        num_blocks: blocks in the pool.
        device: where the cache lives.
        num_splits: decode context splits; `None` (default) chooses from the GPU's size.
    """

    supports_cuda_graphs = True

    def __init__(
        self,
        spec: KVCacheSpec,
        num_blocks: int,
        device: torch.device | str,
        num_splits: int | None = None,
    ) -> None:
        super().__init__(spec, num_blocks, device)
        if num_splits is not None and (not isinstance(num_splits, int) or num_splits < 1):
            raise ValueError(f"attention_options num_splits={num_splits!r} must be an int >= 1")
        self.num_splits = num_splits
        from schedlab.kernels import decode_attention, prefill_attention, store_kv

        self._store = store_kv.store_kv
        self._decode = decode_attention.paged_decode
        self._prefill = prefill_attention.paged_prefill

    @classmethod
    def check_available(cls, device: torch.device) -> None:
        """Raise RuntimeError with one sentence when Triton cannot run on `device`."""
        device = torch.device(device)
        interpret = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
        if device.type == "cuda":
            if not torch.cuda.is_available():
                raise RuntimeError(
                    f"attention=triton on device={device} needs a CUDA device torch can see; "
                    f"{ENABLE_HINT}")
        elif device.type == "cpu":
            if not interpret:
                raise RuntimeError(
                    f"attention=triton on device=cpu needs Triton's interpreter: {ENABLE_HINT}")
        else:
            raise RuntimeError(f"attention=triton cannot run on device={device}; {ENABLE_HINT}")
        try:
            import triton  # noqa: F401
        except ImportError:
            raise RuntimeError(
                "attention=triton needs the triton package: pip install triton") from None
        if device.type == "cpu" and not _kernels_interpreted():
            raise RuntimeError(
                "attention=triton on device=cpu: TRITON_INTERPRET=1 was set after the kernels "
                f"were imported; {ENABLE_HINT}")

    def forward(
        self,
        layer_idx: int,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor:
        k_cache, v_cache = self.k_caches[layer_idx], self.v_caches[layer_idx]
        self._store(key, value, k_cache, v_cache, meta.slot_mapping)
        out = torch.empty_like(query)
        nd = meta.num_decodes
        if nd:
            self._decode(
                query[:nd], k_cache, v_cache, meta.block_tables[:nd], meta.seq_lens[:nd],
                scale, max(meta.seq_lens_host[:nd]), out=out[:nd], num_splits=self.num_splits,
            )
        if nd < meta.num_seqs:
            self._prefill(
                query, k_cache, v_cache, meta.block_tables[nd:], meta.seq_lens[nd:],
                meta.query_start_loc[nd:], scale, max(meta.query_lens[nd:]), out=out,
            )
        return out


def _kernels_interpreted() -> bool:
    """Whether the kernels were decorated for the interpreter (else they need a driver)."""
    from triton.runtime.interpreter import InterpretedFunction

    from schedlab.kernels.decode_attention import _decode_kernel

    return isinstance(_decode_kernel, InterpretedFunction)
