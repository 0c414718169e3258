"""CUDA graphs: bucket sizes, when graphs are used, and the padded decode path they replay
(run eagerly on the CPU: greedy output must equal the unpadded path)."""

from __future__ import annotations

import logging
import random

import pytest
import torch

from schedlab import LLM, SamplingParams
from schedlab.config import ConfigError, EngineConfig
from schedlab.plugins.attention.sdpa import SDPABackend
from schedlab.plugins.attention.triton import TritonBackend
from schedlab.plugins.executors.cuda_graphs import graph_batch_sizes
from schedlab.plugins.executors.torch_executor import cuda_graphs_enabled


def test_graph_batch_sizes_follow_vllm():
    assert graph_batch_sizes([], 32) == [1, 2, 4, 8, 16, 24, 32]
    assert graph_batch_sizes([20], 256) == [1, 2, 4, 8, 16, 20]
    assert graph_batch_sizes([3, 1, 3, 64], 256) == [1, 3, 64]
    # a bucket beyond max_num_seqs is never used: max_num_seqs itself is captured instead
    assert graph_batch_sizes([1, 512], 100) == [1, 100]
    assert graph_batch_sizes([], 6) == [1, 2, 4, 6]


@pytest.mark.parametrize("bad", [[0], [4, -1], "8", [2.5], [True]])
def test_bad_cuda_graph_sizes_are_refused(bad):
    with pytest.raises(ConfigError, match="cuda_graph_sizes"):
        EngineConfig(model="m", cuda_graph_sizes=bad)


def test_enforce_eager_must_be_a_bool():
    with pytest.raises(ConfigError, match="enforce_eager"):
        EngineConfig(model="m", enforce_eager="yes")


def test_graphs_only_on_cuda_and_only_for_a_backend_that_can(caplog):
    cpu, gpu = torch.device("cpu"), torch.device("cuda")
    cfg = EngineConfig(model="m", attention="sdpa")
    assert not cuda_graphs_enabled(cfg, cpu, TritonBackend)
    assert cuda_graphs_enabled(EngineConfig(model="m", attention="triton"), gpu, TritonBackend)
    assert not cuda_graphs_enabled(EngineConfig(model="m", attention="triton",
                                                enforce_eager=True), gpu, TritonBackend)
    with caplog.at_level(logging.WARNING):
        assert not cuda_graphs_enabled(cfg, gpu, SDPABackend)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "attention=sdpa cannot run inside a CUDA graph" in lines[0]


def _prompts(n: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(2, 400) for _ in range(rng.randint(3, 40))] for _ in range(n)]


def _generate(model_dir: str, emulate: bool, counter: list[int] | None = None,
              **kw) -> list[list[int]]:
    llm = LLM(model_dir, block_size=4, max_model_len=96, num_kv_blocks=160,
              executor_options={"emulate_cuda_graphs": emulate}, **kw)
    runner = llm.engine.executor.graph_runner
    assert (runner is not None) == emulate
    if counter is not None:
        real_run = runner.run

        def counting(input_ids, positions, meta):
            counter.append(meta.num_seqs)
            return real_run(input_ids, positions, meta)

        runner.run = counting
    # uneven output lengths: the decode batch shrinks through every bucket size
    rng = random.Random(1)
    params = [SamplingParams(temperature=0.0, max_tokens=rng.randint(2, 14), ignore_eos=True)
              for _ in range(11)]
    return [o.outputs[0].token_ids for o in llm.generate(_prompts(11), params)]


def test_padded_bucketed_decodes_give_the_eager_output(llama_dir):
    """11 requests, buckets 1, 2, 4, 8: a batch of 9-11 decodes runs eagerly, smaller ones
    are padded (3 -> 4, 5 -> 8, ...) through the graph path's persistent buffers."""
    eager = _generate(llama_dir, emulate=False)
    used: list[int] = []
    padded = _generate(llama_dir, emulate=True, counter=used, cuda_graph_sizes=[1, 2, 4, 8])
    assert padded == eager
    assert used and max(used) <= 8
    assert any(n not in (1, 2, 4, 8) for n in used), "no step was padded"


@pytest.mark.slow  # about a minute in the interpreter; seconds on a GPU
def test_padded_path_with_triton_kernels(llama_dir):
    """The Triton backend (the one graphs capture) through the padded path."""
    if not torch.cuda.is_available():
        try:
            TritonBackend.check_available(torch.device("cpu"))
        except RuntimeError as e:
            pytest.skip(str(e))
    kw = dict(attention="triton", max_num_seqs=5, cuda_graph_sizes=[2, 4])
    used: list[int] = []
    llm_kw = dict(kw, device="cuda" if torch.cuda.is_available() else "cpu")
    eager = _generate(llama_dir, emulate=False, **llm_kw)
    padded = _generate(llama_dir, emulate=True, counter=used, **llm_kw)
    assert padded == eager
    assert 3 in used  # padded to 4


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32"])
def test_captured_graphs_give_the_eager_output(llama_dir, dtype):
    """On a GPU: graphs captured at start and replayed; greedy output equals eager."""
    def run(enforce_eager: bool) -> tuple[list[list[int]], LLM]:
        llm = LLM(llama_dir, attention="triton", device="cuda", dtype=dtype, block_size=16,
                  max_model_len=96, num_kv_blocks=160, enforce_eager=enforce_eager,
                  cuda_graph_sizes=[1, 2, 4, 8])
        rng = random.Random(1)
        params = [SamplingParams(temperature=0.0, max_tokens=rng.randint(2, 14),
                                 ignore_eos=True) for _ in range(11)]
        return [o.outputs[0].token_ids for o in llm.generate(_prompts(11), params)], llm

    eager, llm_e = run(True)
    graphed, llm_g = run(False)
    assert llm_e.engine.executor.graph_runner is None
    runner = llm_g.engine.executor.graph_runner
    assert runner is not None and sorted(runner.graphs) == [1, 2, 4, 8]
    assert graphed == eager
