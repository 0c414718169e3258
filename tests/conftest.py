"""Shared fixtures: small random-weight checkpoints built once per session, offline."""

from __future__ import annotations

import os

# Before anything imports triton or wandb: kernels run in the interpreter without a GPU, and
# W&B never reaches the network from tests.
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
try:
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
except ImportError:  # pragma: no cover
    pass

import pytest  # noqa: E402


def pytest_collection_modifyitems(config, items):
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def model_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="session")
def llama_dir(model_cache):
    from schedlab.tiny import build_tiny_model

    return str(build_tiny_model(model_cache / "llama-tiny", family="llama",
                                max_position_embeddings=512))


@pytest.fixture(scope="session")
def qwen2_dir(model_cache):
    from schedlab.tiny import build_tiny_model

    return str(build_tiny_model(model_cache / "qwen2-tiny", family="qwen2",
                                max_position_embeddings=512))


@pytest.fixture(scope="session", params=["llama", "qwen2"])
def model_dir(request, llama_dir, qwen2_dir):
    return {"llama": llama_dir, "qwen2": qwen2_dir}[request.param]


@pytest.fixture(scope="session")
def hf_reference():
    """Greedy continuations from transformers' own generate(), memoised per (model, prompt)."""
    import torch
    from transformers import AutoModelForCausalLM

    models: dict[str, object] = {}
    memo: dict[tuple, list[int]] = {}

    def generate(model_dir: str, prompt: list[int], max_new_tokens: int) -> list[int]:
        key = (model_dir, tuple(prompt), max_new_tokens)
        if key not in memo:
            if model_dir not in models:
                models[model_dir] = AutoModelForCausalLM.from_pretrained(
                    model_dir, dtype=torch.float32).eval()
            with torch.inference_mode():
                out = models[model_dir].generate(
                    torch.tensor([prompt]), max_new_tokens=max_new_tokens, do_sample=False)
            memo[key] = out[0, len(prompt):].tolist()
        return memo[key]

    return generate
