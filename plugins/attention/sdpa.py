"""Attention with torch's scaled_dot_product_attention over K/V read from the paged cache."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from schedlab.attention import AttentionBackend, AttentionMetadata
from schedlab.shapes import padded_decode_groups

#: padding a group of decodes attended in one SDPA call may add, as a fraction of the K/V it
#: really reads (see `padded_decode_groups`); measured on the CPU in experiments/PERF_NOTES.md
DECODE_PAD_WASTE = 0.25
#: the most padded K/V tokens one decode call gathers, by device type (None: no cap). On a CPU
#: a gather larger than the caches slows SDPA down more than extra calls cost; on a GPU the
#: launches are what cost (PERF_NOTES.md).
DECODE_GROUP_TOKENS: dict[str, int | None] = {"cpu": 2048, "cuda": None}


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
    stored: torch.Tensor | None  # rows whose K/V are stored; None: all (no padding slots)
    #: a captured step: every row's slot, padding sent to the sink slot (None: eager)
    sink_slots: torch.Tensor | None = None


class SDPABackend(AttentionBackend):
    """Reference backend: runs on any device torch runs on.

    New K/V are scattered into the cache by slot (padding slots skipped). Decodes are attended
    as a few padded batches, one SDPA call each over K/V gathered through the block tables:
    the executor orders decodes longest context first, and `padded_decode_groups` cuts them
    where padding to the group's longest context would read more than `decode_pad_waste`
    extra K/V (contexts of similar length: one call for the whole batch; `inf`: always one
    call). Grouped-query heads are folded into the query length (a decode's G query heads
    that share a KV head become G query rows), so K/V are never repeated per head. Each
    prefill chunk is one SDPA call, causal within the chunk, over its whole context; one with
    no earlier context attends over its own new K/V without reading the cache. Masks, block
    indices and groups are built once per step, at the first layer, and reused by the others.

    A captured decode step (`meta.graph_capture`, decodes only; `supports_cuda_graphs`) reads
    no host copy and never syncs: one SDPA call over all decodes, K/V gathered through the
    block tables up to their full width (fixed at capture: the graph runner gives each context
    bucket its own capture and width, `graph_context_buckets`), an additive mask from the
    device `seq_lens`, and every row's K/V stored with one `index_copy_` whose padding slots
    (`PAD_SLOT_ID`) are redirected by `torch.where` to a sink slot: one extra cache block past
    the `num_blocks` the allocator hands out (`k_caches` are views without it), written and
    never read. Eager steps (prefills, mixed steps, `enforce_eager`) take the grouped path.

    Args:
        spec: the model's KV shape.
        num_blocks: blocks in the pool.
        device: where the cache lives.
        decode_pad_waste: the padding a decode group may add (fraction >= 0; `inf`: no bound).
        decode_group_tokens: the most padded K/V tokens one decode call gathers; `None`
            (default) takes the device's entry of `DECODE_GROUP_TOKENS`; 0: no cap.
    """

    supports_cuda_graphs = True
    decode_pad_waste = DECODE_PAD_WASTE
    graph_context_buckets = True

    def __init__(self, spec, num_blocks, device, decode_pad_waste: float = DECODE_PAD_WASTE,
                 decode_group_tokens: int | None = None):
        # NOTE: one block more than the pool: the sink of a captured step's padding slots
        super().__init__(spec, num_blocks + 1, device)
        self.num_blocks = num_blocks
        self._k_full, self._v_full = self.k_caches, self.v_caches
        self.k_caches = [k[:num_blocks] for k in self._k_full]
        self.v_caches = [v[:num_blocks] for v in self._v_full]
        self.sink_slot = num_blocks * self.block_size
        if (isinstance(decode_pad_waste, bool) or not isinstance(decode_pad_waste, int | float)
                or not decode_pad_waste >= 0):
            raise ValueError(f"attention_options decode_pad_waste={decode_pad_waste!r} must be "
                             "a number >= 0 (inf: one call for all decodes)")
        self.max_pad_waste = float(decode_pad_waste)
        if decode_group_tokens is None:
            decode_group_tokens = DECODE_GROUP_TOKENS.get(self.device.type)
        elif isinstance(decode_group_tokens, bool) or not isinstance(decode_group_tokens, int) \
                or decode_group_tokens < 0:
            raise ValueError(f"attention_options decode_group_tokens={decode_group_tokens!r} "
                             "must be an integer >= 0 (0: no cap)")
        self.decode_group_tokens = decode_group_tokens or None
        self._meta: AttentionMetadata | None = None
        self._plan: _StepPlan | None = None

    def _step_plan(self, meta: AttentionMetadata, dtype: torch.dtype) -> _StepPlan:
        if meta is self._meta and self._plan is not None:
            return self._plan
        if meta.graph_capture:
            self._meta, self._plan = meta, self._captured_plan(meta, dtype)
            return self._plan
        bs, dev = self.block_size, self.device
        lens = meta.seq_lens_host
        decodes = []
        for lo, hi in padded_decode_groups(lens[: meta.num_decodes], self.max_pad_waste,
                                           self.decode_group_tokens):
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
        stored = None
        if meta.num_decodes and lens[meta.num_decodes - 1] == 1:  # maybe padded: one check
            keep = meta.slot_mapping >= 0
            if not bool(keep.all()):
                stored = keep.nonzero().squeeze(1)
        self._meta, self._plan = meta, _StepPlan(decodes, prefills, stored)
        return self._plan

    def _captured_plan(self, meta: AttentionMetadata, dtype: torch.dtype) -> _StepPlan:
        """The plan of a captured decode step: device tensors only, shapes from the metadata's
        tensors (the block tables' width), no host copy read and no sync."""
        if meta.num_decodes != meta.num_seqs:
            raise ValueError("sdpa: a captured step (graph_capture) must be decodes only")
        rows, width = meta.block_tables.shape
        pad = (torch.arange(width * self.block_size, device=self.device)
               >= meta.seq_lens[:, None])
        mask = torch.zeros(pad.shape, dtype=dtype, device=self.device).masked_fill_(
            pad, float("-inf"))
        group = _DecodeGroup(0, rows, meta.block_tables.reshape(-1), mask[:, None, None, :])
        slots = torch.where(meta.slot_mapping >= 0, meta.slot_mapping, self.sink_slot)
        return _StepPlan([group], [], None, slots)

    def forward(self, layer_idx, query, key, value, meta: AttentionMetadata, scale):
        k_cache, v_cache = self.k_caches[layer_idx], self.v_caches[layer_idx]
        num_tokens, num_heads, head_dim = query.shape
        num_kv_heads = key.shape[1]
        group = num_heads // num_kv_heads
        plan = self._step_plan(meta, query.dtype)
        if plan.sink_slots is not None:  # captured: the sink block is in these views
            k_cache, v_cache = self._k_full[layer_idx], self._v_full[layer_idx]
        k_flat = k_cache.view(-1, num_kv_heads, head_dim)
        v_flat = v_cache.view(-1, num_kv_heads, head_dim)
        slots, new_k, new_v = meta.slot_mapping, key, value
        if plan.sink_slots is not None:
            slots = plan.sink_slots
        elif plan.stored is not None:  # padding rows of a bucketed step: not stored
            slots = slots.index_select(0, plan.stored)
            new_k, new_v = key.index_select(0, plan.stored), value.index_select(0, plan.stored)
        k_flat.index_copy_(0, slots, new_k.to(k_cache.dtype))
        v_flat.index_copy_(0, slots, new_v.to(v_cache.dtype))

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
            # NOTE: reshape, not view: a CUDA SDPA kernel may return a non-contiguous output
            out[g.lo : g.hi] = o.reshape(n, num_heads, head_dim)
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
            out[p.lo : p.hi] = o.reshape(num_heads, q_len, head_dim).transpose(0, 1)
        return out
