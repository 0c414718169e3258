"""KV memory accounting: M = 2 x layers x kv_heads x head_dim x tokens x bytes."""

from __future__ import annotations

import pytest
import torch

from schedlab import LLM
from schedlab.config import parse_bytes
from schedlab.shapes import KVCacheSpec


def test_reference_example_512_mib():
    # 32 layers, 8 KV heads, head dim 128, 4096 tokens, 1 sequence, bf16 -> 512 MiB
    spec = KVCacheSpec(num_layers=32, num_kv_heads=8, head_dim=128, dtype=torch.bfloat16,
                       block_size=16)
    assert spec.bytes_for(4096, num_seqs=1) == 512 * 2**20
    assert spec.bytes_per_token == 128 * 1024
    assert spec.bytes_per_block == 16 * 128 * 1024


@pytest.mark.parametrize("text, n", [("512MiB", 512 * 2**20), ("2GiB", 2 * 2**30),
                                     ("1.5GB", 1_500_000_000), (4096, 4096)])
def test_parse_bytes(text, n):
    assert parse_bytes(text) == n


def test_kv_cache_memory_sizes_the_pool(llama_dir):
    # tiny llama: 2 layers, 2 KV heads, head dim 16, fp32 -> 512 bytes a token, 8 KiB a block
    llm = LLM(llama_dir, kv_cache_memory="1MiB", block_size=16, max_model_len=64)
    assert llm.engine.kv_spec.bytes_per_token == 2 * 2 * 2 * 16 * 4
    assert llm.engine.num_kv_blocks == 2**20 // (16 * 512)
    backend = llm.engine.executor.backend
    cache_bytes = sum(t.numel() * t.element_size() for t in backend.k_caches + backend.v_caches)
    assert cache_bytes == llm.engine.num_kv_blocks * 16 * 512
