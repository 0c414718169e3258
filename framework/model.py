"""Serving dtypes as torch dtypes, and the hook that routes HF attention to ours."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from schedlab.config import DTYPE_NAMES

ATTN_IMPLEMENTATION = "schedlab"

DTYPES = dict(zip(DTYPE_NAMES, (torch.float32, torch.float16, torch.bfloat16) * 2, strict=True))


def resolve_dtype(name: str | torch.dtype) -> torch.dtype:
    if isinstance(name, torch.dtype):
        return name
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(f"dtype={name!r}; accepted: {', '.join(DTYPES)}") from None


@dataclass(slots=True)
class ForwardContext:
    """Passed through the HF forward as a keyword argument to our attention function."""

    backend: Any  # AttentionBackend
    meta: Any  # AttentionMetadata


def _attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """HF attention function: [1, H, T, D] tensors in, [1, T, H, D] out."""
    ctx: ForwardContext = kwargs["schedlab_ctx"]
    q = query[0].transpose(0, 1)
    k = key[0].transpose(0, 1)
    v = value[0].transpose(0, 1)
    if scaling is None:
        scaling = q.shape[-1] ** -0.5
    out = ctx.backend.forward(module.layer_idx, q, k, v, ctx.meta, scaling)
    return out.unsqueeze(0), None


_registered = False


def register_attention() -> None:
    """Make `attn_implementation="schedlab"` route every layer to `ForwardContext.backend`.

    NOTE: no mask function is registered for the name, so transformers builds no mask for our
    packed batches (the backend knows each sequence's causal structure from the metadata).
    """
    global _registered
    if _registered:
        return
    from transformers import AttentionInterface

    AttentionInterface.register(ATTN_IMPLEMENTATION, _attention)
    _registered = True
