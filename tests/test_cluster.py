"""The cluster layer: N instances on one virtual clock, prefill/decode disaggregation with KV
transfer, real-token routing on CPU, and the `schedlab run` path through a cluster."""

from __future__ import annotations

import json
import random

import pytest
from fakes import FakeExecutor
from hydra import compose, initialize_config_module

from schedlab.cluster import Cluster, ClusterConfig
from schedlab.config import ConfigError, EngineConfig
from schedlab.engine import Engine
from schedlab.request import RequestStatus
from schedlab.runs.distributions import WorkloadRequest
from schedlab.runs.driver import run_workload


def _wl(n: int, prompt: int = 100, out: int = 8, gap: float = 0.0, seed: int = 0):
    rng = random.Random(seed)
    return [WorkloadRequest([rng.randrange(2, 999) for _ in range(prompt)], out,
                            arrival_s=gap * i) for i in range(n)]


def _fake(**kw) -> EngineConfig:
    return EngineConfig(model="fake", **{"max_num_seqs": 4, "num_kv_blocks": 64, **kw})


def _sim(**kw) -> EngineConfig:
    return EngineConfig(model="llama3_8b", executor="sim", scheduler="chunked_prefill",
                        executor_options={"hardware": "h100"}, **kw)


def test_one_instance_cluster_matches_the_plain_driver():
    wl = _wl(12, gap=0.002)
    plain = run_workload(Engine(_fake(), executor_cls=FakeExecutor), wl)
    res = Cluster(ClusterConfig(num_instances=1), _fake(), executor_cls=FakeExecutor).run(wl)
    for a, b in zip(plain.requests, res.run.requests, strict=True):
        assert a.output_token_ids == b.output_token_ids
        assert a.metrics.token_times == b.metrics.token_times
    assert res.run.duration_s == pytest.approx(plain.duration_s)


@pytest.mark.parametrize("save_detailed", [True, False])
def test_each_step_record_names_the_instance_that_stepped(tmp_path, save_detailed):
    """A cluster's steps.csv can be split by instance: each row's `instance`, under which the
    step numbers count 1, 2, 3, ... as each engine's own (before, rows of every instance were
    interleaved with repeated step numbers and nothing told them apart)."""
    from schedlab.cli.steps_csv import StepsCsv, read_steps_csv

    out = StepsCsv(tmp_path / "steps.csv")
    cluster = Cluster(ClusterConfig(num_instances=3), _fake(), executor_cls=FakeExecutor)
    run_workload(cluster, _wl(12, prompt=16, out=6, gap=0.001), steps_out=out,
                 save_detailed=save_detailed)
    out.close()
    rows = list(read_steps_csv(tmp_path / "steps.csv"))
    assert {r.instance for r in rows} == {0, 1, 2}
    for i in range(3):
        steps = [r.step for r in rows if r.instance == i]
        assert steps == list(range(1, len(steps) + 1)), i
    assert len(rows) == sum(inst.engine.num_steps for inst in cluster.instances)
    one = run_workload(Engine(_fake(), executor_cls=FakeExecutor), _wl(4, prompt=16, out=6))
    assert {s.instance for s in one.step_stats} == {0}


def test_instances_run_in_parallel_on_one_clock():
    """Eight one-seat requests at t=0: four instances finish them in about a quarter of the
    virtual time one instance takes, and every instance's clock starts at 0."""
    wl = _wl(8, prompt=16, out=20)
    ec = _fake(max_num_seqs=1)
    one = Cluster(ClusterConfig(num_instances=1), ec, executor_cls=FakeExecutor).run(wl)
    four = Cluster(ClusterConfig(num_instances=4), ec, executor_cls=FakeExecutor).run(wl)
    assert four.run.duration_s == pytest.approx(one.run.duration_s / 4, rel=0.05)
    # the first request on each instance starts at t=0 (no instance waits for another)
    firsts = sorted(r.metrics.first_scheduled_time for r in four.run.requests)[:4]
    assert firsts == [0.0] * 4


