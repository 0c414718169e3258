"""Attention with torch's scaled_dot_product_attention over K/V gathered from the paged cache."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from schedlab.attention import AttentionBackend, AttentionMetadata


class SDPABackend(AttentionBackend):
    """Reference backend: runs on any device torch runs on.

    New K/V are scattered into the cache by slot. Decode queries of the whole batch are
    attended in one SDPA call over K/V gathered through the block tables (padded, masked);
    each prefill chunk is one SDPA call, causal within the chunk, over its whole context. A
    prefill with no earlier context attends over its own new K/V without reading the cache.
    """

    def forward(self, layer_idx, query, key, value, meta: AttentionMetadata, scale):
        k_cache, v_cache = self.k_caches[layer_idx], self.v_caches[layer_idx]
        num_kv_heads, head_dim = key.shape[1], key.shape[2]
        k_flat = k_cache.view(-1, num_kv_heads, head_dim)
        v_flat = v_cache.view(-1, num_kv_heads, head_dim)
        k_flat.index_copy_(0, meta.slot_mapping, key.to(k_cache.dtype))
        v_flat.index_copy_(0, meta.slot_mapping, value.to(v_cache.dtype))

        out = torch.empty_like(query)
        nd = meta.num_decodes
        bs = self.block_size
        if nd:
            max_len = max(meta.seq_lens_host[:nd])
            nblocks = -(-max_len // bs)
            bt = meta.block_tables[:nd, :nblocks]
            k = k_cache[bt].flatten(1, 2)  # [nd, L, Hkv, D]
            v = v_cache[bt].flatten(1, 2)
            valid = torch.arange(nblocks * bs, device=query.device) < meta.seq_lens[:nd, None]
            o = F.scaled_dot_product_attention(
                query[:nd].unsqueeze(2),  # [nd, H, 1, D]
                k.transpose(1, 2),
                v.transpose(1, 2),
                attn_mask=valid[:, None, None, :],
                scale=scale,
                enable_gqa=True,
            )
            out[:nd] = o.squeeze(2).to(out.dtype)
        start = nd
        for i in range(nd, meta.num_seqs):
            q_len, ctx = meta.query_lens[i], meta.seq_lens_host[i]
            end = start + q_len
            q = query[start:end].transpose(0, 1)  # [H, q, D]
            if ctx == q_len:  # nothing earlier in the cache: attend over the new K/V directly
                k = key[start:end].transpose(0, 1)
                v = value[start:end].transpose(0, 1)
                o = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale,
                                                   enable_gqa=True)
            else:
                nblocks = -(-ctx // bs)
                bt = meta.block_tables[i, :nblocks]
                k = k_cache[bt].flatten(0, 1)[:ctx].transpose(0, 1)  # [Hkv, ctx, D]
                v = v_cache[bt].flatten(0, 1)[:ctx].transpose(0, 1)
                qpos = torch.arange(ctx - q_len, ctx, device=query.device)
                mask = torch.arange(ctx, device=query.device)[None, :] <= qpos[:, None]
                o = F.scaled_dot_product_attention(q, k.to(q.dtype), v.to(q.dtype),
                                                   attn_mask=mask, scale=scale, enable_gqa=True)
            out[start:end] = o.transpose(0, 1)
            start = end
        return out
