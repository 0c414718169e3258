"""Small random-weight checkpoints built from a transformers config (nothing is downloaded).

`build_tiny_model` writes a normal checkpoint directory (config.json, safetensors weights,
tokenizer files) that loads through the same path as any real checkpoint.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

FAMILIES = ("llama", "qwen2", "mistral")

#: size presets: hidden, layers, heads, kv heads, intermediate, vocab (None: the tokenizer's)
SIZES: dict[str, dict[str, int | None]] = {
    "tiny": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, intermediate_size=128, vocab_size=None),
    "small": dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=8,
                  num_key_value_heads=2, intermediate_size=688, vocab_size=None),
    "150m": dict(hidden_size=1024, num_hidden_layers=8, num_attention_heads=16,
                 num_key_value_heads=4, intermediate_size=2816, vocab_size=32000),
}

_CORPUS = """
Large language model inference has two phases. The prefill phase processes the prompt in
parallel and is bound by compute; the decode phase produces one token per step and is bound by
memory bandwidth. Continuous batching lets requests join and leave the batch at every step.
Paged attention stores the key and value cache in fixed-size blocks, so memory is not reserved
for tokens that never come. Chunked prefill splits long prompts so decodes are never stalled.
Prefix caching reuses the cache of a shared system prompt across requests. The scheduler decides
which requests run, how many tokens each, and which are preempted when memory runs out.
The quick brown fox jumps over the lazy dog. 0123456789 + - * / = ( ) [ ] { } < > ! ? , . ; :
"""


#: a plain chat template (role tags the tiny vocabulary spells), so chat endpoints work
CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")


def cache_dir() -> Path:
    """Where built models are kept: $SCHEDLAB_CACHE or ~/.cache/schedlab."""
    root = os.environ.get("SCHEDLAB_CACHE") or Path.home() / ".cache" / "schedlab"
    return Path(root)


def train_tokenizer(vocab_size: int = 512):
    """The tiny byte-level BPE tokenizer (a `tokenizers.Tokenizer`), trained on a built-in
    paragraph: deterministic, offline, no transformers."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>", "<pad>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([_CORPUS] * 4, trainer=trainer)
    return tok


def build_tokenizer(vocab_size: int = 512):
    """`train_tokenizer` as a transformers tokenizer, with `CHAT_TEMPLATE`."""
    from transformers import PreTrainedTokenizerFast

    out = PreTrainedTokenizerFast(
        tokenizer_object=train_tokenizer(vocab_size), eos_token="<|endoftext|>",
        pad_token="<pad>"
    )
    out.chat_template = CHAT_TEMPLATE
    return out


def build_tiny_model(
    path: str | Path | None = None,
    family: str = "llama",
    size: str = "tiny",
    seed: int = 0,
    initializer_range: float = 0.1,
    max_position_embeddings: int = 2048,
    overwrite: bool = False,
) -> Path:
    """Build (or reuse) a random-weight checkpoint and return its directory.

    Args:
        path: where to save; default `cache_dir()/<family>-<size>-s<seed>`.
        family: "llama", "qwen2" or "mistral".
        size: a key of `SIZES`.
        seed: seeds the weights; the same arguments give the same checkpoint.
        initializer_range: weight std; larger than HF's 0.02 so random models have peaked,
            tie-free next-token distributions.
    """
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, MistralConfig, Qwen2Config

    if family not in FAMILIES:
        raise ValueError(f"family={family!r}; accepted: {', '.join(FAMILIES)}")
    if size not in SIZES:
        raise ValueError(f"size={size!r}; accepted: {', '.join(SIZES)}")
    out = Path(path) if path is not None else cache_dir() / f"{family}-{size}-s{seed}"
    stamp = out / "schedlab_build.json"
    recipe = dict(family=family, size=size, seed=seed, initializer_range=initializer_range,
                  max_position_embeddings=max_position_embeddings, version=2)
    if not overwrite and stamp.is_file() and json.loads(stamp.read_text()) == recipe:
        return out

    tokenizer = build_tokenizer()
    shape = dict(SIZES[size])
    if shape["vocab_size"] is None:
        shape["vocab_size"] = len(tokenizer)
    common = dict(
        **shape,
        max_position_embeddings=max_position_embeddings,
        initializer_range=initializer_range,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
        tie_word_embeddings=False,
    )
    cfg_cls = {"llama": LlamaConfig, "qwen2": Qwen2Config, "mistral": MistralConfig}[family]
    config = cfg_cls(**common)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    # Built in a private sibling directory and moved in file by file, the stamp last: a process
    # building the same checkpoint at the same time (parallel test workers) never reads half of
    # it, and a directory the caller named is written into, never removed.
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{out.name}.", dir=out.parent) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        Path(tmp, stamp.name).write_text(json.dumps(recipe))
        out.mkdir(exist_ok=True)
        for f in sorted(Path(tmp).iterdir(), key=lambda f: f.name == stamp.name):
            os.replace(f, out / f.name)
    return out
