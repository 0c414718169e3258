"""store_kv vs store_kv_ref: every new token lands in its slot, nothing else is touched."""

from __future__ import annotations

import pytest
import torch
from paged_cases import assert_close_to_ref

from schedlab.kernels.store_kv import store_kv, store_kv_ref


def _case(num_tokens, num_blocks, block_size, num_kv_heads, head_dim, dtype, gen, device):
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.full(shape, float("nan"), dtype=dtype, device=device)
    v_cache = torch.full(shape, float("nan"), dtype=dtype, device=device)
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:num_tokens].to(device)
    # a [T, H, D] view with HF's layout ([H, T, D] storage), as the model hands it over
    key = torch.randn(num_kv_heads, num_tokens, head_dim, generator=gen).to(device).transpose(0, 1)
    value = torch.randn(num_kv_heads, num_tokens, head_dim, generator=gen).to(device)
    return k_cache, v_cache, slots, key.to(dtype), value.transpose(0, 1).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("block_size,num_kv_heads,head_dim", [(1, 1, 64), (4, 2, 128), (16, 3, 64)])
def test_store_matches_reference_and_writes_only_its_slots(
    dtype, block_size, num_kv_heads, head_dim, gen, device
):
    k_cache, v_cache, slots, key, value = _case(
        11, -(-11 // block_size) + 2, block_size, num_kv_heads, head_dim, dtype, gen, device)
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    store_kv(key, value, k_cache, v_cache, slots)
    store_kv_ref(key, value, k_ref, v_ref, slots)
    torch.testing.assert_close(k_cache, k_ref, equal_nan=True, atol=0, rtol=0)
    torch.testing.assert_close(v_cache, v_ref, equal_nan=True, atol=0, rtol=0)
    written = k_cache.view(-1, num_kv_heads, head_dim)[slots]
    assert not written.isnan().any()
    assert int(k_cache.isnan().any(-1).any(-1).sum()) == k_cache.shape[0] * block_size - 11


def test_store_casts_to_the_cache_dtype_and_skips_negative_slots(gen, device):
    k_cache, v_cache, slots, key, value = _case(6, 3, 4, 2, 64, torch.bfloat16, gen, device)
    key, value = key.float(), value.float()
    slots[2] = -1
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    store_kv(key, value, k_cache, v_cache, slots)
    store_kv_ref(key, value, k_ref, v_ref, slots)
    keep = slots >= 0
    for cache, ref in ((k_cache, k_ref), (v_cache, v_ref)):
        flat, flat_ref = cache.view(-1, 2, 64), ref.view(-1, 2, 64)
        assert_close_to_ref(flat[slots[keep]], flat_ref[slots[keep]])
        assert int(flat.isnan().all(-1).all(-1).sum()) == 12 - 5


def test_store_rejects_a_mismatched_cache(device):
    cache = torch.zeros(2, 4, 2, 64, device=device)
    key = torch.zeros(3, 2, 32, device=device)
    with pytest.raises(AssertionError, match="key must be"):
        store_kv(key, key, cache, cache.clone(), torch.arange(3, device=device))
