"""Bad input gets a clear error or a rejected output with a reason; nothing is lost."""

from __future__ import annotations

import pytest

from schedlab import LLM, SamplingParams
from schedlab.config import ConfigError
from schedlab.registry import PluginError


@pytest.fixture(scope="module")
def llm(llama_dir):
    return LLM(llama_dir, max_model_len=64, num_kv_blocks=8, block_size=4)


def test_bad_requests_are_rejected_and_the_rest_complete(llm):
    good = [5, 6, 7, 8]
    prompts = [
        good,
        [],  # empty prompt
        list(range(2, 80)),  # longer than max_model_len
        list(range(2, 30)),  # fits, but with max_tokens=40 exceeds max_model_len
        [5, 99999],  # token outside the vocabulary
        good + [9],
    ]
    params = [SamplingParams(temperature=0, max_tokens=6)] * 3 + [
        SamplingParams(temperature=0, max_tokens=40)
    ] + [SamplingParams(temperature=0, max_tokens=6)] * 2
    outs = llm.generate(prompts, params)
    assert [o.outputs[0].finish_reason for o in outs] == [
        "length", "rejected", "rejected", "rejected", "rejected", "length"]
    assert "empty prompt" in outs[1].reject_reason
    assert "max_model_len=64" in outs[2].reject_reason and "78 tokens" in outs[2].reject_reason
    assert "max_tokens (40)" in outs[3].reject_reason
    assert "vocabulary" in outs[4].reject_reason
    assert all(o.finished for o in outs)
    assert len(outs[0].outputs[0].token_ids) == 6 and len(outs[5].outputs[0].token_ids) == 6
    assert outs[1].outputs[0].token_ids == []


def test_request_larger_than_the_whole_pool(llama_dir):
    # 8 blocks of 4 tokens = 32 slots; 30 prompt + 10 output needs 10 blocks
    llm = LLM(llama_dir, max_model_len=64, num_kv_blocks=8, block_size=4)
    outs = llm.generate([list(range(2, 32)), [3, 4, 5]],
                        SamplingParams(temperature=0, max_tokens=10))
    assert outs[0].outputs[0].finish_reason == "rejected"
    assert "whole pool has 8" in outs[0].reject_reason
    assert outs[1].outputs[0].finish_reason == "length"


def test_contiguous_region_larger_than_the_pool(llama_dir):
    # regions are sized to max_model_len=64 tokens = 16 blocks > 8 in the pool
    llm = LLM(llama_dir, kv_allocator="contiguous", max_model_len=64, num_kv_blocks=8,
              block_size=4)
    out = llm.generate([[3, 4, 5]], SamplingParams(max_tokens=2))[0]
    assert out.outputs[0].finish_reason == "rejected" and "16 KV blocks" in out.reject_reason


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": -3}, "max_tokens"),
        ({"temperature": -1.0}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
    ],
)
def test_bad_sampling_params(kwargs, words):
    with pytest.raises(ValueError, match=words):
        SamplingParams(**kwargs)


@pytest.mark.parametrize("kind", ["scheduler", "kv_allocator", "prefix_cache", "attention",
                                  "queue", "executor"])
def test_unknown_plugin_lists_installed(llama_dir, kind):
    with pytest.raises(PluginError) as e:
        LLM(llama_dir, **{kind: "no_such_plugin"})
    msg = str(e.value)
    assert "no_such_plugin" in msg and "installed:" in msg
    default = {"scheduler": "continuous", "kv_allocator": "paged", "prefix_cache": "none",
               "attention": "sdpa", "queue": "fcfs", "executor": "torch"}[kind]
    assert default in msg


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"block_size": 0}, "block_size=0"),
        ({"block_size": -16}, "block_size=-16"),
        ({"block_size": 12}, "power of two"),
        ({"max_num_seqs": 0}, "max_num_seqs"),
        ({"kv_cache_memory": "lots"}, "kv_cache_memory"),
        ({"preemption_mode": "pray"}, "preemption_mode"),
        ({"dtype": "float8"}, "dtype"),
        ({"device": "tpu"}, "device"),
    ],
)
def test_bad_engine_config(llama_dir, kwargs, words):
    with pytest.raises(ConfigError, match=words):
        LLM(llama_dir, **kwargs)


def test_budget_below_max_model_len_without_chunking(llama_dir):
    msg = "max_num_batched_tokens=32 is smaller than max_model_len=64"
    with pytest.raises(ConfigError, match=msg):
        LLM(llama_dir, max_model_len=64, max_num_batched_tokens=32)


def test_model_dir_that_is_not_a_checkpoint(tmp_path):
    with pytest.raises(FileNotFoundError, match="no config.json"):
        LLM(str(tmp_path))


