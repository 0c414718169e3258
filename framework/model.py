"""Model shape from a Hugging Face config, and the hook that routes HF attention to ours."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
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


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """The shape of a decoder-only transformer: all a cost model or a KV sizer needs."""

    architecture: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int
    eos_token_ids: tuple[int, ...] = ()
    tie_word_embeddings: bool = False

    @property
    def num_params(self) -> int:
        """Parameters of attention, MLP (gated), embeddings and head (norms ignored)."""
        h, d = self.hidden_size, self.head_dim
        attn = h * d * (self.num_heads * 2 + self.num_kv_heads * 2)
        mlp = 3 * h * self.intermediate_size
        emb = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        return self.num_layers * (attn + mlp) + emb

    @classmethod
    def from_hf_config(cls, cfg: Any) -> ModelSpec:
        cfg = getattr(cfg, "text_config", None) or cfg
        heads = cfg.num_attention_heads
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
        eos = cfg.eos_token_id
        eos_ids = () if eos is None else tuple(eos) if isinstance(eos, list | tuple) else (eos,)
        archs = getattr(cfg, "architectures", None) or [type(cfg).__name__]
        return cls(
            architecture=archs[0],
            num_layers=cfg.num_hidden_layers,
            hidden_size=cfg.hidden_size,
            num_heads=heads,
            num_kv_heads=getattr(cfg, "num_key_value_heads", None) or heads,
            head_dim=head_dim,
            intermediate_size=cfg.intermediate_size,
            vocab_size=cfg.vocab_size,
            max_position_embeddings=getattr(cfg, "max_position_embeddings", 2048),
            eos_token_ids=eos_ids,
            tie_word_embeddings=bool(getattr(cfg, "tie_word_embeddings", False)),
        )

    @classmethod
    def from_pretrained(cls, path: str | Path) -> ModelSpec:
        """Read a checkpoint directory's config.json (no weights are loaded).

        EOS ids are those of config.json plus generation_config.json's (as vLLM and
        `generate()` use them: Llama-3-Instruct ends turns with a second EOS id there).
        """
        import json

        from transformers import AutoConfig

        p = Path(path)
        if not (p / "config.json").is_file():
            raise FileNotFoundError(
                f"model={str(path)!r} is not a checkpoint directory (no config.json there); "
                "nothing is downloaded: pass a local Hugging Face model directory"
            )
        spec = cls.from_hf_config(AutoConfig.from_pretrained(p))
        gen = p / "generation_config.json"
        if gen.is_file():
            eos = json.loads(gen.read_text()).get("eos_token_id")
            extra = eos if isinstance(eos, list) else [] if eos is None else [eos]
            merged = tuple(dict.fromkeys([*spec.eos_token_ids, *extra]))
            spec = replace(spec, eos_token_ids=merged)
        return spec


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
