"""Decode attention over a paged KV cache: one query token per sequence.

One program serves all query heads of one KV head (GQA/MQA: the group is padded to at least
16 rows for `tl.dot`) and walks the sequence's context in tiles of `BLOCK_N` tokens, looking
up each token's physical block in the block table, with an online softmax. For long contexts
and small batches the context is cut into `num_splits` parts (flash-decoding); each part
writes a partial output and its log-sum-exp, and a reduce kernel merges them.
"""

from __future__ import annotations

import math
from functools import cache

import torch
import triton
import triton.language as tl

from schedlab.kernels._launch import (
    check_cache,
    check_index,
    check_rows,
    dot_in_fp32,
    interpreting,
    next_pow2,
)

#: this module's Triton kernels, by name (`compile_check` compiles each launch of them)
JIT_KERNELS = ('_decode_kernel', '_reduce_kernel')


@triton.jit
def attend_tile(
    q, k_cache_ptr, v_cache_ptr, bt_row, pos, n_mask, visible, d, d_mask, kvh,
    stride_cb, stride_cs, stride_ch, scale, m_i, l_i, acc,
    BLOCK_SIZE: tl.constexpr, DOT_F32: tl.constexpr,
):
    """One tile of keys of an online softmax, shared by the decode and prefill kernels.

    Loads the tile's K/V through the block table (positions `pos`, valid where `n_mask`),
    scores the queries `q` against them where `visible`, and folds the tile into the running
    max `m_i`, normaliser `l_i` and weighted sum `acc`, which it returns.
    """
    blk = tl.load(bt_row + pos // BLOCK_SIZE, mask=n_mask, other=0).to(tl.int64)
    off = blk * stride_cb + (pos % BLOCK_SIZE) * stride_cs + kvh * stride_ch
    kv_mask = n_mask[:, None] & d_mask[None, :]
    k = tl.load(k_cache_ptr + off[:, None] + d[None, :], mask=kv_mask, other=0.0)
    v = tl.load(v_cache_ptr + off[:, None] + d[None, :], mask=kv_mask, other=0.0)
    if DOT_F32:
        k = k.to(tl.float32)
        v = v.to(tl.float32)
        s = tl.dot(q, tl.trans(k), input_precision="ieee")
    else:
        s = tl.dot(q, tl.trans(k))
    s = tl.where(visible, s * scale, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp(m_i - m_new)
    p = tl.exp(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    if DOT_F32:
        acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")
    else:
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return m_new, l_i, acc


@triton.jit
def _decode_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, bt_ptr, seq_lens_ptr, out_ptr, lse_ptr,
    scale, tokens_per_split,
    stride_qb, stride_qh, stride_ob, stride_oh, stride_os, stride_lb, stride_lh,
    stride_cb, stride_cs, stride_ch, stride_bt,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    SPLIT: tl.constexpr, DOT_F32: tl.constexpr,
):
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + b)
    start = split * tokens_per_split
    end = tl.minimum(start + tokens_per_split, seq_len)

    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    n = tl.arange(0, BLOCK_N)
    heads = kvh * GROUP + g
    g_mask = g < GROUP
    d_mask = d < HEAD_DIM
    q = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + d[None, :],
                mask=g_mask[:, None] & d_mask[None, :], other=0.0)
    if DOT_F32:
        q = q.to(tl.float32)

    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    bt_row = bt_ptr + b.to(tl.int64) * stride_bt
    for tile in range(start, end, BLOCK_N):
        pos = tile + n
        n_mask = pos < end
        m_i, l_i, acc = attend_tile(
            q, k_cache_ptr, v_cache_ptr, bt_row, pos, n_mask, n_mask[None, :], d, d_mask, kvh,
            stride_cb, stride_cs, stride_ch, scale, m_i, l_i, acc, BLOCK_SIZE, DOT_F32)

    nonempty = l_i > 0.0
    l_safe = tl.where(nonempty, l_i, 1.0)
    out = acc / l_safe[:, None]
    o_ptrs = out_ptr + b * stride_ob + heads[:, None] * stride_oh + split * stride_os + d[None, :]
    tl.store(o_ptrs, out.to(out_ptr.dtype.element_ty), mask=g_mask[:, None] & d_mask[None, :])
    if SPLIT:
        lse = tl.where(nonempty, m_i + tl.log(l_safe), float("-inf"))
        tl.store(lse_ptr + b * stride_lb + heads * stride_lh + split, lse, mask=g_mask)


