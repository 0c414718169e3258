"""paged_prefill vs paged_prefill_ref: chunks of new queries over whole paged contexts."""

from __future__ import annotations

import pytest
import torch
from paged_cases import assert_attention_close, make_paged_case

from schedlab.kernels.prefill_attention import PrefillTiles, paged_prefill, paged_prefill_ref


def _chunks(query_lens, seq_lens, num_heads, num_kv_heads, head_dim, block_size, dtype, gen,
            device, lead_rows=0):
    """Packed queries (after `lead_rows` rows no sequence owns) over random paged contexts."""
    case = make_paged_case(seq_lens, num_kv_heads, head_dim, block_size, dtype, gen, device)
    total = lead_rows + sum(query_lens)
    q = torch.randn(num_heads, total, head_dim, generator=gen).to(dtype).to(device)
    starts = torch.tensor([lead_rows, *query_lens]).cumsum(0).to(torch.int32).to(device)
    return case, q.transpose(0, 1), starts


def _refs(case, q, starts, scale):
    """(fp32-math reference, torch's own math in q's dtype) for `case`."""
    f = torch.float32
    ref32 = paged_prefill_ref(q.to(f), case.k_cache.to(f), case.v_cache.to(f),
                              case.block_tables, case.seq_lens, starts, scale)
    lowp = paged_prefill_ref(q, case.k_cache, case.v_cache, case.block_tables, case.seq_lens,
                             starts, scale, upcast=False)
    return ref32, lowp


def _run(case, q, starts, scale, max_query_len):
    out = torch.full_like(q, float("nan"))
    got = paged_prefill(q, case.k_cache, case.v_cache, case.block_tables, case.seq_lens, starts,
                        scale, max_query_len, out=out)
    assert got is out
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize(
    "num_heads,num_kv_heads,head_dim,block_size",
    [(4, 2, 64, 4), (4, 1, 128, 16), (2, 2, 64, 1), (6, 3, 80, 8)],
    ids=["gqa-d64-b4", "mqa-d128-b16", "mha-b1", "gqa-d80-b8"],
)
def test_prefill_matches_reference(num_heads, num_kv_heads, head_dim, block_size, dtype, gen,
                                   device):
    # a whole prompt, a chunk after earlier context, a one-token chunk, a chunk over blocks
    query_lens, seq_lens = [5, 3, 1, 17], [5, 12, 9, 30]
    case, q, starts = _chunks(query_lens, seq_lens, num_heads, num_kv_heads, head_dim,
                              block_size, dtype, gen, device)
    scale = head_dim ** -0.5
    assert_attention_close(_run(case, q, starts, scale, max(query_lens)),
                           *_refs(case, q, starts, scale))


def test_long_chunk_spans_several_query_tiles(gen, device):
    query_lens, seq_lens = [70, 4], [90, 4]
    case, q, starts = _chunks(query_lens, seq_lens, 4, 2, 64, 16, torch.float32, gen, device)
    assert_attention_close(_run(case, q, starts, 0.125, 70), *_refs(case, q, starts, 0.125))


def test_rows_outside_the_sequences_are_not_written(gen, device):
    """The backend passes the whole step with decode rows first; prefill leaves them alone."""
    case, q, starts = _chunks([4, 6], [9, 6], 4, 2, 64, 4, torch.float16, gen, device,
                              lead_rows=3)
    out = _run(case, q, starts, 0.125, 6)
    assert out[:3].isnan().all()
    ref32, lowp = _refs(case, q, starts, 0.125)
    assert_attention_close(out[3:], ref32[3:], lowp[3:])


def test_prefill_checks_its_arguments(gen, device):
    case, q, starts = _chunks([3], [5], 4, 2, 64, 4, torch.float32, gen, device)
    with pytest.raises(AssertionError, match="query_start_loc must be torch.int32"):
        paged_prefill(q, case.k_cache, case.v_cache, case.block_tables, case.seq_lens,
                      starts.long(), 0.125, 3)
    with pytest.raises(AssertionError, match="disagree on the batch size"):
        paged_prefill(q, case.k_cache, case.v_cache, case.block_tables, case.seq_lens,
                      starts[:1], 0.125, 3)


@pytest.mark.parametrize("tiles", [PrefillTiles(16, 32), PrefillTiles(32, 16, num_warps=8)],
                         ids=["m16-n32", "m32-n16-w8"])
def test_other_tile_shapes_give_the_same_output(tiles, gen, device):
    """The tile choices `bench_attention --sweep-prefill` times on a GPU are all correct."""
    query_lens, seq_lens = [40, 3], [57, 9]
    case, q, starts = _chunks(query_lens, seq_lens, 4, 2, 64, 8, torch.float16, gen, device)
    out = torch.full_like(q, float("nan"))
    paged_prefill(q, case.k_cache, case.v_cache, case.block_tables, case.seq_lens, starts,
                  0.125, 40, out=out, tiles=tiles)
    assert_attention_close(out, *_refs(case, q, starts, 0.125))
