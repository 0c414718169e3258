"""The sdpa backend: padded decode groups, padding slots, non-contiguous SDPA outputs."""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F

from schedlab.attention import PAD_SLOT_ID, AttentionMetadata
from schedlab.plugins.attention.sdpa import SDPABackend
from schedlab.shapes import KVCacheSpec, padded_decode_groups, padded_decode_kv

H, HKV, D, BS = 4, 2, 16, 4


def _step(ctx_lens: list[int], q_lens: list[int], seed: int = 0, num_pad: int = 0):
    """A random packed step (decodes first) over a cache with the earlier context filled in.

    Returns the backend-independent pieces: (cache K, cache V, q, new K, new V, metadata, the
    dense per-sequence reference output).
    """
    g = torch.Generator().manual_seed(seed)
    rng = random.Random(seed)
    num_blocks = sum(-(-c // BS) for c in ctx_lens) + 4
    free = list(range(num_blocks))
    rng.shuffle(free)
    tables = []
    for c in ctx_lens:
        n = -(-c // BS)
        tables.append(free[:n])
        free = free[n:]
    kc = torch.zeros(num_blocks * BS, HKV, D)
    vc = torch.zeros(num_blocks * BS, HKV, D)
    k_ctx = [torch.randn(c, HKV, D, generator=g) for c in ctx_lens]
    v_ctx = [torch.randn(c, HKV, D, generator=g) for c in ctx_lens]
    slots, new_k, new_v = [], [], []
    for s, (q, c) in enumerate(zip(q_lens, ctx_lens, strict=True)):
        for p in range(c):
            slot = tables[s][p // BS] * BS + p % BS
            if p < c - q:
                kc[slot], vc[slot] = k_ctx[s][p], v_ctx[s][p]
            else:
                slots.append(slot)
                new_k.append(k_ctx[s][p])
                new_v.append(v_ctx[s][p])
    # padding decodes (a CUDA-graph bucket's filler rows): slot PAD_SLOT_ID, context 1
    num_decodes = sum(1 for q in q_lens if q == 1)
    for _ in range(num_pad):
        slots.insert(num_decodes, PAD_SLOT_ID)
        new_k.insert(num_decodes, torch.full((HKV, D), 7.0))
        new_v.insert(num_decodes, torch.full((HKV, D), 7.0))
    q_all = [*q_lens[:num_decodes], *[1] * num_pad, *q_lens[num_decodes:]]
    c_all = [*ctx_lens[:num_decodes], *[1] * num_pad, *ctx_lens[num_decodes:]]
    t_all = [*tables[:num_decodes], *[[0]] * num_pad, *tables[num_decodes:]]
    width = max(map(len, t_all))
    bt = torch.zeros(len(t_all), width, dtype=torch.int32)
    for i, t in enumerate(t_all):
        bt[i, : len(t)] = torch.tensor(t)
    cu = torch.zeros(len(q_all) + 1, dtype=torch.int32)
    cu[1:] = torch.tensor(q_all).cumsum(0)
    meta = AttentionMetadata(
        slot_mapping=torch.tensor(slots), query_start_loc=cu,
        seq_lens=torch.tensor(c_all, dtype=torch.int32), block_tables=bt, query_lens=q_all,
        seq_lens_host=c_all, num_decodes=num_decodes + num_pad, max_query_len=max(q_all),
        max_seq_len=max(c_all))
    q_real = torch.randn(sum(q_lens), H, D, generator=g)
    q_pad = torch.cat([q_real[:num_decodes], torch.zeros(num_pad, H, D), q_real[num_decodes:]])
    q = q_pad.transpose(0, 1).contiguous().transpose(0, 1)  # [T, H, D] over [H, T, D] storage
    ref = []
    for s, (ql, c) in enumerate(zip(q_lens, ctx_lens, strict=True)):
        row = sum(q_lens[:s])
        qs = q_real[row : row + ql].transpose(0, 1)
        k = k_ctx[s].repeat_interleave(H // HKV, 1).transpose(0, 1)
        v = v_ctx[s].repeat_interleave(H // HKV, 1).transpose(0, 1)
        scores = qs @ k.transpose(1, 2) * D ** -0.5
        vis = torch.arange(c)[None, :] <= torch.arange(c - ql, c)[:, None]
        ref.append((scores.masked_fill(~vis, float("-inf")).softmax(-1) @ v).transpose(0, 1))
    return kc, vc, q, torch.stack(new_k), torch.stack(new_v), meta, ref


def _run(backend: SDPABackend, step) -> torch.Tensor:
    kc, vc, q, k, v, meta, _ = step
    backend.k_caches[0].view(-1, HKV, D).copy_(kc)
    backend.v_caches[0].view(-1, HKV, D).copy_(vc)
    return backend.forward(0, q, k, v, meta, D ** -0.5)


def _backend(num_blocks: int, **options) -> SDPABackend:
    spec = KVCacheSpec(num_layers=1, num_kv_heads=HKV, head_dim=D, dtype=torch.float32,
                       block_size=BS)
    return SDPABackend(spec, num_blocks, "cpu", **options)


def _real_rows(meta: AttentionMetadata, num_pad: int, num_real_decodes: int) -> torch.Tensor:
    rows = list(range(num_real_decodes)) + list(range(num_real_decodes + num_pad,
                                                       int(meta.query_start_loc[-1])))
    return torch.tensor(rows)


# decodes longest first (the executor's order), then a fresh prefill and a chunk on context
CTX = [61, 40, 38, 37, 22, 9, 3, 2, 7, 14]
QL = [1, 1, 1, 1, 1, 1, 1, 1, 7, 5]


@pytest.mark.parametrize("options", [
    {}, {"decode_pad_waste": 0.0}, {"decode_pad_waste": float("inf"), "decode_group_tokens": 0},
    {"decode_pad_waste": 1.0, "decode_group_tokens": 64},
], ids=["default", "no-padding", "one-call", "capped"])
def test_decode_grouping_does_not_change_the_output(options):
    step = _step(CTX, QL)
    out = _run(_backend(67, **options), step)
    expect = torch.cat(step[-1])
    torch.testing.assert_close(out, expect, atol=1e-5, rtol=1e-5)


def test_padding_rows_store_nothing_and_leave_real_rows_unchanged():
    plain = _step(CTX, QL)
    padded = _step(CTX, QL, num_pad=3)
    b1, b2 = _backend(67), _backend(67)
    out_plain = _run(b1, plain)
    out_padded = _run(b2, padded)
    rows = _real_rows(padded[5], 3, 8)
    torch.testing.assert_close(out_padded.index_select(0, rows), out_plain)
    # the cache holds the same K/V either way: the filler K/V (7.0) was written nowhere
    torch.testing.assert_close(b2.k_caches[0], b1.k_caches[0])
    assert not bool((b2.v_caches[0] == 7.0).any())


def test_non_contiguous_sdpa_output_is_handled(monkeypatch):
    """CUDA's SDPA kernels may return a non-contiguous output (fp32 on a GPU crashed on
    `o.view(...)`); a CPU SDPA that returns the same values in a transposed layout must give
    the same result."""
    step = _step(CTX, QL)
    expect = _run(_backend(67), step)
    real = F.scaled_dot_product_attention

    def transposed_layout(*args, **kwargs):
        o = real(*args, **kwargs)
        # same values, memory laid out [.., q, heads, D] as the memory-efficient kernel does
        return o.transpose(-2, -3).contiguous().transpose(-2, -3)

    monkeypatch.setattr(F, "scaled_dot_product_attention", transposed_layout)
    probe = transposed_layout(torch.randn(2, 3, 5, 8), torch.randn(2, 3, 5, 8),
                              torch.randn(2, 3, 5, 8))
    assert not probe.is_contiguous()
    torch.testing.assert_close(_run(_backend(67), step), expect)


def test_padded_decode_groups_bound_the_padding():
    rng = random.Random(3)
    for _ in range(200):
        ctx = sorted((rng.randint(1, 400) for _ in range(rng.randint(1, 60))), reverse=True)
        waste = rng.choice([0.0, 0.1, 0.25, 1.0])
        cap = rng.choice([None, 256, 2048])
        groups = padded_decode_groups(ctx, waste, cap)
        assert [lo for lo, _ in groups] == [0] + [hi for _, hi in groups[:-1]]
        assert groups[-1][1] == len(ctx)
        for lo, hi in groups:
            padded, real = ctx[lo] * (hi - lo), sum(ctx[lo:hi])
            assert padded <= (1 + waste) * real + 1e-9
            assert cap is None or hi - lo == 1 or padded <= cap
    assert padded_decode_groups([9, 5, 1], float("inf")) == [(0, 3)]
    assert padded_decode_groups([9, 9, 9, 8], 0.0) == [(0, 3), (3, 4)]
    assert padded_decode_kv([100, 10, 8], None) == 118
    assert padded_decode_kv([100, 10, 8], float("inf")) == 300


@pytest.mark.parametrize("options", [{"decode_pad_waste": -1}, {"decode_pad_waste": "x"},
                                     {"decode_group_tokens": -5}, {"decode_group_tokens": 1.5}])
def test_bad_options_are_refused(options):
    with pytest.raises(ValueError, match="attention_options"):
        _backend(8, **options)
