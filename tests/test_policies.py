"""Chunked prefill, prefix caching and preemption modes keep greedy output equal to
transformers' generate(), token for token, on tiny float32 models."""

from __future__ import annotations

import random

import pytest

from schedlab import LLM, SamplingParams
from schedlab.config import ConfigError, EngineConfig
from schedlab.engine import Engine

MAX_TOKENS = 10
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)


def prompts(seed: int = 0, n: int = 9, lo: int = 3, hi: int = 48) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(2, 400) for _ in range(rng.randint(lo, hi))] for _ in range(n)]


def shared_prefix_prompts(n: int = 10, prefix_len: int = 24) -> list[list[int]]:
    rng = random.Random(1)
    prefix = [rng.randrange(2, 400) for _ in range(prefix_len)]
    return [prefix + [rng.randrange(2, 400) for _ in range(rng.randint(1, 12))] for _ in range(n)]


def assert_parity(llm: LLM, model_dir: str, hf_reference, ps: list[list[int]]) -> None:
    outs = llm.generate(ps, GREEDY)
    for p, o in zip(ps, outs, strict=True):
        assert o.outputs[0].finish_reason in ("length", "stop")
        assert o.outputs[0].token_ids == hf_reference(model_dir, p, MAX_TOKENS)
    llm.engine.check_integrity()
    u = llm.engine.kv.usage()
    assert u.used_blocks == 0 and u.free_blocks + u.cached_blocks == u.num_blocks


@pytest.mark.parametrize("threshold", [0, 6])
def test_chunked_prefill_parity(model_dir, hf_reference, threshold):
    ps = prompts()
    budget = 16
    assert max(map(len, ps)) > budget
    llm = LLM(model_dir, scheduler="chunked_prefill", block_size=4, max_model_len=128,
              max_num_batched_tokens=budget, long_prefill_threshold=threshold, num_kv_blocks=256)
    assert_parity(llm, model_dir, hf_reference, ps)
    stats = llm.engine.step_stats
    assert all(s.num_scheduled_tokens <= budget for s in stats)
    assert any(s.num_prefill_tokens and s.num_decode_tokens for s in stats), "never mixed"
    if threshold:
        assert all(s.num_prefill_tokens <= threshold * s.num_scheduled_seqs for s in stats)


@pytest.mark.parametrize("cache", ["hash_block", "radix"])
@pytest.mark.parametrize("scheduler", ["continuous", "chunked_prefill"])
def test_prefix_cache_parity(model_dir, hf_reference, cache, scheduler):
    ps = shared_prefix_prompts()
    llm = LLM(model_dir, scheduler=scheduler, prefix_cache=cache, block_size=4, max_model_len=64,
              max_num_batched_tokens=64, max_num_seqs=3, num_kv_blocks=64)
    assert_parity(llm, model_dir, hf_reference, ps)
    kv = llm.engine.kv
    assert kv.num_prefix_hit_tokens > 0 and 0 < kv.prefix_hit_rate < 1
    per_request = sum(r.metrics.num_cached_tokens for r in llm.engine.requests.values())
    assert per_request == kv.num_prefix_hit_tokens


@pytest.mark.parametrize("cache", ["hash_block", "radix"])
def test_prefix_cache_repeated_prompt_skips_prefill(llama_dir, hf_reference, cache):
    p = shared_prefix_prompts(n=1, prefix_len=30)[0]
    llm = LLM(llama_dir, prefix_cache=cache, block_size=4, max_model_len=64, num_kv_blocks=64)
    assert_parity(llm, llama_dir, hf_reference, [p])
    before = len(llm.engine.step_stats)
    assert_parity(llm, llama_dir, hf_reference, [p])
    # the second run computes only the tokens past the cached whole blocks
    second = llm.engine.step_stats[before:]
    cached = (len(p) - 1) // 4 * 4
    assert second[0].num_prefill_tokens == len(p) - cached
    assert llm.engine.requests["1"].metrics.num_cached_tokens == cached


