"""Model shapes as data: presets of real models (configs only, no weights) and local configs.

The simulated executor needs only a `ModelSpec`; `resolve_model` takes a preset name or a
checkpoint directory (whose config.json is read, nothing else).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from schedlab.shapes import ModelSpec


@dataclass(frozen=True, slots=True)
class ModelPreset:
    """A model's shape and the dtype it is served in."""

    name: str
    spec: ModelSpec
    dtype: str = "bfloat16"


PRESETS: dict[str, ModelPreset] = {
    # meta-llama/Meta-Llama-3-8B-Instruct config.json
    "llama3_8b": ModelPreset("llama3_8b", ModelSpec(
        architecture="LlamaForCausalLM", num_layers=32, hidden_size=4096, num_heads=32,
        num_kv_heads=8, head_dim=128, intermediate_size=14336, vocab_size=128256,
        max_position_embeddings=8192, eos_token_ids=(128001, 128009))),
    # meta-llama/Meta-Llama-3-70B-Instruct config.json
    "llama3_70b": ModelPreset("llama3_70b", ModelSpec(
        architecture="LlamaForCausalLM", num_layers=80, hidden_size=8192, num_heads=64,
        num_kv_heads=8, head_dim=128, intermediate_size=28672, vocab_size=128256,
        max_position_embeddings=8192, eos_token_ids=(128001, 128009))),
    # Qwen/Qwen2.5-7B-Instruct config.json
    "qwen2_5_7b": ModelPreset("qwen2_5_7b", ModelSpec(
        architecture="Qwen2ForCausalLM", num_layers=28, hidden_size=3584, num_heads=28,
        num_kv_heads=4, head_dim=128, intermediate_size=18944, vocab_size=152064,
        max_position_embeddings=32768, eos_token_ids=(151645, 151643))),
}


def _namespace(obj: Any) -> Any:
    if isinstance(obj, dict):
        return SimpleNamespace(**{k: _namespace(v) for k, v in obj.items()})
    return obj


def load_config_dir(path: str | Path) -> ModelPreset:
    """A checkpoint directory's shape from its config.json (no weights, no transformers)."""
    p = Path(path)
    cfg_file = p / "config.json"
    if not cfg_file.is_file():
        raise FileNotFoundError(f"model={str(path)!r}: no config.json there")
    raw = json.loads(cfg_file.read_text())
    cfg = _namespace(raw)
    text = getattr(cfg, "text_config", None)
    if text is not None and not hasattr(text, "architectures"):
        text.architectures = getattr(cfg, "architectures", None)
    spec = ModelSpec.from_hf_config(cfg)
    dtype = (getattr(text or cfg, "torch_dtype", None) or getattr(text or cfg, "dtype", None)
             or "bfloat16")
    return ModelPreset(p.name, spec, str(dtype))


def resolve_model(model: str | Path) -> ModelPreset:
    """A preset name (`llama3_8b`, ...) or a local checkpoint/config directory.

    Raises:
        ValueError: neither a preset nor a directory with a config.json.
    """
    key = str(model)
    if key in PRESETS:
        return PRESETS[key]
    p = Path(key)
    if (p / "config.json").is_file():
        return load_config_dir(p)
    raise ValueError(
        f"model={key!r} is neither a preset ({', '.join(PRESETS)}) nor a local directory "
        "with a config.json"
    )
