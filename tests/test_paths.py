"""A number must not depend on the path that produced it: one engine, a 2-replica cluster, a
1P+1D cluster, `LLM.generate`, and `serve` + `bench serve` (all on the simulated executor, so
the paths can be compared exactly) give the same counts, prompt tokens and arrival rules for
every workload kind; a path planted to drop sessions fails the same checks."""

from __future__ import annotations

from pathlib import Path

import pytest

from schedlab.cluster import Cluster, ClusterConfig
from schedlab.config import EngineConfig
from schedlab.engine import Engine
from schedlab.faults import PluginContractError
from schedlab.request import RequestStatus
from schedlab.runs.driver import run_workload
from schedlab.runs.metrics import compute_metrics
from schedlab.runs.request_stats import RequestStats
from schedlab.runs.sessions import next_turns
from schedlab.runs.workload import build_workload

DATA = Path(__file__).parent / "data"
CLIENTS = [{"id": "heavy", "weight": 3.0}, {"id": "light", "weight": 1.0}]
SLO_CLASSES = [{"name": "chat", "deadline_ms": 300.0, "weight": 1.0, "priority": 0},
               {"name": "batch", "deadline_ms": 5000.0, "weight": 1.0, "priority": 1}]
POISSON = {"process": "poisson", "rate": 30.0}
SHORT = {"dist": "uniform", "min": 16, "max": 64}
OUT = {"dist": "uniform", "min": 2, "max": 12}

#: every workload kind the README lists (and the metadata any of them may carry)
WORKLOADS = {
    "synthetic": {"type": "synthetic", "num_requests": 16, "input_len": SHORT,
                  "output_len": OUT, "arrival": POISSON},
    "shared_prefix": {"type": "shared_prefix", "num_requests": 16, "num_groups": 2,
                      "prefix_len": 64, "input_len": 16, "output_len": OUT},
    "sessions": {"type": "sessions", "num_sessions": 4, "turns": 3, "input_len": 24,
                 "output_len": 6, "think_time_s": 0.02, "arrival": POISSON},
    "sharegpt": {"type": "trace", "format": "sharegpt", "path": str(DATA / "sharegpt_sample.json")},
    "sharegpt_sessions": {"type": "trace", "format": "sharegpt", "sessions": True,
                          "path": str(DATA / "sharegpt_sample.json")},
    "azure": {"type": "trace", "format": "azure", "path": str(DATA / "azure_sample.csv")},
    "burstgpt": {"type": "trace", "format": "burstgpt", "path": str(DATA / "burstgpt_sample.csv")},
    "jsonl": {"type": "trace", "format": "jsonl", "path": str(DATA / "requests_sample.jsonl")},
    "clients_by_rate": {"type": "synthetic", "num_requests": 16, "input_len": SHORT,
                        "output_len": OUT, "arrival": POISSON,
                        "clients": [{"id": "heavy", "rate": 40.0},
                                    {"id": "light", "rate": 8.0, "output_len": 4}]},
    "clients_slo_priorities": {"type": "synthetic", "num_requests": 16, "input_len": SHORT,
                               "output_len": OUT, "arrival": POISSON, "clients": CLIENTS,
                               "slo_classes": SLO_CLASSES, "priority_levels": 3},
    "sessions_with_clients": {"type": "sessions", "num_sessions": 4, "turns": 2,
                              "input_len": 16, "output_len": 4, "think_time_s": 0.01,
                              "clients": CLIENTS},
}


def sim(**kw) -> EngineConfig:
    return EngineConfig(model="llama3_8b", executor="sim", executor_options={"hardware": "h100"},
                        **{"prefix_cache": "hash_block", "num_kv_blocks": 512, **kw})


def workload(kind: str):
    return build_workload(WORKLOADS[kind], 128_256, seed=1)


