"""CUDA graphs: bucket sizes, when graphs are used, and the padded decode path they replay
(run eagerly on the CPU with the metadata a capture records: greedy output must equal the
unpadded path)."""

from __future__ import annotations

import logging
import random

import pytest
import torch

from schedlab import LLM, SamplingParams
from schedlab.attention import AttentionBackend
from schedlab.config import ConfigError, EngineConfig
from schedlab.plugins.attention.sdpa import SDPABackend
from schedlab.plugins.attention.triton import TritonBackend
from schedlab.plugins.executors.cuda_graphs import graph_batch_sizes, graph_context_lens
from schedlab.plugins.executors.torch_executor import cuda_graphs_enabled


def test_graph_batch_sizes_follow_vllm():
    assert graph_batch_sizes([], 32) == [1, 2, 4, 8, 16, 24, 32]
    assert graph_batch_sizes([20], 256) == [1, 2, 4, 8, 16, 20]
    assert graph_batch_sizes([3, 1, 3, 64], 256) == [1, 3, 64]
    # a bucket beyond max_num_seqs is never used: max_num_seqs itself is captured instead
    assert graph_batch_sizes([1, 512], 100) == [1, 100]
    assert graph_batch_sizes([], 6) == [1, 2, 4, 6]


def test_graph_context_lens_are_few_and_geometric():
    # ratio sqrt(2): 1024 / 2**(k/2) = 1024, 724, 512, 362, 256, 181 up to whole blocks
    assert graph_context_lens(1024, 16) == [192, 256, 368, 512, 736, 1024]
    # the top one is max_model_len itself; duplicates after rounding are dropped
    assert graph_context_lens(1000, 16) == [192, 256, 368, 512, 720, 1000]
    assert graph_context_lens(96, 4) == [20, 24, 36, 48, 68, 96]
    assert graph_context_lens(64, 16) == [16, 32, 48, 64]
    assert graph_context_lens(10, 16) == [10]
    # what the GPU run captures for sdpa: 35 batch sizes x 6 context lengths
    assert len(graph_batch_sizes([], 256)) * len(graph_context_lens(1024, 16)) == 210


@pytest.mark.parametrize("bad", [[0], [4, -1], "8", [2.5], [True]])
def test_bad_cuda_graph_sizes_are_refused(bad):
    with pytest.raises(ConfigError, match="cuda_graph_sizes"):
        EngineConfig(model="m", cuda_graph_sizes=bad)


def test_enforce_eager_must_be_a_bool():
    with pytest.raises(ConfigError, match="enforce_eager"):
        EngineConfig(model="m", enforce_eager="yes")


class _EagerOnly(AttentionBackend):
    def forward(self, layer_idx, query, key, value, meta, scale):
        raise NotImplementedError


def test_graphs_only_on_cuda_and_only_for_a_backend_that_can(caplog):
    cpu, gpu = torch.device("cpu"), torch.device("cuda")
    assert not cuda_graphs_enabled(EngineConfig(model="m", attention="triton"), cpu,
                                   TritonBackend)
    for name, cls in (("triton", TritonBackend), ("sdpa", SDPABackend)):
        assert cuda_graphs_enabled(EngineConfig(model="m", attention=name), gpu, cls)
        assert not cuda_graphs_enabled(EngineConfig(model="m", attention=name,
                                                    enforce_eager=True), gpu, cls)
    cfg = EngineConfig(model="m", attention="mine")
    with caplog.at_level(logging.WARNING):
        assert not cuda_graphs_enabled(cfg, gpu, _EagerOnly)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "attention=mine cannot run inside a CUDA graph" in lines[0]


def _prompts(n: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(2, 400) for _ in range(rng.randint(3, 40))] for _ in range(n)]


PROMPT_LENS = [80, 60, 44, 30, 22, 16, 11, 8, 5, 4, 3]
OUTPUT_LENS = [3, 4, 5, 6, 7, 8, 10, 12, 14, 15, 16]


