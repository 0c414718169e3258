"""Shared launcher helpers: argument checks and tile-size choices (no kernels here)."""

from __future__ import annotations

import os

import torch

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter (`TRITON_INTERPRET=1`)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def next_pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def dot_in_fp32(q_dtype: torch.dtype, cache_dtype: torch.dtype) -> bool:
    """Whether kernels upcast dot operands to fp32: always in the interpreter (whose bf16
    `tl.dot` is wrong); on a GPU for fp32 or mixed-dtype data, then with IEEE precision."""
    return interpreting() or q_dtype != cache_dtype or cache_dtype == torch.float32


def check_cache(k_cache: torch.Tensor, v_cache: torch.Tensor) -> tuple[int, int, int, int]:
    """Assert a K/V cache pair is `[num_blocks, block_size, num_kv_heads, head_dim]`."""
    assert k_cache.dim() == 4, (
        f"cache must be [blocks, block_size, kv_heads, head_dim], got {tuple(k_cache.shape)}")
    assert k_cache.shape == v_cache.shape, "k_cache and v_cache shapes differ"
    assert k_cache.dtype == v_cache.dtype and k_cache.dtype in FLOAT_DTYPES, (
        f"cache dtype {k_cache.dtype} / {v_cache.dtype}; accepted: fp16, bf16, fp32 (both alike)")
    assert k_cache.is_contiguous() and v_cache.is_contiguous(), "caches must be contiguous"
    assert k_cache.device == v_cache.device, "k_cache and v_cache are on different devices"
    num_blocks, block_size, num_kv_heads, head_dim = k_cache.shape
    assert block_size & (block_size - 1) == 0, f"block_size={block_size} is not a power of two"
    assert 16 <= head_dim <= 256, f"head_dim={head_dim} outside 16..256"
    return num_blocks, block_size, num_kv_heads, head_dim


def check_rows(name: str, t: torch.Tensor, heads: int, head_dim: int) -> None:
    """Assert `t` is `[rows, heads, head_dim]` with a unit stride on the last dimension."""
    assert t.dim() == 3 and t.shape[1:] == (heads, head_dim), (
        f"{name} must be [rows, {heads}, {head_dim}], got {tuple(t.shape)}")
    assert t.stride(-1) == 1, f"{name} needs a unit stride on head_dim, got {t.stride()}"
    assert t.dtype in FLOAT_DTYPES, f"{name} dtype {t.dtype}; accepted: fp16, bf16, fp32"


def check_index(name: str, t: torch.Tensor, dim: int, dtype: torch.dtype,
                device: torch.device) -> None:
    assert t.dim() == dim, f"{name} must have {dim} dimension(s), got {tuple(t.shape)}"
    assert t.dtype == dtype, f"{name} must be {dtype}, got {t.dtype}"
    assert t.stride(-1) == 1, f"{name} needs a unit stride on its last dimension"
    assert t.device == device, f"{name} is on {t.device}, the cache on {device}"