def test_idle_instance_jumps_to_the_arrival():
    wl = [WorkloadRequest([5] * 16, 3, arrival_s=0.0), WorkloadRequest([6] * 16, 3, arrival_s=2.0)]
    res = Cluster(ClusterConfig(num_instances=2), _fake(), executor_cls=FakeExecutor).run(wl)
    late = res.run.requests[1]
    assert late.metrics.first_scheduled_time == pytest.approx(2.0)
    assert late.metrics.first_token_time - late.metrics.arrival_time == pytest.approx(1e-3)


# ---- prefill/decode disaggregation -------------------------------------------------------
def _pd(bandwidth="25GB", latency=1e-4, **kw) -> ClusterConfig:
    return ClusterConfig(num_instances=None, prefill_instances=1, decode_instances=1,
                         link_bandwidth=bandwidth, link_latency=latency, **kw)


def test_prefill_instance_gives_the_first_token_and_decode_never_recomputes_the_prompt():
    wl = _wl(6, prompt=200, out=10, gap=0.01)
    res = Cluster(_pd(), _sim()).run(wl, check=True)
    p, d = res.instances
    assert (p.role, d.role) == ("prefill", "decode")
    assert p.num_transfers_out == d.num_transfers_in == 6
    cl_steps = res.run.step_stats
    assert sum(s.num_prefill_tokens for s in cl_steps) == 6 * 200  # each prompt once
    for r in res.run.requests:
        assert r.status is RequestStatus.FINISHED_LENGTH and r.num_output_tokens == 10
        m = r.metrics
        # the second token comes after the KV transfer (all transfers are the same size)
        assert m.token_times[1] - m.token_times[0] > p.mean_transfer_time_ms / 1000
        assert m.token_times == sorted(m.token_times)


def test_decode_side_steps_run_only_decode_tokens():
    wl = _wl(4, prompt=300, out=5, gap=0.02)
    cl = Cluster(_pd(), _sim())
    cl.run(wl, check=True)
    dec = cl.instances[1].engine
    assert dec.step_stats and all(s.num_prefill_tokens == 0 for s in dec.step_stats)
    pre = cl.instances[0].engine
    assert sum(s.num_decode_tokens for s in pre.step_stats) == 0


