"""The vLLM-shaped offline API: outputs, metrics, sampling, streaming."""

from __future__ import annotations

import pytest

from schedlab import LLM, SamplingParams


@pytest.fixture(scope="module")
def llm(llama_dir):
    return LLM(llama_dir, max_model_len=128, block_size=8)


def test_outputs_in_order_with_metrics(llm):
    prompts = [[5, 6, 7], list(range(2, 40)), [9] * 10]
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=7, ignore_eos=True))
    assert [o.prompt_token_ids for o in outs] == prompts
    for o in outs:
        c = o.outputs[0]
        assert len(c.token_ids) == 7 and c.finish_reason == "length" and o.finished
        m = o.metrics
        assert m.arrival_time <= m.first_scheduled_time <= m.first_token_time <= m.finished_time
        assert len(m.token_times) == 7 and m.token_times == sorted(m.token_times)
        assert isinstance(c.text, str)


def test_seeded_sampling_is_reproducible_and_batch_independent(llm):
    sp = SamplingParams(temperature=1.0, top_p=0.9, top_k=50, max_tokens=12, seed=1234,
                        ignore_eos=True)
    alone = llm.generate([[5, 6, 7]], sp)[0].outputs[0].token_ids
    batch = llm.generate([[11, 12], [5, 6, 7], list(range(2, 30))], sp)
    assert batch[1].outputs[0].token_ids == alone
    unseeded = SamplingParams(temperature=1.0, max_tokens=12, ignore_eos=True)
    outs = llm.generate([[5, 6, 7]] * 4, unseeded)
    assert len({tuple(o.outputs[0].token_ids) for o in outs}) > 1, "sampling never varies"


def test_top_k_one_is_greedy(llm):
    greedy = llm.generate([[5, 6, 7]], SamplingParams(temperature=0, max_tokens=10))[0]
    top1 = llm.generate([[5, 6, 7]], SamplingParams(temperature=0.8, top_k=1, max_tokens=10))[0]
    assert top1.outputs[0].token_ids == greedy.outputs[0].token_ids


def test_stop_on_eos_and_stop_tokens(llm):
    base = llm.generate([[5, 6, 7]], SamplingParams(temperature=0, max_tokens=10,
                                                    ignore_eos=True))[0].outputs[0].token_ids
    stop_at = base[3]
    out = llm.generate([[5, 6, 7]], SamplingParams(temperature=0, max_tokens=10,
                                                   stop_token_ids=[stop_at]))[0].outputs[0]
    assert out.finish_reason == "stop"
    assert out.token_ids == base[: base.index(stop_at) + 1]


def test_stream_yields_tokens_as_produced(llm):
    prompts = [[5, 6, 7], [8, 9]]
    events = list(llm.stream(prompts, SamplingParams(temperature=0, max_tokens=5,
                                                     ignore_eos=True)))
    final = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=5, ignore_eos=True))
    by_id: dict[str, list[list[int]]] = {}
    for e in events:
        by_id.setdefault(e.request_id, []).append(list(e.outputs[0].token_ids))
    assert len(by_id) == 2
    for seq, fin in zip(by_id.values(), final, strict=True):
        assert [len(s) for s in seq] == [1, 2, 3, 4, 5]  # one event per new token
        assert seq[-1] == fin.outputs[0].token_ids


def test_request_exactly_at_max_model_len_runs(llama_dir):
    llm = LLM(llama_dir, max_model_len=24, block_size=8)
    out = llm.generate([list(range(2, 20))], SamplingParams(temperature=0, max_tokens=6,
                                                            ignore_eos=True))[0]
    assert out.outputs[0].finish_reason == "length" and len(out.outputs[0].token_ids) == 6


def test_request_output_counts_cached_prompt_tokens_at_the_top_level():
    """vLLM's `RequestOutput.num_cached_tokens`: the prompt found in the prefix cache."""
    llm = LLM("llama3_8b", executor="sim", prefix_cache="hash_block", block_size=16)
    prompt = list(range(1, 50))
    first, = llm.generate([prompt], SamplingParams(max_tokens=2))
    second, = llm.generate([prompt], SamplingParams(max_tokens=2))
    assert first.num_cached_tokens == 0
    assert second.num_cached_tokens == 48 == second.metrics.num_cached_tokens


