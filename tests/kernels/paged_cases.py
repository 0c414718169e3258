"""Random paged-cache cases and tolerances shared by the kernel tests."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(slots=True)
class PagedCase:
    """A random paged cache whose blocks are handed out in a random order."""

    k_cache: torch.Tensor
    v_cache: torch.Tensor
    block_tables: torch.Tensor  # [B, max_blocks] int32, padded with 0
    seq_lens: torch.Tensor  # [B] int32


def make_paged_case(
    seq_lens: list[int], num_kv_heads: int, head_dim: int, block_size: int, dtype: torch.dtype,
    gen: torch.Generator, device: torch.device | str = "cpu", poison_unused: bool = True,
) -> PagedCase:
    """Random K/V for each sequence in randomly permuted physical blocks (plus two spare).

    With `poison_unused`, every slot no sequence owns (spare blocks, the tail of a partial last
    block) holds NaN, so a kernel that reads past a context produces NaN.
    """
    per_seq = [-(-n // block_size) for n in seq_lens]
    num_blocks = sum(per_seq) + 2
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.randn(shape, generator=gen).to(dtype)
    v_cache = torch.randn(shape, generator=gen).to(dtype)
    perm = torch.randperm(num_blocks, generator=gen)
    tables = torch.zeros(len(seq_lens), max(per_seq), dtype=torch.int32)
    used = torch.zeros(num_blocks * block_size, dtype=torch.bool)
    nxt = 0
    for i, (n, nb) in enumerate(zip(seq_lens, per_seq, strict=True)):
        tables[i, :nb] = perm[nxt:nxt + nb].to(torch.int32)
        nxt += nb
        for p in range(n):
            used[int(tables[i, p // block_size]) * block_size + p % block_size] = True
    if poison_unused:
        k_cache.view(-1, num_kv_heads, head_dim)[~used] = float("nan")
        v_cache.view(-1, num_kv_heads, head_dim)[~used] = float("nan")
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    return PagedCase(k_cache.to(device), v_cache.to(device), tables.to(device), lens.to(device))


def assert_close_to_ref(out: torch.Tensor, ref: torch.Tensor) -> None:
    """fp32/fp16 within tight tolerances; bf16 within one ulp (the interpreter truncates)."""
    assert out.dtype == ref.dtype
    out, ref = out.cpu(), ref.cpu()
    assert not out.isnan().any(), "output has unwritten (NaN) elements"
    if out.dtype == torch.bfloat16:
        a, b = out.float(), ref.float()
        _, exp = torch.frexp(torch.maximum(a.abs(), b.abs()))
        ulp = torch.ldexp(torch.ones_like(a), exp - 8)
        bad = (a - b).abs() > ulp + 1e-6
        assert not bad.any(), f"{int(bad.sum())} elements differ by more than one bf16 ulp"
    else:
        tol = {torch.float32: 2e-5, torch.float16: 2e-3}[out.dtype]
        torch.testing.assert_close(out, ref, atol=tol, rtol=tol)
