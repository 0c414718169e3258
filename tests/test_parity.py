"""Greedy output equals transformers' own generate(), token for token."""

from __future__ import annotations

import random

import pytest

from schedlab import LLM, SamplingParams

MAX_TOKENS = 12


def prompts(seed: int = 0, n: int = 9) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(2, 400) for _ in range(rng.randint(3, 48))] for _ in range(n)]


# roomy: everything fits at once. tight: a small token budget and KV pool force many steps
# and (for the paged allocator) preemptions.
SETTINGS = {
    "roomy": dict(max_model_len=128, max_num_batched_tokens=512, num_kv_blocks=256),
    "tight": dict(max_model_len=64, max_num_batched_tokens=64, num_kv_blocks=20, max_num_seqs=4),
}


@pytest.mark.parametrize("setting", sorted(SETTINGS))
@pytest.mark.parametrize("allocator", ["paged", "contiguous"])
@pytest.mark.parametrize("scheduler", ["static", "continuous"])
def test_greedy_parity(model_dir, hf_reference, scheduler, allocator, setting):
    kw = dict(SETTINGS[setting])
    ps = prompts()
    if setting == "tight":
        ps = [p[:40] for p in ps]
    llm = LLM(model_dir, scheduler=scheduler, kv_allocator=allocator, block_size=4,
              kv_allocator_options={"reserve": "request"} if allocator == "contiguous" else {},
              **kw)
    outs = llm.generate(ps, SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS))
    for p, o in zip(ps, outs, strict=True):
        assert o.outputs[0].finish_reason in ("length", "stop")
        assert o.outputs[0].token_ids == hf_reference(model_dir, p, MAX_TOKENS)
    steps = len(llm.engine.step_stats)
    if setting == "tight":
        assert steps > MAX_TOKENS * 2, "a tight budget should take many steps"
        if allocator == "paged" and scheduler == "continuous":
            assert llm.engine.scheduler.num_preemptions > 0
    # every block is back in the free pool
    u = llm.engine.kv.usage()
    assert u.free_blocks == u.num_blocks


def test_preemption_keeps_output(llama_dir, hf_reference):
    """Recompute preemption: a victim's output continues exactly where it stopped."""
    ps = prompts(seed=3, n=8)
    llm = LLM(llama_dir, max_model_len=80, max_num_batched_tokens=80, num_kv_blocks=24,
              block_size=4)
    outs = llm.generate(ps, SamplingParams(temperature=0.0, max_tokens=24))
    assert llm.engine.scheduler.num_preemptions >= 3
    assert sum(o.metrics.num_preemptions for o in outs) == llm.engine.scheduler.num_preemptions
    for p, o in zip(ps, outs, strict=True):
        assert o.outputs[0].token_ids == hf_reference(llama_dir, p, 24)


def test_string_prompts_and_text(llama_dir, hf_reference):
    llm = LLM(llama_dir, max_model_len=128)
    text = "Paged attention stores the cache in blocks."
    out = llm.generate(text, SamplingParams(temperature=0.0, max_tokens=8))[0]
    ids = llm.tokenizer.encode(text, add_special_tokens=False)
    assert out.prompt == text and out.prompt_token_ids == ids
    assert out.outputs[0].token_ids == hf_reference(llama_dir, ids, 8)
    assert out.outputs[0].text == llm.tokenizer.decode(out.outputs[0].token_ids,
                                                       skip_special_tokens=True)