def check_arrival_rules(wl, run, max_concurrency=None) -> None:
    """Each request arrived by the rules of `schedlab run`: at `arrival_s` after the start, a
    session's later turn `think_time_s` after the previous turn ended with the history as its
    prompt, and never more than `max_concurrency` in flight (a held request's clock starting at
    a free seat, so no earlier than its release)."""
    assert len(run.requests) == len(wl)
    prev = {j: i for i, j in next_turns(wl).items()}
    for j, (w, r) in enumerate(zip(wl, run.requests, strict=True)):
        i = prev.get(j)
        if i is None:
            release, prompt = run.start_time + w.arrival_s, w.prompt_token_ids
        else:
            p = run.requests[i]
            release = p.metrics.finished_time + w.think_time_s
            prompt = p.prompt_token_ids + p.output_token_ids + w.prompt_token_ids
        assert r.prompt_token_ids == prompt, f"request {j}: its prompt is not the history"
        if max_concurrency is None:
            assert r.arrival_time == pytest.approx(release, abs=1e-9), f"request {j}"
        else:
            assert r.arrival_time >= release - 1e-9, f"request {j}"
        assert (r.client_id, r.priority, r.deadline_ms, r.slo_class) == (
            w.client_id, w.priority, w.deadline_ms, w.slo_class), f"request {j}: metadata"
    if max_concurrency is not None:
        assert RequestStats.of(run.requests, run.start_time).peak_in_flight() <= max_concurrency


def same_counts(a: dict, b: dict) -> None:
    for key in ("completed", "num_rejected", "num_failed", "total_input_tokens",
                "total_output_tokens", "input_lens", "output_lens"):
        assert a[key] == b[key], key


@pytest.mark.parametrize("kind", sorted(WORKLOADS))
def test_one_engine_and_clusters_give_the_same_workload(kind):
    wl = workload(kind)
    one = run_workload(Engine(sim()), wl)
    check_arrival_rules(wl, one)
    m1 = compute_metrics(one)
    assert m1["completed"] == len(wl)
    for cfg in (ClusterConfig(num_instances=2),
                ClusterConfig(num_instances=None, prefill_instances=1, decode_instances=1)):
        run = run_workload(Cluster(cfg, sim()), workload(kind), check=True)
        check_arrival_rules(wl, run)
        same_counts(m1, compute_metrics(run))


def test_a_cluster_of_one_is_the_single_engine():
    wl = workload("sessions_with_clients")
    a = compute_metrics(run_workload(Engine(sim()), wl, max_concurrency=3))
    b = compute_metrics(run_workload(Cluster(ClusterConfig(), sim()), wl, max_concurrency=3))
    for key in ("ttfts", "e2els", "itls", "num_steps", "prefix_cache_hit_rate",
                "jain_fairness_index", "max_concurrent_requests"):
        assert a[key] == b[key], key


@pytest.mark.parametrize("layout", [{"num_instances": 1}, {"num_instances": 2},
                                    {"num_instances": None, "prefill_instances": 1,
                                     "decode_instances": 1}])
def test_max_concurrency_caps_the_whole_cluster(layout):
    wl = workload("sessions_with_clients")
    run = run_workload(Cluster(ClusterConfig(**layout), sim()), wl, max_concurrency=2)
    check_arrival_rules(wl, run, max_concurrency=2)
    m = compute_metrics(run)
    assert m["completed"] == len(wl) and m["max_concurrent_requests"] == 2


def test_cluster_kv_use_and_running_seats_are_the_whole_clusters():
    """Four instances that each fill their 64-block pool: the cluster's KV peak is near 100%
    of the cluster's pool (not one instance's peak over it), each instance's own peak is in
    the summary, and running seats add up over the instances."""
    wl = build_workload({"type": "synthetic", "num_requests": 96,
                         "input_len": {"dist": "uniform", "min": 16, "max": 128},
                         "output_len": {"dist": "uniform", "min": 8, "max": 32}}, 128_256, seed=0)
    ec = sim(num_kv_blocks=64, prefix_cache="none")
    one = compute_metrics(run_workload(Engine(ec), wl))
    res = Cluster(ClusterConfig(num_instances=4), ec).run(wl)
    four = compute_metrics(res.run)
    assert one["peak_kv_usage_pct"] == 100.0 and four["peak_kv_usage_pct"] > 90.0
    assert [i.peak_kv_usage_pct for i in res.instances] == [100.0] * 4
    assert four["num_kv_blocks"] == 4 * 64
    assert four["max_num_running"] > 2 * one["max_num_running"]
    assert one["max_concurrent_requests"] == four["max_concurrent_requests"] == 96


#: results.json keys that hold one entry per request (a streaming run writes none)
PER_REQUEST = {"input_lens", "output_lens", "ttfts", "tpots", "e2els", "itls", "errors"}
#: the figures of a workload with clients, SLO classes and deadlines
GROUPS = {"per_client", "jain_fairness_index", "max_service_difference", "service_timeline",
          "per_slo_class", "deadline_attainment"}