def _generate(model_dir: str, emulate: bool, steps: list[tuple] | None = None,
              **kw) -> list[list[int]]:
    """Greedy outputs of 11 requests; with `steps`, each decode-only step is logged as
    ("graph", num_seqs, longest context, the metadata layer 0 of its forward saw) or
    ("eager", num_seqs, longest context, None)."""
    llm = LLM(model_dir, block_size=4, max_model_len=96, num_kv_blocks=160,
              executor_options={"emulate_cuda_graphs": emulate}, **kw)
    runner = llm.engine.executor.graph_runner
    assert (runner is not None) == emulate
    if steps is not None:
        real_run, real_fits, real_attend = runner.run, runner.fits, runner.backend.forward
        seen = []

        def run(input_ids, positions, meta):
            seen.clear()
            out = real_run(input_ids, positions, meta)
            steps.append(("graph", meta.num_seqs, meta.max_seq_len, seen[0]))
            return out

        def fits(meta):
            ok = real_fits(meta)
            if not ok and meta.num_decodes == meta.num_seqs:
                steps.append(("eager", meta.num_seqs, meta.max_seq_len, None))
            return ok

        def attend(layer_idx, query, key, value, meta, scale):
            if layer_idx == 0:
                seen.append(meta)
            return real_attend(layer_idx, query, key, value, meta, scale)

        runner.run, runner.fits, runner.backend.forward = run, fits, attend
    # the longest prompts stop first: the decode batch shrinks through every bucket size
    # while its longest context falls through several context buckets
    rng = random.Random(1)
    prompts = [[rng.randrange(2, 400) for _ in range(n)] for n in PROMPT_LENS]
    params = [SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True)
              for m in OUTPUT_LENS]
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params)]


