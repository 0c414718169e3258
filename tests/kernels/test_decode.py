"""paged_decode vs paged_decode_ref over random paged caches, with and without split-K."""

from __future__ import annotations

import pytest
import torch
from paged_cases import assert_close_to_ref, make_paged_case

from schedlab.kernels.decode_attention import paged_decode, paged_decode_ref

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _query(batch, num_heads, head_dim, dtype, gen, device):
    # [B, H, D] view of [H, B, D] storage: the layout the model hands the backend
    q = torch.randn(num_heads, batch, head_dim, generator=gen).to(dtype).to(device)
    return q.transpose(0, 1)


def _run(case, q, scale, num_splits):
    out = torch.full_like(q, float("nan"))
    got = paged_decode(q, case.k_cache, case.v_cache, case.block_tables, case.seq_lens, scale,
                       int(case.seq_lens.max()), out=out, num_splits=num_splits)
    assert got is out
    return out


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "num_heads,num_kv_heads,head_dim,block_size",
    [(4, 2, 64, 4), (4, 1, 128, 16), (2, 2, 64, 1), (8, 2, 128, 8), (6, 3, 80, 2)],
    ids=["gqa-d64-b4", "mqa-d128-b16", "mha-b1", "gqa4-d128-b8", "odd-group-d80-b2"],
)
def test_decode_matches_reference(num_heads, num_kv_heads, head_dim, block_size, dtype, gen,
                                  device):
    seq_lens = [1, 7, 2 * block_size + 3, 21]  # partial last blocks, a one-token context
    case = make_paged_case(seq_lens, num_kv_heads, head_dim, block_size, dtype, gen, device)
    q = _query(len(seq_lens), num_heads, head_dim, dtype, gen, device)
    scale = head_dim ** -0.5
    ref = paged_decode_ref(q, case.k_cache, case.v_cache, case.block_tables, case.seq_lens, scale)
    assert_close_to_ref(_run(case, q, scale, num_splits=1), ref)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_splits", [2, 5])
def test_split_k_agrees_with_single_pass(num_splits, dtype, gen, device):
    seq_lens = [70, 3, 128, 33]  # 3 and 33 leave some splits empty
    case = make_paged_case(seq_lens, 2, 64, 8, dtype, gen, device)
    q = _query(len(seq_lens), 8, 64, dtype, gen, device)
    ref = paged_decode_ref(q, case.k_cache, case.v_cache, case.block_tables, case.seq_lens, 0.125)
    single = _run(case, q, 0.125, num_splits=1)
    split = _run(case, q, 0.125, num_splits=num_splits)
    assert_close_to_ref(split, ref)
    assert_close_to_ref(split, single)


def test_decode_leaves_other_rows_alone(gen, device):
    """The backend hands the kernel `out[:num_decodes]`; rows after it stay untouched."""
    case = make_paged_case([5, 9], 2, 64, 4, torch.float32, gen, device)
    q = _query(2, 4, 64, torch.float32, gen, device)
    out = torch.full((5, 4, 64), float("nan"), device=device)
    paged_decode(q, case.k_cache, case.v_cache, case.block_tables, case.seq_lens, 0.125, 9,
                 out=out[:2])
    assert not out[:2].isnan().any() and out[2:].isnan().all()


def test_decode_checks_its_arguments(gen, device):
    case = make_paged_case([5], 2, 64, 4, torch.float32, gen, device)
    q = _query(1, 4, 64, torch.float32, gen, device)
    with pytest.raises(AssertionError, match="block_tables must be torch.int32"):
        paged_decode(q, case.k_cache, case.v_cache, case.block_tables.long(), case.seq_lens,
                     0.125, 5)
    with pytest.raises(AssertionError, match="heads over"):
        paged_decode(q[:, :3], case.k_cache, case.v_cache, case.block_tables, case.seq_lens,
                     0.125, 5)