def test_kv_transfer_time_is_bytes_over_bandwidth_plus_latency():
    cfg = _pd(bandwidth="10GB", latency=0.002)
    cl = Cluster(cfg, _sim())
    res = cl.run(_wl(3, prompt=100, out=4, gap=0.05))
    spec = cl.instances[1].engine.kv_spec
    blocks = -(-100 // spec.block_size)
    expected = blocks * spec.bytes_per_block / 10e9 + 0.002
    p = res.instances[0]
    assert p.transfer_bytes_out == 3 * blocks * spec.bytes_per_block
    assert p.mean_transfer_time_ms == pytest.approx(1000 * expected)


def test_a_slower_link_delays_the_second_token_not_the_first():
    wl = _wl(4, prompt=400, out=6, gap=0.05)
    fast = Cluster(_pd(bandwidth="100GB"), _sim()).run(wl).run.requests
    slow = Cluster(_pd(bandwidth="0.5GB"), _sim()).run(wl).run.requests
    for f, s in zip(fast, slow, strict=True):
        assert s.metrics.first_token_time == pytest.approx(f.metrics.first_token_time)
        gap_f = f.metrics.token_times[1] - f.metrics.token_times[0]
        gap_s = s.metrics.token_times[1] - s.metrics.token_times[0]
        assert gap_s > gap_f + 0.05  # 400 tokens of llama3-8b KV over 0.5 GB/s: ~0.1 s


def test_decode_instance_allocates_the_transferred_blocks():
    cl = Cluster(_pd(), _sim(block_size=16))
    cl.run([WorkloadRequest(list(range(2, 102)), 3)], check=True)
    first = cl.instances[1].engine.step_stats[0]
    # the prompt's 100 tokens (7 blocks) arrived; the step adds the first output token's slot
    assert first.kv_used_blocks == 7
    assert first.num_decode_tokens == 1 and first.num_prefill_tokens == 0


def test_a_transfer_waits_for_a_decode_seat():
    """One decode seat: the second request's KV waits on the decode side until the first one
    finishes; nothing is lost and the wait shows in its token times."""
    wl = _wl(2, prompt=50, out=30)
    cl = Cluster(_pd(), _sim(max_num_seqs=1))
    res = cl.run(wl, check=True)
    a, b = res.run.requests
    assert a.num_output_tokens == b.num_output_tokens == 30
    assert b.metrics.token_times[1] >= a.metrics.finished_time


def test_one_token_requests_never_leave_the_prefill_instance():
    res = Cluster(_pd(), _sim()).run(_wl(3, prompt=40, out=1), check=True)
    assert all(r.num_output_tokens == 1 and r.is_finished for r in res.run.requests)
    assert res.instances[0].num_transfers_out == 0


# ---- config --------------------------------------------------------------------------------
@pytest.mark.parametrize(("kw", "msg"), [
    (dict(num_instances=0), "cluster.num_instances=0"),
    (dict(prefill_instances=1), "needs at least one of each"),
    (dict(num_instances=3, prefill_instances=1, decode_instances=1), "num_instances=3"),
    (dict(link_bandwidth="fast"), "cluster.link_bandwidth"),
    (dict(link_latency=-1), "cluster.link_latency"),
])
def test_bad_cluster_config_names_the_key(kw, msg):
    with pytest.raises(ConfigError, match=msg):
        ClusterConfig(**kw)


# ---- real tokens ---------------------------------------------------------------------------
def test_real_instances_give_the_single_engine_greedy_outputs(llama_dir):
    """Two co-located replicas and a 1P+1D split (the prompt KV copied between the two
    engines' caches) produce the same greedy tokens as one engine."""
    rng = random.Random(7)
    wl = [WorkloadRequest([rng.randrange(3, 200) for _ in range(rng.randint(5, 40))], 6,
                          arrival_s=0.0) for _ in range(5)]
    ec = EngineConfig(model=llama_dir, max_num_seqs=4, max_model_len=128, num_kv_blocks=64)
    ref = run_workload(Engine(ec), wl).requests
    for cfg in (ClusterConfig(num_instances=2), _pd(router="least_loaded")):
        res = Cluster(cfg, ec).run(wl, check=True)
        for a, b in zip(ref, res.run.requests, strict=True):
            assert b.output_token_ids == a.output_token_ids, cfg
        assert all(s.num_steps > 0 for s in res.instances)


def test_least_loaded_routes_as_with_loads_summed_afresh_on_every_arrival(monkeypatch):
    """Instances keep their load between changes; a router reading every load on every
    arrival routes exactly as if each were summed over its requests anew."""
    from schedlab.cluster.instance import Instance

    rng = random.Random(3)
    wl = [WorkloadRequest([rng.randrange(2, 999) for _ in range(rng.randint(8, 200))],
                          rng.randint(1, 40), arrival_s=0.004 * i) for i in range(60)]
    cfg = ClusterConfig(num_instances=3, router="least_loaded")
    kept = Cluster(cfg, _sim()).run(wl, check=True)  # check: each kept load == a fresh one
    load = Instance.load

    def afresh(self, cached_prefix_tokens=0):
        self.forget_load()
        return load(self, cached_prefix_tokens)

    monkeypatch.setattr(Instance, "load", afresh)
    fresh = Cluster(cfg, _sim()).run(wl)
    assert [s.num_routed for s in kept.instances] == [s.num_routed for s in fresh.instances]
    assert len({s.num_routed for s in kept.instances}) > 1  # the loads did steer it
    for a, b in zip(kept.run.requests, fresh.run.requests, strict=True):
        assert a.metrics == b.metrics


# ---- the command line ----------------------------------------------------------------------
def _settings(tmp_path, *overrides):
    from schedlab.cli.settings import build_settings

    with initialize_config_module("schedlab.conf", version_base="1.3"):
        cfg = compose("config", overrides=[
            f"paths.output_dir={tmp_path}", "logger=none", "plots=false", "print_table=false",
            "executor=sim", "model=llama3_8b", "hardware=h100", "workload.num_requests=12",
            *overrides])
    return build_settings(cfg)


def test_default_config_runs_one_engine(tmp_path):
    assert _settings(tmp_path).cluster is None


def test_a_streaming_cluster_run_writes_the_summary_without_per_request_lists(tmp_path):
    from schedlab.cli.app import execute

    detailed = execute(_settings(tmp_path / "d", "cluster=replicas", "driver.progress=false"))
    execute(_settings(tmp_path / "s", "cluster=replicas", "driver.progress=false",
                      "driver.save_detailed=false"))
    saved = json.loads((tmp_path / "s" / "results.json").read_text())
    assert "ttfts" in detailed and "ttfts" not in saved and "itls" not in saved
    assert saved["completed"] == detailed["completed"] == 12
    for key in ("p99_ttft_ms", "p50_itl_ms", "mean_tpot_ms", "output_throughput"):
        assert saved[key] == detailed[key], key
    assert saved["cluster"]["num_instances"] == 2


def test_run_through_a_disaggregated_cluster_writes_one_results_file(tmp_path):
    from schedlab.cli.app import execute

    s = _settings(tmp_path, "cluster=disaggregated", "cluster.prefill_instances=2",
                  "router=least_loaded", "driver.progress=false")
    assert s.cluster.total_instances == 3
    m = execute(s)
    saved = json.loads((tmp_path / "results.json").read_text())
    assert m["completed"] == saved["completed"] == 12
    c = saved["cluster"]
    assert c["router"] == "least_loaded" and c["disaggregated"] is True
    assert [i["role"] for i in c["instances"]] == ["prefill", "prefill", "decode"]
    assert sum(i["num_routed"] for i in c["instances"]) == 12


@pytest.mark.parametrize(("override", "msg"), [
    ("router.name=nope", "installed: least_loaded"),
    ("cluster.num_instances=-2", "cluster.num_instances=-2"),
    ("+cluster.instances=2", "cluster.instances is not a cluster key"),
])
def test_bad_cluster_options_fail_before_any_work(tmp_path, override, msg):
    from schedlab.registry import PluginError

    with pytest.raises((ConfigError, PluginError), match=msg):
        _settings(tmp_path, "cluster=replicas", override)


@pytest.mark.parametrize("timer", ["wall", "cpu"])
def test_instance_clock_counts_only_its_own_steps(timer):
    from schedlab.clock import InstanceClock

    c = InstanceClock(timer)
    c.resume()
    sum(i * i for i in range(200_000))  # some work while "stepping"
    c.pause()
    t = c.now()
    assert t > 0
    sum(i * i for i in range(200_000))  # another instance's step: not counted
    assert c.now() == t
    c.sleep_until(t + 5.0)
    assert c.now() == t + 5.0
    with pytest.raises(ConfigError, match="cluster.clock"):
        ClusterConfig(clock="gpu")


def test_ctrl_c_mid_run_aborts_everything_and_writes_partial_results(tmp_path, monkeypatch):
    from schedlab.cli import app
    from schedlab.cluster.instance import Instance

    real_step, calls = Instance.step, []

    def step(self):
        calls.append(1)
        if len(calls) == 40:
            raise KeyboardInterrupt
        real_step(self)

    monkeypatch.setattr(Instance, "step", step)
    monkeypatch.setattr(app, "INTERRUPTED", [])
    s = _settings(tmp_path, "cluster=disaggregated", "workload.arrival.process=poisson",
                  "workload.arrival.rate=50", "workload.output_len.max=32")
    with pytest.raises(KeyboardInterrupt):
        app.execute(s)
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["interrupted"] is True and "cluster" in saved
    assert 0 < saved["completed"] < 12 and app.INTERRUPTED


def test_interrupt_leaves_no_request_running_and_every_kv_whole(monkeypatch):
    from schedlab.cluster.instance import Instance

    cl = Cluster(_pd(), _sim())
    real_step, calls = Instance.step, []

    def step(self):
        calls.append(1)
        if len(calls) == 30:
            raise KeyboardInterrupt
        real_step(self)

    monkeypatch.setattr(Instance, "step", step)
    with pytest.raises(KeyboardInterrupt):
        cl.run(_wl(10, prompt=200, out=40, gap=0.005))
    res = cl.interrupt()
    statuses = {r.status for r in res.run.requests}
    assert RequestStatus.FINISHED_ABORTED in statuses
    assert all(r.is_finished for r in res.run.requests)
    for inst in cl.instances:
        assert not inst.engine.has_unfinished()
        assert inst.engine.kv.usage().used_blocks == 0
        inst.engine.check_integrity()