def test_string_prompt_needs_tokenizer(tmp_path, llama_dir):
    import shutil

    d = tmp_path / "no-tok"
    d.mkdir()
    for f in ("config.json", "model.safetensors", "generation_config.json"):
        if (p := __import__("pathlib").Path(llama_dir) / f).exists():
            shutil.copy(p, d / f)
    llm = LLM(str(d), max_model_len=64)
    with pytest.raises(ValueError, match="tokenizer"):
        llm.generate("hello")
    assert llm.generate([[3, 4]], SamplingParams(max_tokens=2))[0].outputs[0].text is None


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"seed": "a"}, "seed must be an integer"),
        ({"top_k": 1.5}, "top_k must be an integer"),
        ({"stop_token_ids": 5}, "stop_token_ids must be a list"),
        ({"temperature": float("nan")}, "temperature must be a finite number"),
        ({"temperature": None}, "temperature must be a finite number"),
        ({"top_p": "0.9"}, "top_p must be a finite number"),
    ],
)
def test_sampling_params_of_the_wrong_type(kwargs, words):
    with pytest.raises(ValueError, match=words):
        SamplingParams(**kwargs)


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"device": None}, "device=None"),
        ({"seed": "x"}, "seed='x' must be an integer"),
        ({"gpu_memory_utilization": "0.5"}, "gpu_memory_utilization='0.5'"),
        ({"scheduler_options": None}, "scheduler_options=None must be a mapping"),
    ],
)
def test_engine_config_of_the_wrong_type(llama_dir, kwargs, words):
    with pytest.raises(ConfigError, match=words):
        LLM(llama_dir, **kwargs)


def test_prompts_that_are_not_token_ids(llm):
    import numpy as np

    outs = llm.generate([[5, 6], ["a"], [1.5], np.array([5, 6, 7])],
                        SamplingParams(temperature=0, max_tokens=3))
    assert [o.outputs[0].finish_reason for o in outs] == ["length", "rejected", "rejected",
                                                          "length"]
    assert "'a' is not an integer token id" in outs[1].reject_reason
    with pytest.raises(TypeError, match="sampling_params must be a SamplingParams"):
        llm.generate([[5]], {"max_tokens": 3})


def test_an_error_mid_run_leaves_the_llm_usable(llama_dir, monkeypatch):
    llm = LLM(llama_dir, max_model_len=64, block_size=4)
    executor = llm.engine.executor
    real = executor.execute

    def broken(plan):
        raise RuntimeError("device lost")

    monkeypatch.setattr(executor, "execute", broken)
    with pytest.raises(RuntimeError, match="device lost"):
        llm.generate([[5, 6, 7], [8, 9]], SamplingParams(max_tokens=4))
    monkeypatch.setattr(executor, "execute", real)
    assert not llm.engine.has_unfinished(), "the failed call's requests were left queued"
    out = llm.generate([[5, 6]], SamplingParams(temperature=0, max_tokens=3))[0]
    assert out.outputs[0].finish_reason == "length" and len(out.outputs[0].token_ids) == 3
    u = llm.engine.kv.usage()
    assert u.free_blocks == u.num_blocks


def test_in_range_ids_skip_the_checks_only_within_the_vocabulary():
    """A workload's own draw (`InRangeIds`) is taken as it is where its bound is within the
    vocabulary, as the general path would read it; any other prompt gets every check."""
    from schedlab.intake import InRangeIds, read_prompt

    ids = [2, 9, 511]
    fast, slow = read_prompt(InRangeIds(ids, 512), 512), read_prompt(list(ids), 512)
    assert fast == slow and fast.reason is None and type(slow.ids) is list
    # a bound past the vocabulary, an empty one, a user's list: the general path
    assert "outside the vocabulary" in read_prompt(InRangeIds(ids, 1000), 100).reason
    assert read_prompt(InRangeIds([], 512), 512).reason.startswith("empty prompt")
    assert "outside the vocabulary" in read_prompt([2, 600], 512).reason


@pytest.mark.parametrize("change", [
    lambda z: z.append(99999), lambda z: z.extend([99999]), lambda z: z.insert(0, -1),
    lambda z: z.__setitem__(0, 99999), lambda z: z.__setitem__(slice(0, 1), [2.5]),
    lambda z: z.__iadd__([99999])])
def test_a_changed_in_range_list_is_checked_again(change):
    """An `InRangeIds` changed in place after its maker vouched for it (a user appending a bad
    id to a workload prompt) is no longer trusted: the bad id is refused as in a plain list."""
    from schedlab.intake import InRangeIds, read_prompt

    z = InRangeIds([2, 3, 4], 512)
    change(z)
    reason = read_prompt(z, 512).reason
    assert reason is not None and ("outside the vocabulary" in reason
                                   or "not an integer token id" in reason)
