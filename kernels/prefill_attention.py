"""Prefill / chunked-prefill attention: a chunk of new query tokens per sequence over the
sequence's whole paged context.

Queries are a packed varlen batch: sequence i owns rows `query_start_loc[i] ..
query_start_loc[i+1]-1`. With a chunk of q tokens at context length L, query j sits at
position `L - q + j` and sees keys `0 .. L - q + j` (causal within the chunk, everything
before it). The new tokens' K/V must already be in the cache (`store_kv` runs first).
One program handles `BLOCK_M` queries of one head of one sequence.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from schedlab.kernels._launch import check_cache, check_index, check_rows, dot_in_fp32, next_pow2
from schedlab.kernels.decode_attention import attend, attend_tile, gather_context

#: this module's Triton kernels, by name (`compile_check` compiles each launch of them)
JIT_KERNELS = ('_prefill_kernel',)


@triton.jit
def _prefill_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, bt_ptr, seq_lens_ptr, qsl_ptr, out_ptr,
    scale,
    stride_qt, stride_qh, stride_ot, stride_oh,
    stride_cb, stride_cs, stride_ch, stride_bt,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    DOT_F32: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    m_start = tl.program_id(2) * BLOCK_M
    q_begin = tl.load(qsl_ptr + b)
    q_len = tl.load(qsl_ptr + b + 1) - q_begin
    if m_start < q_len:
        seq_len = tl.load(seq_lens_ptr + b)
        kvh = h // GROUP
        m = m_start + tl.arange(0, BLOCK_M)
        d = tl.arange(0, BLOCK_D)
        n = tl.arange(0, BLOCK_N)
        m_mask = m < q_len
        d_mask = d < HEAD_DIM
        rows = (q_begin + m).to(tl.int64)
        q = tl.load(q_ptr + rows[:, None] * stride_qt + h * stride_qh + d[None, :],
                    mask=m_mask[:, None] & d_mask[None, :], other=0.0)
        if DOT_F32:
            q = q.to(tl.float32)
        # NOTE: padded rows (m >= q_len) get positions >= seq_len: they see every valid key,
        # so no row is fully masked and no NaN appears; they are not stored.
        q_pos = seq_len - q_len + m
        kv_end = tl.minimum(seq_len, seq_len - q_len + m_start + BLOCK_M)

        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        bt_row = bt_ptr + b.to(tl.int64) * stride_bt
        for tile in range(0, kv_end, BLOCK_N):
            pos = tile + n
            n_mask = pos < seq_len
            visible = n_mask[None, :] & (pos[None, :] <= q_pos[:, None])
            m_i, l_i, acc = attend_tile(
                q, k_cache_ptr, v_cache_ptr, bt_row, pos, n_mask, visible, d, d_mask, kvh,
                stride_cb, stride_cs, stride_ch, scale, m_i, l_i, acc, BLOCK_SIZE, DOT_F32)

        out = acc / l_i[:, None]
        tl.store(out_ptr + rows[:, None] * stride_ot + h * stride_oh + d[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=m_mask[:, None] & d_mask[None, :])


def paged_prefill(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
    max_query_len: int,
    out: torch.Tensor | None = None,
    tiles: PrefillTiles | None = None,
) -> torch.Tensor:
    """Causal attention of each sequence's chunk of queries over its paged context.

    Args:
        query: `[T, num_heads, head_dim]`, any row/head strides.
        k_cache, v_cache: `[num_blocks, block_size, num_kv_heads, head_dim]`, contiguous,
            already holding this step's K/V.
        block_tables: `[B, max_blocks]` int32.
        seq_lens: `[B]` int32 context lengths including the chunk (>= the chunk length).
        query_start_loc: `[B+1]` int32 row offsets into `query` (need not start at 0: rows
            outside every sequence's range are neither read nor written).
        scale: softmax scale.
        max_query_len: host-side longest chunk, so the launcher needs no device sync.
        out: optional `[T, num_heads, head_dim]` output; only the sequences' rows are written.
        tiles: tile sizes and launch options (None: `default_tiles`); `bench_attention
            --sweep-prefill` times the alternatives on a GPU.

    Returns:
        `out`, in `query`'s dtype.
    """
    _, block_size, num_kv_heads, head_dim = check_cache(k_cache, v_cache)
    num_heads = query.shape[1]
    check_rows("query", query, num_heads, head_dim)
    assert num_heads % num_kv_heads == 0, f"{num_heads} heads over {num_kv_heads} KV heads"
    check_index("block_tables", block_tables, 2, torch.int32, k_cache.device)
    check_index("seq_lens", seq_lens, 1, torch.int32, k_cache.device)
    check_index("query_start_loc", query_start_loc, 1, torch.int32, k_cache.device)
    batch = seq_lens.shape[0]
    assert block_tables.shape[0] == batch and query_start_loc.shape[0] == batch + 1, (
        "block_tables, seq_lens and query_start_loc disagree on the batch size")
    if out is None:
        out = torch.empty_like(query)
    check_rows("out", out, num_heads, head_dim)
    assert out.shape[0] == query.shape[0], "out and query have different row counts"
    if batch == 0 or max_query_len == 0:
        return out
    t = tiles or default_tiles(k_cache.dtype, max_query_len)
    block_m = min(t.block_m, max(16, next_pow2(max_query_len)))
    block_n = t.block_n or block_m
    launch = {k: v for k, v in (("num_warps", t.num_warps), ("num_stages", t.num_stages))
              if v is not None}
    grid = (batch, num_heads, triton.cdiv(max_query_len, block_m))
    _prefill_kernel[grid](
        query, k_cache, v_cache, block_tables, seq_lens, query_start_loc, out, scale,
        query.stride(0), query.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), block_tables.stride(0),
        GROUP=num_heads // num_kv_heads, HEAD_DIM=head_dim, BLOCK_SIZE=block_size,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=next_pow2(head_dim),
        DOT_F32=dot_in_fp32(query.dtype, k_cache.dtype), **launch,
    )
    return out


@dataclass(frozen=True, slots=True)
class PrefillTiles:
    """Tile sizes and launch options of `paged_prefill` (None: Triton's default / `block_m`).

    Args:
        block_m: query rows per program (capped at the longest chunk, at least 16).
        block_n: keys per tile (None: `block_m`).
        num_warps, num_stages: Triton launch options.
    """

    block_m: int
    block_n: int | None = None
    num_warps: int | None = None
    num_stages: int | None = None


def default_tiles(dtype: torch.dtype, max_query_len: int) -> PrefillTiles:
    """64 x 64 tiles (32 x 32 for fp32, so the pipelined K/V buffers fit in shared memory)."""
    return PrefillTiles(32 if dtype == torch.float32 else 64)


def paged_prefill_ref(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
    out: torch.Tensor | None = None,
    upcast: bool = True,
) -> torch.Tensor:
    """Plain-torch twin of `paged_prefill` (one sequence at a time); fp32 math with `upcast`,
    else the inputs' own dtype (see `paged_decode_ref`)."""
    if out is None:
        out = torch.empty_like(query)
    for b in range(seq_lens.shape[0]):
        lo, hi, ctx = int(query_start_loc[b]), int(query_start_loc[b + 1]), int(seq_lens[b])
        k, v = gather_context(k_cache, v_cache, block_tables[b], ctx)
        out[lo:hi] = attend(query[lo:hi], k, v, scale, ctx - (hi - lo), upcast).to(out.dtype)
    return out