@triton.jit
def _reduce_kernel(
    part_ptr, lse_ptr, out_ptr,
    stride_pb, stride_ph, stride_ps, stride_lb, stride_lh, stride_ob, stride_oh,
    NUM_SPLITS: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    s = tl.arange(0, BLOCK_S)
    d = tl.arange(0, BLOCK_D)
    s_mask = s < NUM_SPLITS
    lse = tl.load(lse_ptr + b * stride_lb + h * stride_lh + s, mask=s_mask, other=float("-inf"))
    m = tl.max(lse, 0)
    w = tl.exp(lse - m)
    part = tl.load(part_ptr + b * stride_pb + h * stride_ph + s[:, None] * stride_ps + d[None, :],
                   mask=s_mask[:, None] & (d[None, :] < HEAD_DIM), other=0.0)
    out = tl.sum(part * w[:, None], 0) / tl.sum(w, 0)
    tl.store(out_ptr + b * stride_ob + h * stride_oh + d, out.to(out_ptr.dtype.element_ty),
             mask=d < HEAD_DIM)


#: programs per SM a split decode aims for: enough warps in flight to hide memory latency
PROGRAMS_PER_SM = 8
#: fewest context tokens one split reads (two tiles of 64): below it the reduce costs more
MIN_SPLIT_TOKENS = 128
MAX_SPLITS = 128  # the reduce holds [splits, head_dim] fp32 in registers


def choose_num_splits(num_programs: int, max_seq_len: int, num_sms: int) -> int:
    """Context splits for `num_programs` (batch x KV heads) decode programs on `num_sms` SMs.

    No split once the batch alone gives every SM 4 programs (batch >= 66 at 8 KV heads on an
    H200's 132 SMs; round 1 measured 4.2-4.5 TB/s unsplit at batch >= 64, so batches 33-65,
    which this splits 3-4 ways, are unmeasured: `bench_attention --sweep-splits` times them).
    Below that, enough splits for
    `PROGRAMS_PER_SM` programs per SM, each split reading at least `MIN_SPLIT_TOKENS` tokens,
    at most `MAX_SPLITS`. (The earlier choice, 2 programs per SM and at most 64 splits of
    >= 256 tokens, left batch 1-4 at long contexts latency-bound: 0.12-0.43x SDPA.)
    """
    if num_programs >= 4 * num_sms:
        return 1
    by_work = math.ceil(PROGRAMS_PER_SM * num_sms / max(1, num_programs))
    by_len = max(1, max_seq_len // MIN_SPLIT_TOKENS)
    return max(1, min(by_work, by_len, MAX_SPLITS))


def default_num_splits(num_programs: int, max_seq_len: int, device: torch.device) -> int:
    """`choose_num_splits` for `device`'s SM count; on the CPU (interpreter) no split."""
    if device.type != "cuda":
        return 1
    index = device.index if device.index is not None else torch.cuda.current_device()
    return choose_num_splits(num_programs, max_seq_len, _num_sms(index))


@cache
def _num_sms(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def paged_decode(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    max_seq_len: int,
    out: torch.Tensor | None = None,
    num_splits: int | None = None,
) -> torch.Tensor:
    """Attend each sequence's single query token over its whole paged context.

    Args:
        query: `[B, num_heads, head_dim]`, any row/head strides.
        k_cache, v_cache: `[num_blocks, block_size, num_kv_heads, head_dim]`, contiguous.
        block_tables: `[B, max_blocks]` int32; entry j is the physical block of tokens
            `j*block_size .. (j+1)*block_size-1`.
        seq_lens: `[B]` int32 context lengths (>= 1), including the query token.
        scale: softmax scale.
        max_seq_len: host-side `max(seq_lens)`, so the launcher needs no device sync.
        out: optional `[B, num_heads, head_dim]` output (written in full).
        num_splits: context splits (flash-decoding); `None` chooses from the GPU's size.

    Returns:
        `out`, in `query`'s dtype.
    """
    _, block_size, num_kv_heads, head_dim = check_cache(k_cache, v_cache)
    batch, num_heads = query.shape[0], query.shape[1]
    check_rows("query", query, num_heads, head_dim)
    assert num_heads % num_kv_heads == 0, f"{num_heads} heads over {num_kv_heads} KV heads"
    check_index("block_tables", block_tables, 2, torch.int32, k_cache.device)
    check_index("seq_lens", seq_lens, 1, torch.int32, k_cache.device)
    assert block_tables.shape[0] == seq_lens.shape[0] == batch, "batch sizes differ"
    assert block_tables.shape[1] * block_size >= max_seq_len, "block_tables too narrow"
    if out is None:
        out = torch.empty(batch, num_heads, head_dim, dtype=query.dtype, device=query.device)
    check_rows("out", out, num_heads, head_dim)
    assert out.shape[0] == batch, "out has the wrong batch size"
    if batch == 0:
        return out
    group = num_heads // num_kv_heads
    if num_splits is None:
        num_splits = default_num_splits(batch * num_kv_heads, max_seq_len, k_cache.device)
    # NOTE: fp32 tiles are halved so the pipelined K/V buffers fit in shared memory.
    block_n = 16 if interpreting() else 32 if k_cache.dtype == torch.float32 else 64
    num_splits = max(1, min(num_splits, triton.cdiv(max_seq_len, block_n)))
    tokens_per_split = triton.cdiv(triton.cdiv(max_seq_len, num_splits), block_n) * block_n
    consts = dict(
        GROUP=group, HEAD_DIM=head_dim, BLOCK_SIZE=block_size, BLOCK_G=max(16, next_pow2(group)),
        BLOCK_N=block_n, BLOCK_D=next_pow2(head_dim),
        DOT_F32=dot_in_fp32(query.dtype, k_cache.dtype),
    )
    common = (scale, tokens_per_split)
    strides_q = (query.stride(0), query.stride(1))
    strides_c = (k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), block_tables.stride(0))
    if num_splits == 1:
        _decode_kernel[(batch, num_kv_heads, 1)](
            query, k_cache, v_cache, block_tables, seq_lens, out, out, *common, *strides_q,
            out.stride(0), out.stride(1), 0, 0, 0, *strides_c, SPLIT=False, **consts,
        )
        return out
    part = torch.empty(batch, num_heads, num_splits, head_dim, dtype=torch.float32,
                       device=query.device)
    lse = torch.empty(batch, num_heads, num_splits, dtype=torch.float32, device=query.device)
    _decode_kernel[(batch, num_kv_heads, num_splits)](
        query, k_cache, v_cache, block_tables, seq_lens, part, lse, *common, *strides_q,
        part.stride(0), part.stride(1), part.stride(2), lse.stride(0), lse.stride(1),
        *strides_c, SPLIT=True, **consts,
    )
    _reduce_kernel[(batch, num_heads)](
        part, lse, out, part.stride(0), part.stride(1), part.stride(2),
        lse.stride(0), lse.stride(1), out.stride(0), out.stride(1),
        NUM_SPLITS=num_splits, HEAD_DIM=head_dim,
        BLOCK_S=next_pow2(num_splits), BLOCK_D=next_pow2(head_dim),
    )
    return out


def paged_decode_ref(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    upcast: bool = True,
) -> torch.Tensor:
    """Plain-torch twin of `paged_decode` (one sequence at a time), in `query`'s dtype.

    With `upcast` (default) the math runs in fp32; without, in the inputs' own dtype (the
    error a plain low-precision implementation makes, which kernel tests scale their
    tolerance by).
    """
    out = torch.empty_like(query)
    for b in range(query.shape[0]):
        k, v = gather_context(k_cache, v_cache, block_tables[b], int(seq_lens[b]))
        out[b] = attend(query[b:b + 1], k, v, scale, None, upcast)[0].to(query.dtype)
    return out


def gather_context(
    k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor, seq_len: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence's first `seq_len` cached tokens, `[seq_len, num_kv_heads, head_dim]` each."""
    nblocks = -(-seq_len // k_cache.shape[1])
    idx = block_table[:nblocks].long()
    return k_cache[idx].flatten(0, 1)[:seq_len], v_cache[idx].flatten(0, 1)[:seq_len]


def attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, causal_offset: int | None,
    upcast: bool = True,
) -> torch.Tensor:
    """Softmax attention of `q` `[M, H, D]` over `k`, `v` `[N, Hkv, D]`, in fp32 (`upcast`) or
    in `q`'s dtype throughout (scores, softmax and the weighted sum rounded to it).

    With `causal_offset` c, query row i sees keys `0 .. c + i`; with `None` it sees all.
    """
    group = q.shape[1] // k.shape[1]
    dt = torch.float32 if upcast else q.dtype
    qf = q.to(dt).transpose(0, 1)  # [H, M, D]
    kf = k.to(dt).repeat_interleave(group, 1).transpose(0, 1)  # [H, N, D]
    vf = v.to(dt).repeat_interleave(group, 1).transpose(0, 1)
    s = qf @ kf.transpose(1, 2) * scale
    if causal_offset is not None:
        rows = torch.arange(q.shape[0], device=q.device)[:, None] + causal_offset
        s = s.masked_fill(torch.arange(k.shape[0], device=q.device)[None, :] > rows, float("-inf"))
    return (s.softmax(-1) @ vf).transpose(0, 1)
