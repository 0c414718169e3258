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
    """Exact-math results (stores, casts): fp32/fp16 within tight tolerances, bf16 within one
    ulp. Attention outputs use `assert_attention_close`."""
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


#: a low-precision kernel may be this many times further from the fp32 reference than torch's
#: own low-precision math (FlashAttention's tests use 2)
LOWP_FACTOR = 2.0


def attention_error(out: torch.Tensor, ref32: torch.Tensor, ref_lowp: torch.Tensor
                    ) -> tuple[float, float]:
    """(max |out - ref32|, the bound it must stay within) for a low-precision `out`.

    The bound is `LOWP_FACTOR` x the error of the same math done by torch in `out`'s dtype
    (`ref_lowp`) plus twice the dtype's rounding error at 0.3 (FlashAttention's `fwd_atol`):
    it holds for compiled bf16/fp16 kernels (bf16 P.V dots included), not only for the
    interpreter's fp32 math, and still catches a wrong result (tests show it can fail).
    """
    r = ref32.float().cpu()
    err = float((out.float().cpu() - r).abs().max())
    base = float((ref_lowp.float().cpu() - r).abs().max())
    r_lp = r.to(out.dtype)
    atol = 2 * float((r_lp + 0.3 - 0.3 - r_lp).abs().max())
    return err, LOWP_FACTOR * base + atol


def assert_attention_close(out: torch.Tensor, ref32: torch.Tensor,
                           ref_lowp: torch.Tensor | None = None) -> None:
    """An attention output against its fp32-math reference: fp32 within 2e-5; fp16/bf16
    within `attention_error`'s bound (`ref_lowp`: the same math by torch in out's dtype)."""
    assert not out.cpu().isnan().any(), "output has unwritten (NaN) elements"
    if out.dtype == torch.float32:
        torch.testing.assert_close(out.cpu(), ref32.float().cpu(), atol=2e-5, rtol=2e-5)
        return
    assert ref_lowp is not None and ref_lowp.dtype == out.dtype
    err, bound = attention_error(out, ref32, ref_lowp)
    assert err <= bound, (f"{out.dtype} max error {err:.3g} vs the fp32 reference exceeds "
                          f"{bound:.3g} ({LOWP_FACTOR}x torch's own {out.dtype} error + atol)")