@pytest.mark.parametrize("layout", [None, {"num_instances": 2},
                                    {"num_instances": None, "prefill_instances": 1,
                                     "decode_instances": 1}])
@pytest.mark.parametrize("kind", ["synthetic", "sessions", "shared_prefix",
                                  "clients_slo_priorities", "sessions_with_clients"])
def test_a_streaming_run_gives_the_summary_of_a_detailed_one(layout, kind):
    """driver.save_detailed=false: every summary key of the detailed run with the same value
    (latency statistics, throughputs, goodput, peaks; per client and per SLO class, fairness,
    the service timeline and deadlines), no per-request list, and no request left in an
    engine; a max_concurrency cap, a rejected request and requests of no client or SLO class
    included."""
    def go(detailed: bool):
        wl = workload(kind)
        wl[1].prompt_token_ids = list(range(2, 10_000))  # past max_model_len: rejected
        for w in wl[::5]:
            w.client_id = w.slo_class = w.deadline_ms = None
        ec = sim()
        target = Engine(ec) if layout is None else Cluster(ClusterConfig(**layout), ec)
        run = run_workload(target, wl, max_concurrency=5, save_detailed=detailed)
        engines = ([target] if layout is None else [i.engine for i in target.instances])
        return compute_metrics(run, slo={"ttft": 30.0, "tpot": 8.0}), engines

    full, _ = go(True)
    streamed, engines = go(False)
    assert full["num_rejected"] >= 1 and full["completed"] > 0
    assert set(full) - set(streamed) == PER_REQUEST and set(streamed) <= set(full)
    wall = {k for k in full if "framework" in k or k.startswith("mean_") and k.endswith(
        "_time_ms") and k != "mean_step_time_ms"}  # host seconds, measured: they vary
    for key in set(streamed) - wall:
        assert streamed[key] == full[key], key
    assert all(not e.requests for e in engines)
    if kind == "clients_slo_priorities":
        assert GROUPS <= set(streamed)
        assert set(streamed["per_client"]) == {"<none>", "heavy", "light"}
        assert set(streamed["per_slo_class"]) == {"<none>", "batch", "chat"}
    if kind == "sessions_with_clients":
        assert {"per_client", "jain_fairness_index", "service_timeline"} <= set(streamed)


def test_the_summary_does_not_depend_on_the_chunks_token_times_are_read_in(monkeypatch):
    """Token times are read in chunks of whole requests and the service difference is scanned
    window by window (to bound memory on long runs): chunks of one request and windows of a
    few events give the same summary, to the last bit."""
    import schedlab.runs.groups as groups
    import schedlab.runs.token_reads as token_reads

    run = run_workload(Cluster(ClusterConfig(num_instances=2), sim()),
                       workload("clients_slo_priorities"), save_detailed=False)
    whole = compute_metrics(run, slo={"ttft": 30.0})
    monkeypatch.setattr(token_reads, "CHUNK_TOKENS", 1)
    monkeypatch.setattr(groups, "SPREAD_WINDOW", 3)
    assert compute_metrics(run, slo={"ttft": 30.0}) == whole
    assert whole["max_service_difference"] > 0 and whole["max_output_tokens_per_s"] > 0


def test_a_cluster_that_drops_sessions_fails_the_checks(monkeypatch):
    """The planted divergence: replicas that route a later turn with its message only (as the
    old cluster loop did) break the same checks the real paths pass."""
    real = Cluster.route

    def route(self, k, prompt, params, arrival, w, request_id=None):
        if len(self.instances) > 1:  # one engine keeps the real path
            prompt = list(w.prompt_token_ids)
        return real(self, k, prompt, params, arrival, w, request_id)

    monkeypatch.setattr(Cluster, "route", route)
    wl = workload("sessions")
    one = compute_metrics(run_workload(Engine(sim()), wl))
    run = run_workload(Cluster(ClusterConfig(num_instances=2), sim()), wl)
    with pytest.raises(AssertionError, match="history"):
        check_arrival_rules(wl, run)
    with pytest.raises(AssertionError, match="total_input_tokens"):
        same_counts(one, compute_metrics(run))


