"""A simulated cluster split over worker processes (`run_workload(..., workers=N)`,
`driver.workers=N`) gives the run one process gives, number for number: the metrics, the
steps in steps.csv's order, each instance's summary; a run it cannot split is refused with
the reason; a worker's error, a worker's death and a Ctrl-C reach the run's process."""

from __future__ import annotations

import json
import os
import signal
import sys
from dataclasses import astuple
from pathlib import Path

import pytest
from hydra import compose, initialize_config_module
from test_paths import WORKLOADS, sim, workload

from schedlab.cluster import Cluster, ClusterConfig
from schedlab.config import ConfigError
from schedlab.faults import PluginContractError
from schedlab.runs.driver import run_workload
from schedlab.runs.interrupt import InterruptLatch
from schedlab.runs.metrics import compute_metrics
from schedlab.runs.request_stats import COMPLETED, FAILED, RequestStats
from schedlab.stats import STEP_PHASES, StepStats

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))
import same_run  # noqa: E402

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="a split run forks")

#: the host's own seconds in a step record (each process measures its own)
HOST = {f"{p}_time" for p in STEP_PHASES} | {"framework_time"}
_FIELDS = list(StepStats.__dataclass_fields__)
_SIM = [k for k, name in enumerate(_FIELDS) if name not in HOST]


def _run(wl, workers: int, n: int = 4, detailed: bool = False, **engine):
    steps: list[tuple] = []

    def out(batch):
        steps.extend(tuple(astuple(s)[k] for k in _SIM) for s in batch)

    cluster = Cluster(ClusterConfig(num_instances=n), sim(**engine))
    run = run_workload(cluster, wl, save_detailed=detailed, steps_out=out, workers=workers,
                       check=True)  # NOTE: every instance's integrity after every step
    metrics = compute_metrics(run, slo={"ttft": 40.0, "tpot": 20.0})
    host = {f"mean_{p}_time_ms" for p in STEP_PHASES} | {"mean_framework_time_ms"}
    requests = [(r.request_id, r.prompt_token_ids, r.output_token_ids, r.status,
                 r.metrics) for r in run.requests]
    return ({k: v for k, v in metrics.items() if k not in host}, steps,
            cluster.result_with_summary(run).summary(), requests)


@pytest.mark.parametrize("detailed", [False, True], ids=["streaming", "detailed"])
@pytest.mark.parametrize(("kind", "workers", "engine"), [
    ("synthetic", 2, {}),
    ("clients_slo_priorities", 3, {"queue": "priority"}),  # 4 instances over 3 workers
    ("shared_prefix", 2, {"num_kv_blocks": 24, "scheduler": "chunked_prefill",
                          "max_num_batched_tokens": 64}),  # preemptions, prefix hits
    ("azure", 4, {}),
    ("synthetic", 2, {"max_model_len": 48}),  # prompts of 16-64: some rejected on arrival
])
def test_a_split_run_gives_what_one_process_gives(kind, workers, engine, detailed):
    wl = workload(kind)
    one = _run(wl, 1, detailed=detailed, **engine)
    split = _run(wl, workers, detailed=detailed, **engine)
    assert split[0] == one[0]  # every metric (detailed: the per-request lists too)
    assert split[1] == one[1]  # every step, in the run's order
    assert split[2] == one[2]  # each instance's summary
    assert split[3] == one[3]  # detailed: each request, its ids, tokens and timestamps
    rejected = one[0]["num_rejected"]
    assert one[0]["completed"] + rejected == len(wl) and len(one[1]) > len(wl) - rejected
    assert (rejected > 0) is ("max_model_len" in engine)
    assert len(one[3]) == (len(wl) if detailed else 0)
    assert ("ttfts" in one[0]) is detailed


def test_a_cluster_that_ran_split_refuses_another_run_with_a_sentence():
    cluster = Cluster(ClusterConfig(num_instances=2), sim())
    wl = workload("synthetic")
    run_workload(cluster, wl, save_detailed=False, workers=2)
    with pytest.raises(RuntimeError, match="ran in a worker process of a split run"):
        run_workload(cluster, wl, save_detailed=False)