@pytest.mark.parametrize(("queue", "meta"), [
    ("priority", {"priority": [3, 0, 2, 1]}),
    ("sjf", {"expected_output_len": [9, 2, 7, 4]}),
    ("edf", {"deadline_ms": [900.0, 100.0, 700.0, 300.0]}),
])
def test_stream_takes_generates_request_metadata(queue, meta):
    """`stream` orders requests by the same per-prompt metadata as `generate`: one at a
    time, request 1 first, then 3, 2, 0, with the same outputs."""
    llm = LLM("llama3_8b", executor="sim", executor_options={"hardware": "h100"},
              max_num_seqs=1, queue=queue)
    prompts = [[5, 6, 7, 8]] * 4
    sp = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    tagged = {**meta, "client_id": ["a", "b", "a", "b"], "slo_class": ["x", "y", "x", "y"]}
    streamed = {}
    for out in llm.stream(prompts, sp, **tagged):
        if out.finished:
            streamed[out.request_id] = out
    generated = llm.generate(prompts, sp, **tagged)
    ids = [int(rid) for rid in streamed]  # in the order they finished
    assert [i - min(ids) for i in ids] == [1, 3, 2, 0]
    order = sorted(range(4), key=lambda k: generated[k].metrics.finished_time)
    assert order == [1, 3, 2, 0]
    for k, o in enumerate(streamed.values()):
        assert o.outputs[0].token_ids == generated[order[k]].outputs[0].token_ids


@pytest.mark.parametrize(("meta", "says"), [
    ({"deadline_ms": [-5, None]}, "prompt 0: deadline_ms=-5 must be a number of milliseconds "
                                  "> 0 or None"),
    ({"deadline_ms": [None, float("nan")]}, "prompt 1: deadline_ms=nan must be"),
    ({"deadline_ms": ["soon", None]}, "prompt 0: deadline_ms='soon' must be"),
    ({"expected_output_len": [-3, 2]}, "prompt 0: expected_output_len=-3 must be an integer "
                                       ">= 0 or None"),
    ({"priority": [1.5, 0]}, "prompt 0: priority=1.5 must be an integer within"),
    ({"priority": ["high", 0]}, "prompt 0: priority='high' must be an integer within"),
    ({"client_id": [1, None]}, "prompt 0: client_id=1 must be a str or None"),
    ({"slo_class": [None, 3]}, "prompt 1: slo_class=3 must be a str or None"),
])
def test_metadata_the_server_refuses_is_refused_by_generate_before_anything_runs(meta, says):
    """What `serve` answers with a 400 and a trace file names by line: `generate` and
    `stream` raise one sentence naming the prompt and the value, and nothing runs (before, a
    negative deadline ran, and a str priority failed as the built-in queue's TypeError)."""
    llm = LLM("llama3_8b", executor="sim", executor_options={"hardware": "h100"},
              queue="priority" if "priority" in meta else "edf")
    prompts = [[5, 6, 7], [8, 9]]
    with pytest.raises(ValueError, match=says.replace("(", r"\(").replace("+", r"\+")):
        llm.generate(prompts, SamplingParams(max_tokens=2), **meta)
    with pytest.raises(ValueError, match="must be"):
        list(llm.stream(prompts, SamplingParams(max_tokens=2), **meta))
    assert not llm.engine.requests
    with pytest.raises(ValueError, match=r"add_request: priority=True must be an integer"):
        llm.engine.add_request([5, 6], priority=True)
    outs = llm.generate(prompts, SamplingParams(max_tokens=2), priority=[2, 0],
                        deadline_ms=[50.0, None], client_id=["a", None])
    assert [len(o.outputs[0].token_ids) for o in outs] == [2, 2]


def test_a_run_on_an_llms_engine_after_generate_numbers_its_requests_past_the_llms():
    """`run_workload(llm.engine, ...)` after `generate` (the README's way to per-client
    figures) failed with "request_id '0' is already in use": both counted from 0."""
    from schedlab.runs.distributions import WorkloadRequest
    from schedlab.runs.driver import run_workload

    llm = LLM("llama3_8b", executor="sim", executor_options={"hardware": "h100"})
    llm.generate([[5, 6, 7], [8, 9]], SamplingParams(max_tokens=2))
    run = run_workload(llm.engine, [WorkloadRequest([5, 6], 2, client_id="a")] * 3)
    assert [r.request_id for r in run.requests] == ["2", "3", "4"]
    assert all(r.finish_reason == "length" for r in run.requests)