def test_llm_generate_gives_the_arrays_of_schedlab_run(tmp_path):
    """`queue=sjf` with the oracle lengths and priorities: LLM.generate with the metadata lists
    gives `schedlab run`'s arrays exactly."""
    from hydra import compose, initialize_config_module

    from schedlab import LLM, SamplingParams
    from schedlab.cli.app import execute
    from schedlab.cli.settings import build_settings

    spec = ["executor=sim", "model=llama3_8b", "hardware=h100", "queue=sjf", "logger=none",
            "plots=false", "print_table=false", "driver.progress=false",
            f"paths.output_dir={tmp_path}", "workload.num_requests=40",
            "engine.max_num_seqs=8", "+workload.priority_levels=3",
            "workload.arrival.process=offline"]  # LLM.generate submits all at once
    with initialize_config_module("schedlab.conf", version_base="1.3"):
        s = build_settings(compose("config", overrides=spec))
    ran = execute(s)
    llm = LLM(model="llama3_8b", executor="sim", executor_options={"hardware": "h100"},
              queue="sjf", max_num_seqs=8)
    wl = build_workload(s.workload, llm.engine.model_spec.vocab_size, seed=s.seed)
    outs = llm.generate([w.prompt_token_ids for w in wl],
                        [SamplingParams(max_tokens=w.max_tokens, ignore_eos=True) for w in wl],
                        priority=[w.priority for w in wl],
                        expected_output_len=[w.expected_output_len for w in wl],
                        client_id=[w.client_id for w in wl])
    ttfts = [o.metrics.first_token_time - o.metrics.arrival_time for o in outs]
    e2els = [o.metrics.finished_time - o.metrics.arrival_time for o in outs]
    assert ttfts == ran["ttfts"] and e2els == ran["e2els"]
    assert [len(o.outputs[0].token_ids) for o in outs] == ran["output_lens"]


def test_llm_generate_refuses_misaligned_metadata():
    from schedlab import LLM

    llm = LLM(model="llama3_8b", executor="sim", executor_options={"hardware": "h100"})
    with pytest.raises(ValueError, match="priority must be a list with one value per prompt"):
        llm.generate([[5, 6], [7, 8]], priority=[1])


# ---- serve + bench serve --------------------------------------------------------------------
@pytest.fixture(scope="module")
def sim_server():
    from schedlab.serve.server import Server, ServerOptions

    with Server(sim(), ServerOptions(port=0, model_names=("sim",), log_level="warning")) as s:
        yield s


def _bench(server, wl):
    from schedlab.serve.bench import BenchOptions, run_bench

    return run_bench(wl, BenchOptions(base_url=server.base_url, model="sim"))


def per_client(wl, run) -> dict[str, list[tuple[int, int]]]:
    """Each client's requests in workload order: (prompt tokens, output tokens)."""
    out: dict[str, list[tuple[int, int]]] = {}
    for w, r in zip(wl, run.requests, strict=True):
        out.setdefault(w.client_id, []).append((r.num_prompt_tokens, r.num_output_tokens))
    return out


def test_bench_serve_replays_what_run_runs(sim_server):
    """Sessions of two clients: `bench serve` against `serve` sends the same prompts (each
    later turn with its history, after the answer) and gets the same counts as `run`."""
    wl = workload("sessions_with_clients")
    ran = run_workload(Engine(sim()), wl)
    benched = _bench(sim_server, wl)
    same_counts(compute_metrics(ran), compute_metrics(benched))
    assert per_client(wl, benched) == per_client(wl, ran)
    for w, r in zip(wl, benched.requests, strict=True):
        assert r.client_id == w.client_id and r.slo_class == w.slo_class


def test_a_bench_that_drops_sessions_fails_the_checks(sim_server, monkeypatch):
    from schedlab.serve import bench

    monkeypatch.setattr(bench, "next_turns", lambda workload: {})  # every turn sent at once
    wl = workload("sessions_with_clients")
    ran = run_workload(Engine(sim()), wl)
    benched = _bench(sim_server, wl)
    with pytest.raises(AssertionError, match="total_input_tokens"):
        same_counts(compute_metrics(ran), compute_metrics(benched))
    assert per_client(wl, benched) != per_client(wl, ran)


# ---- a loop that cannot progress stops ------------------------------------------------------
def test_a_queue_that_loses_requests_stops_the_loop_with_a_sentence():
    eng = Engine(sim())
    eng.scheduler.waiting.add = lambda request: None  # the queue forgets what it is given
    # the engine's own accounting names the queue before the loop runs dry
    with pytest.raises(PluginContractError, match=r"queue 'fcfs' lost 1 request: add\(\) accepted "
                                                  r"it but pop\(\)/iteration never returned it"):
        run_workload(eng, workload("synthetic"))