def test_a_split_run_of_many_steps_holds_the_order_across_hand_overs(monkeypatch):
    """Steps handed over every 16 steps, workers far apart in simulated time: the merge
    still gives the one-process order (and the cluster-wide KV series its metrics read)."""
    import schedlab.cluster.parallel as parallel
    import schedlab.cluster.record as record
    import schedlab.cluster.split_worker as split_worker

    monkeypatch.setattr(record, "DRAIN_STEPS", 16)
    monkeypatch.setattr(split_worker, "DRAIN_STEPS", 16)
    monkeypatch.setattr(parallel, "HOLD_STEPS", 32)
    handed = []
    real = parallel.unpack_steps
    monkeypatch.setattr(parallel, "unpack_steps", lambda rows: handed.append(len(rows))
                        or real(rows))
    spec = {**WORKLOADS["synthetic"], "num_requests": 120, "arrival": {"process": "poisson",
                                                                       "rate": 200.0}}
    from schedlab.runs.workload import build_workload

    wl = build_workload(spec, 128_256, seed=3)
    one, split = _run(wl, 1, n=5), _run(wl, 2, n=5)
    assert split == one
    assert len(handed) > 20 and max(handed) <= 16  # many hand-overs, of 16 steps or fewer
    assert one[0]["peak_kv_used_blocks"] > 0


@pytest.mark.parametrize(("change", "why"), [
    ({"router": "least_loaded"}, "router least_loaded chooses by"),
    ({"max_concurrency": 4}, "max_concurrency couples"),
    ({"kind": "sessions"}, "sessions"),
    ({"workers": 5}, "fewer than 5 workers"),
    ({"disaggregated": True}, "disaggregation"),
])
def test_a_run_that_cannot_be_split_is_refused_with_the_reason(change, why):
    router = change.get("router", "round_robin")
    config = (ClusterConfig(num_instances=None, prefill_instances=2, decode_instances=2,
                            router=router)
              if change.get("disaggregated") else ClusterConfig(num_instances=4, router=router))
    cluster = Cluster(config, sim())
    with pytest.raises(ConfigError, match=why) as err:
        run_workload(cluster, workload(change.get("kind", "synthetic")),
                     save_detailed=change.get("save_detailed", False),
                     max_concurrency=change.get("max_concurrency"),
                     workers=change.get("workers", 2))
    assert str(err.value).startswith(f"workers={change.get('workers', 2)} (driver.workers)")


@pytest.mark.parametrize("workers", [0, True, 1.5])
def test_workers_must_be_a_count(workers):
    with pytest.raises(ConfigError, match="must be an integer >= 1"):
        run_workload(Cluster(ClusterConfig(num_instances=2), sim()), workload("synthetic"),
                     save_detailed=False, workers=workers)


def test_a_workers_plugin_error_is_raised_in_the_run_process(monkeypatch):
    """A plugin that breaks its contract on one instance, in a worker: the run's process
    raises the error one process raises, naming the plugin."""
    from schedlab.cluster.instance import Instance

    real = Instance.step

    def step(self):
        if self.index == 3 and self.engine.counters().num_steps == 5:
            raise PluginContractError("scheduler continuous planned step 6 with nonsense")
        real(self)

    monkeypatch.setattr(Instance, "step", step)
    wl = workload("synthetic")
    for workers in (1, 2):
        with pytest.raises(PluginContractError, match="planned step 6 with nonsense"):
            run_workload(Cluster(ClusterConfig(num_instances=4), sim()), wl,
                         save_detailed=False, workers=workers)


def test_a_worker_that_dies_is_named(monkeypatch):
    from schedlab.cluster.instance import Instance

    real = Instance.step

    def step(self):
        if self.index == 1 and self.engine.counters().num_steps == 3:
            os._exit(7)  # NOTE: only workers step instances in a split run
        real(self)

    monkeypatch.setattr(Instance, "step", step)
    with pytest.raises(RuntimeError, match=r"worker 1 \(pid \d+\) ended without handing over "
                                           r"its results \(exit status 7\)"):
        run_workload(Cluster(ClusterConfig(num_instances=4), sim()), workload("synthetic"),
                     save_detailed=False, workers=2)