def test_padded_bucketed_decodes_give_the_eager_output(llama_dir):
    """11 requests, buckets 1, 2, 4, 8: a batch of 9-11 decodes runs eagerly, smaller ones
    are padded (3 -> 4, 5 -> 8, ...) and, sdpa needing them, given a context bucket (20, 24,
    36, 48, 68, 96 tokens) apart from their batch bucket; each forward sees the metadata a
    capture records."""
    eager = _generate(llama_dir, emulate=False)
    steps: list[tuple] = []
    padded = _generate(llama_dir, emulate=True, steps=steps, cuda_graph_sizes=[1, 2, 4, 8])
    assert padded == eager
    graph = [(n, ctx, meta) for kind, n, ctx, meta in steps if kind == "graph"]
    assert any(n > 8 for kind, n, _, _ in steps if kind == "eager"), "no batch beyond buckets"
    assert any(n not in (1, 2, 4, 8) for n, _, _ in graph), "no step was padded"
    sizes, lens = [1, 2, 4, 8], [20, 24, 36, 48, 68, 96]
    pairs = set()
    for n, ctx, meta in graph:
        size = min(b for b in sizes if b >= n)
        context = min(c for c in lens if c >= ctx)
        pairs.add((size, context))
        # exactly what a capture of bucket (size, context) records
        assert meta.graph_capture and meta.num_seqs == meta.num_decodes == size
        assert meta.seq_lens_host == [context] * size and meta.max_seq_len == context
        assert meta.block_tables.shape == (size, context // 4)
    # batch and context buckets vary apart: one batch size over several context lengths,
    # one context length over several batch sizes
    assert max(sum(s == b for s, _ in pairs) for b in sizes) >= 2, pairs
    assert max(sum(c == x for _, c in pairs) for x in lens) >= 2, pairs


@pytest.mark.slow  # about a minute in the interpreter; seconds on a GPU
def test_padded_path_with_triton_kernels(llama_dir):
    """The Triton backend (the one graphs capture) through the padded path."""
    if not torch.cuda.is_available():
        try:
            TritonBackend.check_available(torch.device("cpu"))
        except RuntimeError as e:
            pytest.skip(str(e))
    kw = dict(attention="triton", max_num_seqs=5, cuda_graph_sizes=[2, 4])
    steps: list[tuple] = []
    llm_kw = dict(kw, device="cuda" if torch.cuda.is_available() else "cpu")
    eager = _generate(llama_dir, emulate=False, **llm_kw)
    padded = _generate(llama_dir, emulate=True, steps=steps, **llm_kw)
    assert padded == eager
    graph = [(n, meta) for kind, n, _, meta in steps if kind == "graph"]
    assert any(n == 3 for n, _ in graph)  # padded to 4
    # one context bucket (triton reads each context's length): host copies max_model_len
    assert all(m.graph_capture and m.seq_lens_host == [96] * m.num_seqs for _, m in graph)


@pytest.mark.gpu
@pytest.mark.parametrize("attention", ["triton", "sdpa"])
def test_captured_graphs_give_the_eager_output(llama_dir, attention):
    """On a GPU: graphs captured at start and replayed; greedy output equals eager (fp32)."""
    def run(enforce_eager: bool) -> tuple[list[list[int]], LLM]:
        llm = LLM(llama_dir, attention=attention, device="cuda", dtype="float32",
                  block_size=16, max_model_len=96, num_kv_blocks=160,
                  enforce_eager=enforce_eager, cuda_graph_sizes=[1, 2, 4, 8])
        rng = random.Random(1)
        params = [SamplingParams(temperature=0.0, max_tokens=rng.randint(2, 14),
                                 ignore_eos=True) for _ in range(11)]
        return [o.outputs[0].token_ids for o in llm.generate(_prompts(11), params)], llm

    eager, llm_e = run(True)
    graphed, llm_g = run(False)
    assert llm_e.engine.executor.graph_runner is None
    runner = llm_g.engine.executor.graph_runner
    contexts = [32, 48, 80, 96] if attention == "sdpa" else [96]
    assert runner is not None and runner.capture
    assert sorted(runner.graphs) == [(b, c) for b in (1, 2, 4, 8) for c in contexts]
    assert graphed == eager


def test_a_decode_step_with_a_one_token_chunk_that_does_not_sample_runs_eagerly(llama_dir):
    """Three decodes at position 3 and a 1-token chunk at position 30 of a 40-token prompt
    (chunked prefill): one token each, and the chunk, whose context is the longest, comes
    first in the batch but does not sample. A graph returns a row of logits per sequence, so
    such a step runs eagerly, and each request gets the eager run's token (they had gone to
    the wrong requests)."""
    from schedlab.config import EngineConfig
    from schedlab.plan import ScheduledRequest, SchedulerOutput
    from schedlab.plugins.executors.torch_executor import TorchExecutor
    from schedlab.request import Request

    def sampled(emulate: bool) -> list[list[int | None]]:
        kw = dict(cuda_graph_sizes=[1, 2, 4, 8]) if emulate else {}
        ex = TorchExecutor(EngineConfig(model=llama_dir, device="cpu", max_model_len=64, **kw),
                           emulate_cuda_graphs=emulate)
        ex.initialize_cache(64, 16)
        assert (ex.graph_runner is not None) == emulate
        sp = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
        short = [Request(f"s{i}", [5 + i, 9, 11], sp) for i in range(3)]
        long = Request("L", list(range(3, 43)), sp)
        tables = {"s0": [1], "s1": [2], "s2": [3], "L": [4, 5, 6]}
        first = ex.execute(SchedulerOutput(
            [ScheduledRequest(r, 3, 0, tables[r.request_id]) for r in short]
            + [ScheduledRequest(long, 30, 0, tables["L"])])).sampled_token_ids
        for r, t in zip(short, first, strict=False):
            r.output_token_ids.append(t)
        second = ex.execute(SchedulerOutput(
            [ScheduledRequest(r, 1, 3, tables[r.request_id]) for r in short]
            + [ScheduledRequest(long, 1, 30, tables["L"])])).sampled_token_ids
        return [first, second]

    eager = sampled(emulate=False)
    assert eager[1][3] is None and None not in eager[1][:3]
    assert sampled(emulate=True) == eager
