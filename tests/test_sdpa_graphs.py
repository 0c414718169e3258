"""The sdpa backend's captured decode step: one padded call over the block tables' width,
a mask from the device lengths, padding slots stored in the sink block."""

from __future__ import annotations

import pytest
import torch

from schedlab.attention import PAD_SLOT_ID, AttentionMetadata
from schedlab.plugins.attention.sdpa import SDPABackend
from schedlab.shapes import KVCacheSpec

H, HKV, D, BS, NUM_BLOCKS = 4, 2, 16, 4, 20
CTX = [13, 7, 2]  # real decodes, longest first
TABLES = [[3, 9, 0, 14], [5, 11], [17]]


def _backend() -> SDPABackend:
    spec = KVCacheSpec(num_layers=1, num_kv_heads=HKV, head_dim=D, dtype=torch.float32,
                       block_size=BS)
    b = SDPABackend(spec, NUM_BLOCKS, "cpu")
    g = torch.Generator().manual_seed(0)
    b.k_caches[0].copy_(torch.randn(b.k_caches[0].shape, generator=g))
    b.v_caches[0].copy_(torch.randn(b.v_caches[0].shape, generator=g))
    return b


def _meta(num_pad: int, width: int, captured: bool) -> AttentionMetadata:
    """The real decodes, then `num_pad` fillers; block-table columns past each context hold
    other sequences' blocks (stale entries of the graph runner's buffer)."""
    n = len(CTX) + num_pad
    bt = torch.randint(0, NUM_BLOCKS, (n, width), generator=torch.Generator().manual_seed(1),
                       dtype=torch.int32)
    for i, t in enumerate(TABLES):
        bt[i, : len(t)] = torch.tensor(t)
    bt[len(CTX):, 0] = 0
    slots = [t[(c - 1) // BS] * BS + (c - 1) % BS for t, c in zip(TABLES, CTX, strict=True)]
    lens = CTX + [1] * num_pad
    host = [width * BS] * n if captured else lens
    return AttentionMetadata(
        slot_mapping=torch.tensor(slots + [PAD_SLOT_ID] * num_pad),
        query_start_loc=torch.arange(n + 1, dtype=torch.int32),
        seq_lens=torch.tensor(lens, dtype=torch.int32), block_tables=bt, query_lens=[1] * n,
        seq_lens_host=host, num_decodes=n, max_query_len=1, max_seq_len=max(host),
        graph_capture=captured)


def test_captured_step_equals_the_eager_step_and_stores_padding_in_the_sink():
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(5, h, D, generator=g) for h in (H, HKV, HKV))
    k[3:] = v[3:] = 7.0  # the fillers' K/V: must land in no real block
    eager, captured = _backend(), _backend()
    out_e = eager.forward(0, q[:3], k[:3], v[:3], _meta(0, 4, captured=False), D ** -0.5)
    out_c = captured.forward(0, q, k, v, _meta(2, 6, captured=True), D ** -0.5)
    torch.testing.assert_close(out_c[:3], out_e, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(captured.k_caches[0], eager.k_caches[0], atol=0, rtol=0)
    torch.testing.assert_close(captured.v_caches[0], eager.v_caches[0], atol=0, rtol=0)
    # the pool the allocator sees has NUM_BLOCKS blocks; the sink block past it took the K/V
    assert captured.k_caches[0].shape[0] == NUM_BLOCKS
    sink = captured.sink_slot
    assert sink == NUM_BLOCKS * BS
    assert bool((captured._k_full[0].view(-1, HKV, D)[sink] == 7.0).all())


def test_a_captured_step_must_be_decodes_only():
    b = _backend()
    meta = _meta(0, 4, captured=True)
    meta.query_lens, meta.num_decodes = [1, 1, 2], 2
    with pytest.raises(ValueError, match="decodes only"):
        b.forward(0, torch.randn(4, H, D), torch.randn(4, HKV, D), torch.randn(4, HKV, D), meta,
                  D ** -0.5)