@pytest.mark.parametrize("detailed", [False, True], ids=["streaming", "detailed"])
def test_a_ctrl_c_ends_every_request_and_keeps_the_partial_run(monkeypatch, detailed):
    """Ctrl-C while workers run: each ends its requests in flight and hands over what it has;
    the run's process raises KeyboardInterrupt, and the cluster's `interrupt()` gives the
    partial run with every request released so far filed (finished or aborted), as in one
    process."""
    from schedlab.cluster.instance import Instance

    real = Instance.step

    def step(self):  # worker 0 presses Ctrl-C in the run's process at its 20th step
        if self.index == 0 and self.engine.counters().num_steps == 20:
            os.kill(os.getppid(), signal.SIGINT)
        real(self)

    monkeypatch.setattr(Instance, "step", step)
    spec = {**WORKLOADS["synthetic"], "num_requests": 1000, "arrival": {"process": "poisson",
                                                                       "rate": 400.0}}
    from schedlab.runs.workload import build_workload

    wl = build_workload(spec, 128_256, seed=2)
    cluster = Cluster(ClusterConfig(num_instances=4), sim())
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt), InterruptLatch() as latch:
            run_workload(cluster, wl, save_detailed=detailed, interrupt=latch, workers=2)
    finally:
        signal.signal(signal.SIGINT, old)
    res = cluster.interrupt()
    routed = sum(s.num_routed for s in res.instances)
    stats = res.run.stats if not detailed else RequestStats.of(res.run.requests, 0.0)
    assert len(res.run.requests) == (routed if detailed else 0)
    assert 0 < routed < len(wl)  # cut short
    assert stats.num_ended() == routed  # nothing lost: each released one finished or aborted
    assert 0 < stats.count(COMPLETED) and stats.count(FAILED) + stats.count(COMPLETED) == routed
    assert compute_metrics(res.run)["completed"] == stats.count(COMPLETED)


@pytest.mark.parametrize("detailed", ["false", "true"])
def test_schedlab_run_with_workers_writes_the_one_process_results(tmp_path, detailed):
    from schedlab.cli.app import execute
    from schedlab.cli.settings import build_settings

    def run(out, *extra):
        with initialize_config_module("schedlab.conf", version_base="1.3"):
            cfg = compose("config", overrides=[
                f"paths.output_dir={out}", "logger=none", "plots=false", "print_table=false",
                "executor=sim", "model=llama3_8b", "hardware=h100",
                "workload.num_requests=60", "cluster=replicas", "cluster.num_instances=3",
                "driver.progress=false", f"driver.save_detailed={detailed}", *extra])
        execute(build_settings(cfg))
        saved = json.loads((out / "results.json").read_text())
        rows = (out / "steps.csv").read_text().splitlines()
        return saved, rows

    one, one_rows = run(tmp_path / "one")
    two, two_rows = run(tmp_path / "two", "driver.workers=2")
    assert two["config"]["driver"]["workers"] == 2
    # experiments/same_run.py, the check of the figures in experiments/results/sim_speed.md
    assert same_run.differences(tmp_path / "one", tmp_path / "two") == ([], 0,
                                                                        len(one_rows) - 1)
    other, _ = run(tmp_path / "other", "driver.workers=2", "seed=1")
    keys, bad, _ = same_run.differences(tmp_path / "one", tmp_path / "other")
    assert "completed" not in keys and "mean_ttft_ms" in keys and bad > 0
    for key in ("completed", "p99_ttft_ms", "mean_tpot_ms", "p50_itl_ms", "output_throughput",
                "duration", "cluster", "ttfts", "itls", "errors"):
        assert two.get(key) == one.get(key), key
    assert ("ttfts" in one) is (detailed == "true")
    header = one_rows[0].split(",")
    sim_cols = [k for k, c in enumerate(header) if c not in HOST]
    assert [[r.split(",")[k] for k in sim_cols] for r in two_rows] == [
        [r.split(",")[k] for k in sim_cols] for r in one_rows]


def test_driver_workers_must_be_a_count(tmp_path):
    from schedlab.cli.settings import build_settings

    with initialize_config_module("schedlab.conf", version_base="1.3"):
        cfg = compose("config", overrides=[f"paths.output_dir={tmp_path}", "driver.workers=0"])
    with pytest.raises(ConfigError, match=r"driver.workers=0 must be an integer >= 1"):
        build_settings(cfg)
