"""Write new tokens' K/V into the paged cache at their slots.

Slot `s` is row `s % block_size` of block `s // block_size`; a negative slot is skipped (a
padding token). One program copies one token's K and V for every KV head.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from schedlab.kernels._launch import check_cache, check_index, check_rows, next_pow2

#: this module's Triton kernels, by name (`compile_check` compiles each launch of them)
JIT_KERNELS = ('_store_kv_kernel',)


@triton.jit
def _store_kv_kernel(
    key_ptr, value_ptr, k_cache_ptr, v_cache_ptr, slot_ptr,
    stride_kt, stride_kh, stride_vt, stride_vh,
    stride_cb, stride_cs, stride_ch,
    NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
):
    t = tl.program_id(0)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    if slot >= 0:
        h = tl.arange(0, BLOCK_H)
        d = tl.arange(0, BLOCK_D)
        mask = (h[:, None] < NUM_KV_HEADS) & (d[None, :] < HEAD_DIM)
        k = tl.load(key_ptr + t * stride_kt + h[:, None] * stride_kh + d[None, :], mask=mask)
        v = tl.load(value_ptr + t * stride_vt + h[:, None] * stride_vh + d[None, :], mask=mask)
        dst = ((slot // BLOCK_SIZE) * stride_cb + (slot % BLOCK_SIZE) * stride_cs
               + h[:, None] * stride_ch + d[None, :])
        tl.store(k_cache_ptr + dst, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
        tl.store(v_cache_ptr + dst, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def store_kv(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Scatter `key`/`value` `[T, num_kv_heads, head_dim]` into the caches by `slot_mapping`.

    `slot_mapping` is `[T]` int64 (or int32); the caches are cast to on store.
    """
    _, block_size, num_kv_heads, head_dim = check_cache(k_cache, v_cache)
    check_rows("key", key, num_kv_heads, head_dim)
    check_rows("value", value, num_kv_heads, head_dim)
    assert key.shape[0] == value.shape[0] == slot_mapping.shape[0], "token counts differ"
    assert slot_mapping.dtype in (torch.int32, torch.int64), "slot_mapping must be int32/int64"
    check_index("slot_mapping", slot_mapping, 1, slot_mapping.dtype, k_cache.device)
    assert key.device == value.device == k_cache.device, "key, value and cache devices differ"
    num_tokens = key.shape[0]
    if num_tokens == 0:
        return
    _store_kv_kernel[(num_tokens,)](
        key, value, k_cache, v_cache, slot_mapping,
        key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        NUM_KV_HEADS=num_kv_heads, HEAD_DIM=head_dim, BLOCK_SIZE=block_size,
        BLOCK_H=next_pow2(num_kv_heads), BLOCK_D=next_pow2(head_dim),
    )


def store_kv_ref(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Plain-torch twin of `store_kv`."""
    keep = slot_mapping >= 0
    slots = slot_mapping[keep].long()
    k_flat = k_cache.view(-1, *k_cache.shape[2:])
    v_flat = v_cache.view(-1, *v_cache.shape[2:])
    k_flat.index_copy_(0, slots, key[keep].to(k_cache.dtype))
    v_flat.index_copy_(0, slots, value[keep].to(v_cache.dtype))
