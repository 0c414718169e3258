"""Attention with torch's scaled_dot_product_attention over K/V read from the paged cache."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from schedlab.attention import AttentionBackend, AttentionMetadata

#: decodes attended together in one SDPA call (each group is padded to its own longest context)
DECODE_GROUP_SIZE = 8


@dataclass(slots=True)
class _DecodeGroup:
    lo: int  # rows [lo, hi) of the packed batch
    hi: int
    block_ids: torch.Tensor  # [(hi - lo) * num_blocks] the group's block tables, flattened
    mask: torch.Tensor | None  # [hi - lo, 1, 1, num_blocks * block_size] additive, or None


@dataclass(slots=True)
class _PrefillSeq:
    lo: int
    hi: int
    ctx: int  # context length including the new tokens
    block_ids: torch.Tensor | None  # None: no earlier context, attend over the new K/V only
    mask: torch.Tensor | None  # [q, ctx] additive causal mask over the whole context


@dataclass(slots=True)
class _StepPlan:
    """What every layer of one step shares, derived from the metadata once (at layer 0)."""

    decodes: list[_DecodeGroup]
    prefills: list[_PrefillSeq]


class SDPABackend(AttentionBackend):
    """Reference backend: runs on any device torch runs on.

    New K/V are scattered into the cache by slot. Decodes are attended in groups of
    `DECODE_GROUP_SIZE` consecutive sequences (the executor orders decodes longest first, so
    a group pads to little), one SDPA call per group over K/V gathered through the block
    tables; grouped-query heads are folded into the query length (a decode's G query heads
    that share a KV head become G query rows), so K/V are never repeated per head. Each
    prefill chunk is one SDPA call, causal within the chunk, over its whole context; one with
    no earlier context attends over its own new K/V without reading the cache. Masks, block
    indices and groups are built once per step, at the first layer, and reused by the others.
    """

    def __init__(self, spec, num_blocks, device, decode_group_size: int = DECODE_GROUP_SIZE):
        super().__init__(spec, num_blocks, device)
        if decode_group_size <= 0:
            raise ValueError(f"decode_group_size must be positive, got {decode_group_size}")
        self.decode_group_size = decode_group_size
        self._meta: AttentionMetadata | None = None
        self._plan: _StepPlan | None = None

    def _step_plan(self, meta: AttentionMetadata, dtype: torch.dtype) -> _StepPlan:
        if meta is self._meta and self._plan is not None:
            return self._plan
        bs, dev = self.block_size, self.device
        lens = meta.seq_lens_host
        decodes = []
        for lo in range(0, meta.num_decodes, self.decode_group_size):
            hi = min(lo + self.decode_group_size, meta.num_decodes)
            longest = max(lens[lo:hi])
            nblocks = -(-longest // bs)
            ids = meta.block_tables[lo:hi, :nblocks].reshape(-1)
            mask = None
            if min(lens[lo:hi]) < nblocks * bs:
                pad = torch.arange(nblocks * bs, device=dev) >= meta.seq_lens[lo:hi, None]
                mask = torch.zeros(pad.shape, dtype=dtype, device=dev)
                mask.masked_fill_(pad, float("-inf"))
                mask = mask[:, None, None, :]
            decodes.append(_DecodeGroup(lo, hi, ids, mask))
        prefills = []
        start = meta.num_decodes
        for i in range(meta.num_decodes, meta.num_seqs):
            q_len, ctx = meta.query_lens[i], lens[i]
            end = start + q_len
            if ctx == q_len:
                prefills.append(_PrefillSeq(start, end, ctx, None, None))
            else:
                nblocks = -(-ctx // bs)
                qpos = torch.arange(ctx - q_len, ctx, device=dev)
                future = torch.arange(ctx, device=dev)[None, :] > qpos[:, None]
                mask = torch.zeros(future.shape, dtype=dtype, device=dev)
                mask.masked_fill_(future, float("-inf"))
                prefills.append(_PrefillSeq(start, end, ctx, meta.block_tables[i, :nblocks],
                                            mask))
            start = end
        self._meta, self._plan = meta, _StepPlan(decodes, prefills)
        return self._plan

    def forward(self, layer_idx, query, key, value, meta: AttentionMetadata, scale):
        k_cache, v_cache = self.k_caches[layer_idx], self.v_caches[layer_idx]
        num_tokens, num_heads, head_dim = query.shape
        num_kv_heads = key.shape[1]
        group = num_heads // num_kv_heads
        k_flat = k_cache.view(-1, num_kv_heads, head_dim)
        v_flat = v_cache.view(-1, num_kv_heads, head_dim)
        k_flat.index_copy_(0, meta.slot_mapping, key.to(k_cache.dtype))
        v_flat.index_copy_(0, meta.slot_mapping, value.to(v_cache.dtype))
        plan = self._step_plan(meta, query.dtype)

        out = query.new_empty(num_tokens, num_heads, head_dim)
        for g in plan.decodes:
            n = g.hi - g.lo
            # [n, L, Hkv, D] viewed as [n, Hkv, L, D]; a strided view, SDPA reads it in place
            k = k_cache.index_select(0, g.block_ids).view(n, -1, num_kv_heads, head_dim)
            v = v_cache.index_select(0, g.block_ids).view(n, -1, num_kv_heads, head_dim)
            q = query[g.lo : g.hi].reshape(n, num_kv_heads, group, head_dim)
            o = F.scaled_dot_product_attention(q, k.transpose(1, 2).to(q.dtype),
                                               v.transpose(1, 2).to(q.dtype),
                                               attn_mask=g.mask, scale=scale)
            out[g.lo : g.hi] = o.view(n, num_heads, head_dim)
        for p in plan.prefills:
            q_len = p.hi - p.lo
            q = query[p.lo : p.hi].transpose(0, 1)  # [H, q, D]
            if p.block_ids is None:  # nothing earlier in the cache: the new K/V directly
                k, v = key[p.lo : p.hi].transpose(0, 1), value[p.lo : p.hi].transpose(0, 1)
                causal, mask = True, None
            else:
                k = k_cache.index_select(0, p.block_ids).flatten(0, 1)[: p.ctx].transpose(0, 1)
                v = v_cache.index_select(0, p.block_ids).flatten(0, 1)[: p.ctx].transpose(0, 1)
                k, v = k.to(q.dtype), v.to(q.dtype)
                causal, mask = False, p.mask
            # grouped-query heads as a broadcast view [Hkv, G, len, D]: no per-head K/V copy
            kv_len = k.shape[1]
            k = k[:, None].expand(num_kv_heads, group, kv_len, head_dim)
            v = v[:, None].expand(num_kv_heads, group, kv_len, head_dim)
            o = F.scaled_dot_product_attention(
                q.reshape(num_kv_heads, group, q_len, head_dim), k, v, attn_mask=mask,
                is_causal=causal, scale=scale,
            )
            out[p.lo : p.hi] = o.view(num_heads, q_len, head_dim).transpose(0, 1)
        return out