@pytest.mark.parametrize("cache", ["none", "hash_block", "radix"])
@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_preemption_parity(model_dir, hf_reference, mode, cache):
    ps = [p[:40] for p in prompts(seed=2)]
    llm = LLM(model_dir, scheduler="continuous", preemption_mode=mode, prefix_cache=cache,
              block_size=4, max_model_len=64, max_num_batched_tokens=64, num_kv_blocks=16,
              max_num_seqs=6)
    assert_parity(llm, model_dir, hf_reference, ps)
    s, kv = llm.engine.scheduler, llm.engine.kv
    assert s.num_preemptions > 0
    cached = sum(r.metrics.num_cached_tokens for r in llm.engine.requests.values())
    assert cached == kv.num_prefix_hit_tokens  # counted once per request, at first admission
    if mode == "swap":
        assert s.num_swaps > 0
        assert llm.engine.kv.num_free_host_blocks() == llm.engine.num_swap_blocks
    else:
        assert s.num_swaps == 0


def test_swap_falls_back_to_recompute_when_host_pool_is_full(llama_dir, hf_reference):
    ps = [p[:40] for p in prompts(seed=2)]
    llm = LLM(llama_dir, preemption_mode="swap", swap_space=1, block_size=4, max_model_len=64,
              max_num_batched_tokens=64, num_kv_blocks=16, max_num_seqs=6)
    assert llm.engine.num_swap_blocks == 0
    assert_parity(llm, llama_dir, hf_reference, ps)
    s = llm.engine.scheduler
    assert s.num_preemptions > 0 and s.num_swaps == 0


def test_static_batches_swap_parity(llama_dir, hf_reference):
    ps = [p[:40] for p in prompts(seed=2)]
    llm = LLM(llama_dir, scheduler="static", preemption_mode="swap", block_size=4,
              max_model_len=64, max_num_batched_tokens=64, num_kv_blocks=16, max_num_seqs=6)
    assert_parity(llm, llama_dir, hf_reference, ps)
    assert llm.engine.scheduler.num_swaps > 0


def test_chunked_prefill_swap_parity(llama_dir, hf_reference):
    ps = [p[:40] for p in prompts(seed=3)]
    llm = LLM(llama_dir, scheduler="chunked_prefill", preemption_mode="swap", prefix_cache="radix",
              block_size=4, max_model_len=64, max_num_batched_tokens=12, num_kv_blocks=14,
              max_num_seqs=6)
    assert_parity(llm, llama_dir, hf_reference, ps)
    assert llm.engine.scheduler.num_swaps > 0


@pytest.mark.parametrize("queue", ["priority", "sjf", "lpm"])
def test_ordering_policies_keep_parity(llama_dir, hf_reference, queue):
    ps = shared_prefix_prompts(n=8)
    llm = LLM(llama_dir, queue=queue, prefix_cache="radix", block_size=4, max_model_len=64,
              max_num_batched_tokens=64, max_num_seqs=2, num_kv_blocks=20)
    assert_parity(llm, llama_dir, hf_reference, ps)


@pytest.mark.parametrize("cache", ["hash_block", "radix"])
def test_prefix_cache_over_contiguous_is_refused(llama_dir, cache):
    with pytest.raises(ConfigError, match=f"prefix_cache='{cache}'.*kv_allocator='contiguous'"):
        Engine(EngineConfig(model=llama_dir, prefix_cache=cache, kv_allocator="contiguous"))


def test_unknown_preemption_mode_names_the_accepted_ones(llama_dir):
    with pytest.raises(ConfigError, match="recompute, swap"):
        EngineConfig(model=llama_dir, preemption_mode="drop")


def test_decodes_go_before_a_partial_prefill_ahead_of_them(llama_dir):
    """A partially prefilled request ahead in `running` must not take the decodes' budget."""
    llm = LLM(llama_dir, scheduler="chunked_prefill", block_size=4, max_model_len=64,
              max_num_batched_tokens=4, num_kv_blocks=64)
    eng = llm.engine
    short = eng.add_request([5], SamplingParams(temperature=0.0, max_tokens=6))
    long = eng.add_request(list(range(2, 32)), SamplingParams(temperature=0.0, max_tokens=2))
    eng.step()  # short: its whole prompt, long: a first chunk of 3
    assert short.num_output_tokens == 1 and 0 < long.num_computed_tokens < long.num_prompt_tokens
    eng.scheduler.running.reverse()  # the partial prefill is now ahead of the decode
    while long.num_computed_tokens < long.num_prompt_tokens:
        n = short.num_output_tokens
        eng.step()
        assert short.num_output_tokens == n + 1 or short.is_finished, "a decode was stalled"
    eng.run_until_done(check=True)
