"""Shapes and sizes with no torch: a model's shape, its KV cache's, decode padding.

What a cost model, a KV sizer or a simulated run needs; importing it pulls in neither torch
nor transformers (`tests/test_layout.py` keeps it so).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

#: serving dtypes by name (the names `EngineConfig.dtype` accepts) and their element bytes
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "fp32": 4, "fp16": 2, "bf16": 2}


def dtype_bytes(dtype: Any) -> int:
    """Element bytes of a dtype name (`DTYPE_BYTES`) or of anything with `itemsize` (a
    torch.dtype).

    Raises:
        ValueError: an unknown name, with the accepted ones.
    """
    size = getattr(dtype, "itemsize", None)
    if isinstance(size, int):
        return size
    try:
        return DTYPE_BYTES[dtype]
    except (KeyError, TypeError):
        raise ValueError(f"dtype={dtype!r}; accepted: {', '.join(DTYPE_BYTES)}") from None


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



def padded_decode_groups(
    contexts: Sequence[int], max_waste: float, max_tokens: int | None = None
) -> list[tuple[int, int]]:
    """Cut decodes sorted longest context first into groups attended as one padded batch each.

    A group starts at its longest context and grows while its padded K/V tokens (rows x the
    longest context) stay within `(1 + max_waste)` x the tokens it really reads and within
    `max_tokens`; `inf` and `None` make one group of everything. One pass, no tensor work.

    Args:
        contexts: context lengths, non-increasing.
        max_waste: the padding a group may add, as a fraction of its real K/V tokens (>= 0).
        max_tokens: the most padded K/V tokens one group may gather (None: no cap); a group
            always takes at least one row.

    Returns:
        `[lo, hi)` row ranges covering `contexts` in order.
    """
    groups: list[tuple[int, int]] = []
    lo, n = 0, len(contexts)
    while lo < n:
        longest, total, hi = contexts[lo], contexts[lo], lo + 1
        limit = 1.0 + max_waste
        cap = n if max_tokens is None else max(1, max_tokens // max(1, longest))
        while (hi < n and hi - lo < cap
               and longest * (hi - lo + 1) <= limit * (total + contexts[hi])):
            total += contexts[hi]
            hi += 1
        groups.append((lo, hi))
        lo = hi
    return groups


def padded_decode_kv(contexts: Sequence[int], max_waste: float | None) -> int:
    """K/V tokens read by decodes of `contexts` under `padded_decode_groups` (`None`: each
    decode reads only its own context, as paged kernels do)."""
    if max_waste is None:
        return sum(contexts)
    ctx = sorted(contexts, reverse=True)
    return sum(ctx[lo] * (hi - lo) for lo, hi in padded_decode_groups(ctx, max_waste))


@dataclass(frozen=True, slots=True)
class KVCacheSpec:
    """The shape of the KV cache of one model.

    Memory follows M = 2 x layers x kv_heads x head_dim x tokens x bytes per element.
    """

    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: Any  # a dtype name ("bfloat16") or a torch.dtype
    block_size: int

    @property
    def bytes_per_token(self) -> int:
        elem = dtype_bytes(self.dtype)
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * elem

    @property
    def bytes_per_block(self) -> int:
        return self.bytes_per_token * self.block_size

    def bytes_for(self, num_tokens: int, num_seqs: int = 1) -> int:
        return self.bytes_per_token * num_tokens * num_seqs

    def num_blocks_for(self, memory_bytes: int) -> int:
        return int(memory_bytes // self.bytes_per_block)
