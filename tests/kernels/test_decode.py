"""paged_decode vs paged_decode_ref over random paged caches, with and without split-K."""

from __future__ import annotations

import pytest
import torch
from paged_cases import assert_attention_close, attention_error, make_paged_case

from schedlab.kernels.decode_attention import choose_num_splits, paged_decode, paged_decode_ref

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _query(batch, num_heads, head_dim, dtype, gen, device):
    # [B, H, D] view of [H, B, D] storage: the layout the model hands the backend
    q = torch.randn(num_heads, batch, head_dim, generator=gen).to(dtype).to(device)
    return q.transpose(0, 1)


def _refs(case, q, scale):
    """(fp32-math reference, torch's own math in q's dtype) for `case`."""
    f = torch.float32
    ref32 = paged_decode_ref(q.to(f), case.k_cache.to(f), case.v_cache.to(f), case.block_tables,
                             case.seq_lens, scale)
    lowp = paged_decode_ref(q, case.k_cache, case.v_cache, case.block_tables, case.seq_lens,
                            scale, upcast=False)
    return ref32, lowp


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
    assert_attention_close(_run(case, q, scale, num_splits=1), *_refs(case, q, scale))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_splits", [2, 5])
def test_split_k_agrees_with_single_pass(num_splits, dtype, gen, device):
    seq_lens = [70, 3, 128, 33]  # 3 and 33 leave some splits empty
    case = make_paged_case(seq_lens, 2, 64, 8, dtype, gen, device)
    q = _query(len(seq_lens), 8, 64, dtype, gen, device)
    refs = _refs(case, q, 0.125)
    single = _run(case, q, 0.125, num_splits=1)
    split = _run(case, q, 0.125, num_splits=num_splits)
    assert_attention_close(split, *refs)
    assert_attention_close(single, *refs)


@pytest.mark.parametrize("dtype", DTYPES)
def test_an_upper_bound_on_max_seq_len_changes_nothing(dtype, gen, device):
    """A captured CUDA graph launches with max_model_len, not the step's longest context, over
    block tables as wide as max_model_len."""
    case = make_paged_case([9, 3, 40], 2, 64, 4, dtype, gen, device)
    q = _query(3, 4, 64, dtype, gen, device)
    exact = _run(case, q, 0.125, num_splits=1)
    wide = torch.zeros(3, 16, dtype=torch.int32, device=device)  # 64 tokens of blocks of 4
    wide[:, : case.block_tables.shape[1]] = case.block_tables
    for splits in (1, 3):
        out = torch.full_like(q, float("nan"))
        paged_decode(q, case.k_cache, case.v_cache, wide, case.seq_lens, 0.125, 64, out=out,
                     num_splits=splits)
        assert_attention_close(out, *_refs(case, q, 0.125))
        if dtype == torch.float32:
            torch.testing.assert_close(out, exact)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("wrong", ["scale-5pct", "off-by-one-slot", "swap-kv-heads"])
def test_the_low_precision_check_catches_a_wrong_result(wrong, dtype, gen, device):
    """The tolerance is loose enough for compiled bf16 kernels, yet a subtly wrong attention
    (as a buggy kernel would give) still fails it."""
    case = make_paged_case([7, 33, 64, 20], 2, 64, 8, dtype, gen, device, poison_unused=False)
    q = _query(4, 8, 64, dtype, gen, device)
    ref32, lowp = _refs(case, q, 0.125)
    f = torch.float32
    args = (q.to(f), case.k_cache.to(f), case.v_cache.to(f), case.block_tables, case.seq_lens)
    if wrong == "scale-5pct":
        bad = paged_decode_ref(*args, 0.125 * 1.05)
    elif wrong == "off-by-one-slot":  # every token read from the next cache slot
        k = args[1].flatten(0, 1).roll(-1, 0).view_as(args[1])
        v = args[2].flatten(0, 1).roll(-1, 0).view_as(args[2])
        bad = paged_decode_ref(args[0], k, v, *args[3:], 0.125)
    else:
        bad = paged_decode_ref(args[0], args[1].flip(2), args[2].flip(2), *args[3:], 0.125)
    bad = bad.to(dtype)
    err, bound = attention_error(bad, ref32, lowp)
    assert err > bound, f"{wrong}: error {err:.3g} passes the bound {bound:.3g}"


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


def test_split_choice_fills_the_gpu_for_small_batches_only():
    sms = 132  # an H200
    # a full batch is never split; a 4-programs-per-SM batch neither
    assert choose_num_splits(256 * 8, 4096, sms) == 1
    assert choose_num_splits(4 * sms, 32768, sms) == 1
    # batch 1 at 32k context: many splits of >= 128 tokens, more programs than SMs
    one = choose_num_splits(8, 32768, sms)
    assert one * 8 >= 4 * sms and 32768 // one >= 128
    # shorter contexts never split below 128 tokens a part; nothing to split below that
    assert choose_num_splits(8, 512, sms) == 4
    assert choose_num_splits(8, 100, sms) == 1
    # smaller batches and longer contexts get at least as many splits
    for ctx in (1024, 8192, 32768):
        counts = [choose_num_splits(b * 8, ctx, sms) for b in (1, 2, 4, 16, 32, 64)]
        assert counts == sorted(counts, reverse=True)
    assert choose_num_splits(8, 1 << 20, sms) <= 128