def test_an_engine_that_says_it_is_done_with_requests_outstanding_stops_the_loop():
    eng = Engine(sim())
    eng.scheduler.waiting.add = lambda request: None
    eng.has_unfinished = lambda: False  # an engine whose own accounting is bypassed
    with pytest.raises(RuntimeError, match=r"no instance has work left while 16 requests are "
                                           r"outstanding \(scheduler 'continuous', queue 'fcfs'\)"):
        run_workload(eng, workload("synthetic"))


def test_an_engine_that_never_progresses_stops_within_the_step_limit(monkeypatch):
    from schedlab.cluster import loop

    monkeypatch.setattr(loop, "MAX_STALLED_STEPS", 50)
    eng = Engine(sim())
    calls = []
    eng.has_unfinished = lambda: True  # work it never does
    eng.step = lambda: calls.append(1) or []
    with pytest.raises(RuntimeError, match="instance 0 made no progress in 51 steps"):
        run_workload(eng, workload("synthetic"))
    assert len(calls) == 51


def test_a_length_aware_queue_gets_the_output_length_hint_over_http():
    """`queue=sjf` orders by the workload's output-length hint (`oracle_output_len`) in `run`
    and over HTTP alike (bench sends it, serve reads it), not by the prompt lengths."""
    from schedlab.runs.distributions import WorkloadRequest
    from schedlab.serve.server import Server, ServerOptions

    lens = [60, 24, 48, 20, 36]
    wl = [WorkloadRequest([5] * 16, n, expected_output_len=n) for n in lens]  # all at 0

    def order(run) -> list[int]:  # by the time each finished
        return sorted(range(len(wl)), key=lambda i: run.requests[i].metrics.finished_time)

    cfg = sim(queue="sjf", max_num_seqs=1)
    assert order(run_workload(Engine(cfg), wl)) == sorted(range(5), key=lens.__getitem__)
    with Server(cfg, ServerOptions(port=0, model_names=("sim",), log_level="warning")) as s:
        benched = _bench(s, wl)
    # the first to reach the idle server runs at once; the rest wait and go shortest first
    rest = order(benched)[1:]
    assert [lens[i] for i in rest] == sorted(lens[i] for i in rest)
    assert [r.num_output_tokens for r in benched.requests] == lens


def test_a_request_a_policy_drops_once_queued_is_rejected_with_its_reason_over_http():
    """EDF's `on_miss: drop` ends a queued request REJECTED with the reason: counted as
    rejected (not failed) by `bench serve` as by `run`, the reason kept."""
    from schedlab.runs.distributions import WorkloadRequest
    from schedlab.serve.server import Server, ServerOptions

    wl = [WorkloadRequest([5] * 16, 40, deadline_ms=60.0) for _ in range(6)]  # all at 0
    cfg = sim(queue="edf", queue_options={"on_miss": "drop"}, max_num_seqs=1)
    ran = compute_metrics(run_workload(Engine(cfg), wl))
    with Server(cfg, ServerOptions(port=0, model_names=("sim",), log_level="warning")) as s:
        run = _bench(s, wl)
    benched = compute_metrics(run)
    for m in (ran, benched):  # one runs at once, ~0.3 s each: the others miss 60 ms and go
        assert m["num_failed"] == 0 and m["num_rejected"] >= 4
        assert m["completed"] + m["num_rejected"] == len(wl)
    dropped = [r for r in run.requests if r.status is RequestStatus.REJECTED]
    assert len(dropped) == benched["num_rejected"]
    assert all("edf: dropped after waiting" in r.reject_reason for r in dropped)


def test_bench_sends_the_request_metadata_as_the_server_reads_it():
    from schedlab.runs.distributions import WorkloadRequest
    from schedlab.serve.bench import BenchOptions, request_body

    o = BenchOptions(base_url="http://x")
    w = WorkloadRequest([5, 6], 4, client_id="light", priority=2, deadline_ms=250,
                        slo_class="chat", expected_output_len=3)
    body = request_body("m", [5, 6], w, o)
    assert (body["user"], body["priority"], body["deadline_ms"], body["slo_class"],
            body["expected_output_len"]) == ("light", 2, 250.0, "chat", 3)
    plain = request_body("m", [5, 6], WorkloadRequest([5, 6], 4), o)
    assert not {"user", "priority", "deadline_ms", "slo_class", "expected_output_len"} & set(
        plain)  # vLLM-safe
