"""Driving an engine with a workload: offline and online, queueing in TTFT, results and plots."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fakes import FakeExecutor

from schedlab.config import EngineConfig
from schedlab.engine import Engine
from schedlab.request import RequestStatus
from schedlab.runs.distributions import WorkloadRequest
from schedlab.runs.driver import run_workload
from schedlab.runs.metrics import compute_metrics
from schedlab.runs.plots import write_plots
from schedlab.runs.results import collect_environment, format_table, write_results
from schedlab.runs.workload import build_workload


def real_engine(model_dir: str, **kw) -> Engine:
    opts = dict(max_num_seqs=4, max_model_len=128, num_kv_blocks=64, block_size=16)
    opts.update(kw)
    return Engine(EngineConfig(model=model_dir, **opts))


def fake_engine(monkeypatch, **kw) -> Engine:
    """An engine over a model-free executor on a virtual clock (1 ms per step)."""
    return Engine(EngineConfig(model="fake", **kw), executor_cls=FakeExecutor)


def wl(n: int, prompt: int = 8, out: int = 4, arrivals: list[float] | None = None):
    arrivals = arrivals or [0.0] * n
    return [WorkloadRequest(list(range(2, 2 + prompt)), out, arrival_s=a) for a in arrivals]


def test_a_bad_max_tokens_is_refused_before_anything_runs(monkeypatch):
    """The sampling parameters are made at each release, but checked before the first step:
    a bad request late in a workload does not cost the run that comes before it."""
    eng = fake_engine(monkeypatch)
    work = wl(3) + [WorkloadRequest(list(range(2, 10)), 0, arrival_s=5.0)]
    with pytest.raises(ValueError, match="max_tokens must be a positive integer, got 0"):
        run_workload(eng, work)
    assert eng.counters().num_steps == 0

def test_a_run_after_the_step_records_were_drained_keeps_its_own_steps(monkeypatch):
    # a server drains the records it has read; the step count goes on
    eng = fake_engine(monkeypatch)
    first = run_workload(eng, wl(3, out=4))
    eng.drain_step_stats()
    second = run_workload(eng, wl(3, out=4))
    assert len(second.step_stats) == len(first.step_stats) > 0
    assert eng.counters().num_steps == 2 * len(first.step_stats)


# ---- exact timelines on the virtual clock ----------------------------------------------
def test_virtual_clock_online_ttft_counts_the_wait(monkeypatch):
    eng = fake_engine(monkeypatch, max_num_seqs=1)
    # b arrives while a runs and waits for its seat; c arrives after a long idle gap
    run = run_workload(eng, wl(3, out=3, arrivals=[0.0, 0.0015, 1.0]))
    a, b, c = run.requests
    assert [r.status for r in run.requests] == [RequestStatus.FINISHED_LENGTH] * 3
    assert a.metrics.token_times == pytest.approx([0.001, 0.002, 0.003])
    assert b.metrics.arrival_time == pytest.approx(0.0015)
    assert b.metrics.first_token_time == pytest.approx(0.004)
    assert c.metrics.token_times == pytest.approx([1.001, 1.002, 1.003])
    m = compute_metrics(run)
    assert m["ttfts"] == pytest.approx([0.001, 0.0025, 0.001])
    assert m["mean_queue_ms"] == pytest.approx(1.5 / 3)
    assert run.duration_s == pytest.approx(1.003)


def test_max_concurrency_caps_requests_in_flight(monkeypatch):
    eng = fake_engine(monkeypatch, max_num_seqs=8)
    run = run_workload(eng, wl(6, out=3), max_concurrency=2)
    assert max(s.num_running + s.num_waiting for s in run.step_stats) <= 2
    m = compute_metrics(run)
    assert m["completed"] == 6 and m["max_concurrency"] == 2
    # a held-back request's clock starts when a seat frees, as with vLLM bench
    assert max(m["ttfts"]) == pytest.approx(0.001)


def test_unrunnable_request_is_rejected_and_the_rest_complete(monkeypatch):
    eng = fake_engine(monkeypatch, max_num_seqs=4, max_model_len=64)
    work = wl(3) + [WorkloadRequest(list(range(2, 102)), 4)]
    run = run_workload(eng, work)
    assert run.requests[3].status is RequestStatus.REJECTED
    assert "max_model_len" in run.requests[3].reject_reason
    m = compute_metrics(run)
    assert (m["completed"], m["num_rejected"]) == (3, 1)


# ---- the real tiny model on the wall clock ---------------------------------------------
def test_a_detailed_runs_ended_requests_read_as_their_workload_prompts(monkeypatch):
    """A synthetic workload's prompts are drawn when read: a request that ended (finished or
    rejected on arrival) refers to its workload's prompt, so a detailed run keeps no list of
    its own per request, and it reads as the ids the request ran."""
    spec = {"type": "synthetic", "num_requests": 30, "output_len": 4,
            "input_len": {"dist": "uniform", "min": 4, "max": 60},
            "arrival": {"process": "poisson", "rate": 200.0}}
    work = build_workload(spec, 512, seed=2)
    ids = [list(w.prompt_token_ids) for w in work]
    run = run_workload(fake_engine(monkeypatch, max_model_len=48), work)
    statuses = {r.status for r in run.requests}
    assert statuses == {RequestStatus.FINISHED_LENGTH, RequestStatus.REJECTED}
    for w, r, expect in zip(work, run.requests, ids, strict=True):
        assert r.prompt_token_ids is w.prompt_token_ids
        assert r.prompt_token_ids == expect and r.num_prompt_tokens == len(expect)
        assert r.all_token_ids == expect + r.output_token_ids
    done = [len(p) for p, r in zip(ids, run.requests, strict=True)
            if r.status is RequestStatus.FINISHED_LENGTH]
    assert compute_metrics(run)["total_input_tokens"] == sum(done)


def test_offline_run_on_real_model(llama_dir):
    eng = real_engine(llama_dir, max_num_seqs=2)
    spec = {"type": "synthetic", "num_requests": 5, "input_len": {"dist": "uniform", "min": 8,
            "max": 24}, "output_len": 6}
    work = build_workload(spec, eng.model_spec.vocab_size, seed=0)
    run = run_workload(eng, work)
    assert all(r.status is RequestStatus.FINISHED_LENGTH for r in run.requests)
    assert [r.num_output_tokens for r in run.requests] == [6] * 5
    assert [r.prompt_token_ids for r in run.requests] == [w.prompt_token_ids for w in work]
    m = compute_metrics(run)
    # two seats for five requests arriving together: a later request's TTFT includes waiting
    # for an earlier one to finish
    assert m["ttfts"][4] >= m["e2els"][0]
    assert m["mean_queue_ms"] > 0
    assert run.step_stats and run.duration_s > 0


def test_online_poisson_run_writes_results_and_plots(llama_dir, tmp_path):
    eng = real_engine(llama_dir)
    spec = {"type": "synthetic", "num_requests": 6, "input_len": 12, "output_len": 4,
            "arrival": {"process": "poisson", "rate": 200.0}}
    work = build_workload(spec, eng.model_spec.vocab_size, seed=1)
    run = run_workload(eng, work, progress=True)
    assert all(r.is_finished and r.num_output_tokens == 4 for r in run.requests)
    for r, w in zip(run.requests, work, strict=True):
        assert r.metrics.arrival_time - run.start_time == pytest.approx(w.arrival_s)
        assert r.metrics.first_scheduled_time >= r.metrics.arrival_time
    m = compute_metrics(run, slo={"ttft": 60_000})
    path = write_results(tmp_path, m, {"scheduler": {"name": "continuous"}},
                         collect_environment())
    doc = json.loads(path.read_text())
    for key in ("completed", "duration", "request_throughput", "output_throughput",
                "total_token_throughput", "mean_ttft_ms", "median_tpot_ms", "p99_itl_ms",
                "std_e2el_ms", "ttfts", "itls", "input_lens", "output_lens"):
        assert key in doc, key
    assert doc["completed"] == 6 and doc["request_goodput"] > 0
    assert doc["config"]["scheduler"]["name"] == "continuous"
    assert doc["environment"]["torch"] and doc["environment"]["python"]
    pngs = write_plots(tmp_path, run, m)
    assert len(pngs) == 2
    for p in pngs:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = format_table(m)
    assert "Successful requests:" in table and "Mean TPOT (ms):" in table


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_preemptions_and_swaps_are_counted(monkeypatch, mode):
    eng = fake_engine(monkeypatch, block_size=4, max_model_len=64, num_kv_blocks=12,
                      max_num_seqs=8, preemption_mode=mode, swap_space=1 << 20)
    run = run_workload(eng, wl(8, prompt=10, out=12))
    m = compute_metrics(run)
    assert m["completed"] == 8
    assert m["num_preemptions"] == run.num_preemptions > 0
    if mode == "swap":
        assert 0 < m["num_swaps"] <= m["num_preemptions"]
    else:
        assert m["num_swaps"] == 0


def test_results_json_writes_numpy_scalars_paths_and_non_finite_floats_as_json(tmp_path):
    import numpy as np

    from schedlab.runs.results import load_results

    metrics = {"mean_ttft_ms": np.float64(1.5), "completed": np.int64(3), "std": float("nan"),
               "ttfts": [0.25, float("inf"), np.int32(2)], "itls": [[0.5, 0.25], []],
               "cluster": {"instances": [{"index": 0, "busy": float("-inf")}]},
               "where": Path("/tmp/x")}
    path = write_results(tmp_path, metrics, {"seed": 0})
    got, config, _ = load_results(path)
    assert got == {"mean_ttft_ms": 1.5, "completed": 3, "std": None, "ttfts": [0.25, None, 2],
                   "itls": [[0.5, 0.25], []], "cluster": {"instances": [{"index": 0,
                                                                        "busy": None}]},
                   "where": "/tmp/x"}
    assert config == {"seed": 0}


@pytest.mark.parametrize("fast", [True, False], ids=["orjson", "json"])
def test_results_json_lists_read_back_as_the_same_values_with_or_without_orjson(
        tmp_path, monkeypatch, fast):
    """The per-request lists (millions of numbers in a long run, encoded by orjson where it
    is installed) read back as the floats written, to the last bit, across chunk bounds;
    non-finite ones as null, numpy scalars as numbers, non-ASCII text as itself; the same
    document whichever encoder wrote it."""
    import json
    import random

    import numpy as np

    from schedlab.runs import results
    from schedlab.runs.results import load_results

    if fast:
        pytest.importorskip("orjson")
    else:
        monkeypatch.setattr(results, "_orjson", None)
    monkeypatch.setattr(results, "_CHUNK", 7)
    rnd = random.Random(2)
    floats = [rnd.random() * 10.0 ** rnd.randint(-9, 18) for _ in range(50)] + [
        0.0, -0.0, 1e-5, 1e-7, 1.5e17, 5e-324, 1.7976931348623157e308]
    itls = [[rnd.random() / 50 for _ in range(rnd.randint(0, 9))] for _ in range(30)]
    metrics = {"ttfts": floats, "itls": itls, "tpots": [None, 0.5, float("nan")] * 5,
               "input_lens": list(range(20)) + [np.int64(7)], "errors": ["caf\u00e9", "x"] * 4}
    path = write_results(tmp_path, metrics, {"seed": 0})
    got, _, _ = load_results(path)
    assert got["ttfts"] == floats and got["itls"] == itls
    assert [repr(x) for x in got["ttfts"]] == [repr(x) for x in floats]  # -0.0 too
    assert got["tpots"] == [None, 0.5, None] * 5
    assert got["input_lens"] == list(range(20)) + [7]
    assert got["errors"] == ["caf\u00e9", "x"] * 4
    assert path.read_text(encoding="ascii")  # plain ASCII whichever encoder ran
    assert json.loads(path.read_text())["itls"] == itls


def test_a_run_collects_less_often_and_leaves_the_collector_as_it_found_it(monkeypatch):
    """Inside a run the cyclic collector's young threshold is raised (a run's objects die
    young); afterwards, after an error too, the caller's thresholds are back, and a
    collector switched off (threshold 0) stays off."""
    import gc

    from schedlab.runs.driver import GC_YOUNG_THRESHOLD

    eng = fake_engine(monkeypatch)
    seen = []
    step = eng.step

    def watched_step():
        seen.append(gc.get_threshold()[0])
        return step()

    monkeypatch.setattr(eng, "step", watched_step)
    old = gc.get_threshold()
    try:
        gc.set_threshold(700, 10, 10)
        run_workload(eng, wl(2))
        assert set(seen) == {GC_YOUNG_THRESHOLD} and gc.get_threshold() == (700, 10, 10)
        gc.set_threshold(0)
        seen.clear()
        run_workload(eng, wl(2))
        assert set(seen) == {0} and gc.get_threshold()[0] == 0
        gc.set_threshold(700, 10, 10)

        def failing_step():
            raise RuntimeError("boom")

        monkeypatch.setattr(eng, "step", failing_step)
        with pytest.raises(RuntimeError, match="boom"):
            run_workload(eng, wl(1))
        assert gc.get_threshold() == (700, 10, 10)
    finally:
        gc.set_threshold(*old)


def test_overlapping_runs_leave_the_collector_as_it_was():
    """Two runs whose collector blocks overlap (threads of one process: A enters, B enters, A
    leaves, B leaves) put the caller's thresholds back at the end, not the raised ones."""
    import gc
    import threading

    from schedlab.runs.driver import GC_YOUNG_THRESHOLD, fewer_collections

    old = gc.get_threshold()
    a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()
    during_b: list[int] = []

    def run_a():
        with fewer_collections():
            a_in.set()
            b_in.wait(5)
        a_out.set()

    def run_b():
        a_in.wait(5)
        with fewer_collections():
            b_in.set()
            a_out.wait(5)
            during_b.append(gc.get_threshold()[0])  # after A left: B's run still collects less

    try:
        gc.set_threshold(700, 10, 10)
        threads = [threading.Thread(target=run_a), threading.Thread(target=run_b)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        assert during_b == [GC_YOUNG_THRESHOLD] and gc.get_threshold() == (700, 10, 10)
    finally:
        gc.set_threshold(*old)


def test_a_run_freezes_what_collections_leave_alive_and_thaws_it_after():
    """Inside a run loop's block what a collection found alive is frozen (no later
    collection walks it again); a cycle that dies young is still collected; after the block
    nothing of the run's is frozen and the collector is as it was; objects a caller froze
    before stay frozen, and nothing more is."""
    import gc
    import weakref

    from schedlab.runs.driver import frozen_survivors

    class Node:
        pass

    gc.unfreeze()  # NOTE: whatever this test process froze before: the run's freeze is seen
    callbacks = list(gc.callbacks)
    with frozen_survivors():
        kept = [Node() for _ in range(1000)]
        gc.collect()
        assert gc.get_freeze_count() >= len(kept)  # frozen: not walked again
        a, b = Node(), Node()
        a.other, b.other = b, a  # a cycle, dead at once
        dead = weakref.ref(a)
        del a, b
        gc.collect()
        assert dead() is None  # young cycles are collected as before
    assert gc.get_freeze_count() == 0 and gc.callbacks == callbacks
    del kept

    gc.freeze()  # a caller's own (e.g. before forking workers)
    try:
        frozen = gc.get_freeze_count()
        with frozen_survivors():
            more = [Node() for _ in range(1000)]
            gc.collect()
            # nothing more (a frozen object that dies leaves the count)
            assert gc.get_freeze_count() <= frozen
        assert 0 < gc.get_freeze_count() <= frozen and more
    finally:
        gc.unfreeze()


def test_sampling_params_with_max_tokens_equal_the_constructors_own():
    """`with_max_tokens` (a workload's per-request params, copied from the first request's)
    gives what the constructor gives, lists and dicts of its own, and its errors."""
    import dataclasses

    from schedlab.cluster.loop import WorkloadParams
    from schedlab.request import SamplingParams

    fields = {"temperature": 0.7, "top_p": 0.9, "top_k": 5, "max_tokens": 3, "seed": 11,
              "ignore_eos": True, "stop_token_ids": [4, 5], "min_tokens": 2,
              "presence_penalty": 0.5, "frequency_penalty": -0.5, "repetition_penalty": 1.2,
              "logit_bias": {3: 200.0}}
    assert set(fields) == {f.name for f in dataclasses.fields(SamplingParams)}
    base = SamplingParams(**fields)
    for n in (2, 7, 1 << 40):
        got = base.with_max_tokens(n)
        assert type(got) is SamplingParams and got == SamplingParams(**{**fields, "max_tokens": n})
        assert got.stop_token_ids is not base.stop_token_ids
        assert got.logit_bias is not base.logit_bias
    for bad in (0, 1, -3, 2.0, True, "4", None):
        with pytest.raises(ValueError) as got_error:
            base.with_max_tokens(bad)
        with pytest.raises(ValueError) as want:
            SamplingParams(**{**fields, "max_tokens": bad})
        assert str(got_error.value) == str(want.value)
    params = WorkloadParams([WorkloadRequest([5], k) for k in (4, 1, 9)], 0, True)
    assert [p.max_tokens for p in params] == [4, 1, 9]
    assert params[0] == SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    assert params[2] is not params[2] and len({id(p) for p in params[:]}) == 3
