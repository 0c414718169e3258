"""Fairness and SLO policies (vtc, edf, rate_limit, aging, priority preemption) and the
per-client / per-SLO-class metrics."""

from __future__ import annotations

import json
import random

import pytest
from fakes import FakeExecutor

from schedlab import registry
from schedlab.config import EngineConfig
from schedlab.engine import Engine
from schedlab.request import Request, RequestStatus, SamplingParams
from schedlab.runs.distributions import WorkloadRequest
from schedlab.runs.driver import run_workload
from schedlab.runs.groups import jain_index
from schedlab.runs.metrics import compute_metrics
from schedlab.runs.report import find_runs, write_report
from schedlab.runs.results import format_table, write_results


def fake_engine(**kw) -> Engine:
    opts = dict(max_num_seqs=2, max_model_len=128, num_kv_blocks=128, block_size=4)
    opts.update(kw)
    return Engine(EngineConfig(model="fake", **opts), executor_cls=FakeExecutor)


def tenants(n_heavy: int, n_light: int, prompt: int = 8, out: int = 8) -> list[WorkloadRequest]:
    """Every request at t=0, the heavy client's first (FCFS serves them all first)."""
    return ([WorkloadRequest([5] * prompt, out, client_id="heavy") for _ in range(n_heavy)]
            + [WorkloadRequest([6] * prompt, out, client_id="light") for _ in range(n_light)])


def req(rid: str, client: str | None = None, t: float = 0.0, n: int = 4, **kw) -> Request:
    return Request(rid, [1] * n, SamplingParams(max_tokens=4), arrival_time=t, client_id=client,
                   **kw)


# ---- vtc ---------------------------------------------------------------------------------
def test_vtc_shares_service_between_backlogged_clients_where_fcfs_does_not():
    def light_done_at(queue: str) -> float:
        run = run_workload(fake_engine(queue=queue), tenants(24, 8))
        assert all(r.status is RequestStatus.FINISHED_LENGTH for r in run.requests)
        light = [r.metrics.finished_time for r in run.requests if r.client_id == "light"]
        return (max(light) - run.start_time) / run.duration_s

    # FCFS serves the light client after all 24 heavy requests; VTC alternates, so the light
    # client's 8 requests are done by about 2 x 8 / 32 of the run
    assert light_done_at("fcfs") > 0.95
    assert light_done_at("vtc") < 0.6


def test_vtc_lifts_a_returning_clients_counter():
    q = registry.load("queue", "vtc")(input_weight=1.0, output_weight=0.0)
    for i in range(3):
        q.add(req(f"a{i}", "a", n=10))
    q.pop()  # a served 10 tokens while b was idle
    assert q.counters["a"] == 10
    q.add(req("b0", "b", n=10))
    # b's counter starts at a's (the smallest backlogged), not at 0: no credit for idling
    assert q.counters["b"] == 10
    q.add(req("b1", "b", n=10))
    order = [q.pop().client_id for _ in range(4)]
    assert sorted(order[:2]) == ["a", "b"]  # alternating, not b twice in a row first


def test_vtc_counts_output_tokens_and_picks_the_most_served_victim():
    q = registry.load("queue", "vtc")(input_weight=1.0, output_weight=2.0)
    a, b = req("a", "a"), req("b", "b")
    for r in (a, b):
        q.add(r)
        q.pop()
    for _ in range(5):
        q.on_token(a)
    # b arrived after a left an empty queue: lifted to a's 4, then charged its own 4
    assert q.counters == {"a": 14.0, "b": 8.0}
    assert q.select_victim([a, b]) is a
    q.prepend(a)  # a preempted request is not charged for its prompt twice
    q.pop()
    assert q.counters["a"] == 14.0
    q.check_integrity()


def test_vtc_improves_jain_index_in_results():
    def metrics(queue: str) -> dict:
        m = compute_metrics(run_workload(fake_engine(queue=queue), tenants(24, 8)))
        assert set(m["per_client"]) == {"heavy", "light"}
        return m

    def first_half_jain(m: dict) -> float:
        tl = m["service_timeline"]
        half = len(tl["t_s"]) // 2
        return jain_index(sum(v[:half]) for v in tl["clients"].values())

    fcfs, vtc = metrics("fcfs"), metrics("vtc")
    # both serve everything in the end; while both clients wait, VTC serves them at about the
    # same rate and FCFS serves the heavy client first
    assert vtc["jain_fairness_index"] > 0.95 > 0.8 > fcfs["jain_fairness_index"]
    assert vtc["max_service_difference"] < fcfs["max_service_difference"]
    assert first_half_jain(vtc) > 0.95 and first_half_jain(fcfs) < 0.6


# ---- edf ---------------------------------------------------------------------------------
def test_edf_orders_by_deadline_then_class_deadline():
    q = registry.load("queue", "edf")(class_deadlines_ms={"chat": 300})
    q.add(req("late", deadline_ms=1000.0))
    q.add(req("none"))
    q.add(req("soon", t=0.5, deadline_ms=100.0))
    q.add(req("chat", slo_class="chat"))
    assert [r.request_id for r in q] == ["chat", "soon", "late", "none"]
    assert q.peek().request_id == "chat"


@pytest.mark.parametrize("on_miss", ["drop", "demote", "keep"])
def test_edf_hopeless_requests_are_dropped_with_a_reason_or_demoted_never_lost(on_miss):
    # one seat, 20 ms per request: the 40 ms deadlines of the later ones cannot all be met
    work = [WorkloadRequest([3] * 8, 20, deadline_ms=40.0) for _ in range(6)]
    eng = fake_engine(max_num_seqs=1, queue="edf", queue_options={"on_miss": on_miss})
    run = run_workload(eng, work)
    assert len(run.requests) == 6 and all(r.is_finished for r in run.requests)
    dropped = [r for r in run.requests if r.status is RequestStatus.REJECTED]
    m = compute_metrics(run)
    if on_miss == "drop":
        assert len(dropped) >= 3
        assert all("deadline" in r.reject_reason for r in dropped)
        assert m["num_rejected"] == len(dropped)
    else:
        assert not dropped and m["completed"] == 6
    assert 0 < m["deadline_attainment"] < 1


def test_edf_demote_serves_requests_that_can_still_make_it_first():
    work = ([WorkloadRequest([3] * 8, 20, deadline_ms=5.0) for _ in range(3)]
            + [WorkloadRequest([3] * 8, 5, arrival_s=0.03, deadline_ms=200.0)])
    def ttft_of_last(on_miss: str) -> float:
        eng = fake_engine(max_num_seqs=1, queue="edf", queue_options={"on_miss": on_miss})
        run = run_workload(eng, work)
        r = run.requests[-1]
        return r.metrics.first_token_time - r.metrics.arrival_time

    assert ttft_of_last("demote") < ttft_of_last("keep")


# ---- rate limit ----------------------------------------------------------------------------
def test_rate_limit_rejects_a_clients_excess_with_a_reason():
    work = [WorkloadRequest([3] * 4, 2, arrival_s=0.01 * i, client_id="heavy")
            for i in range(10)]
    work += [WorkloadRequest([4] * 4, 2, arrival_s=0.05, client_id="light")]
    eng = fake_engine(queue="rate_limit", queue_options={"max_requests": 3, "window_s": 0.05})
    run = run_workload(eng, sorted(work, key=lambda w: w.arrival_s))
    rejected = [r for r in run.requests if r.status is RequestStatus.REJECTED]
    assert all(r.client_id == "heavy" and "rate_limit" in r.reject_reason for r in rejected)
    # 3 per 50 ms window over 100 ms of arrivals: at most 3 + 3 accepted (+ the window edge)
    assert 3 <= 10 - len(rejected) <= 7
    assert compute_metrics(run)["per_client"]["light"]["completed"] == 1


# ---- aging and priority preemption -------------------------------------------------------
@pytest.mark.parametrize("name", ["priority", "sjf"])
def test_aging_lets_a_long_waiter_pass_newer_better_requests(name):
    def first(aging_rate: float) -> str:
        q = registry.load("queue", name)(aging_rate=aging_rate)
        q.add(Request("old", [1] * 40, SamplingParams(max_tokens=4), arrival_time=0.0,
                      priority=3, expected_output_len=40))
        q.add(Request("new", [1] * 4, SamplingParams(max_tokens=4), arrival_time=10.0,
                      priority=0, expected_output_len=4))
        q.check_integrity()
        return q.peek().request_id

    assert first(0.0) == "new"
    assert first(10.0) == "old"


@pytest.mark.parametrize("queue,expect_preemption", [("priority", True), ("fcfs", False)])
def test_higher_priority_arrival_preempts_when_kv_is_short(queue, expect_preemption):
    # the low-priority request holds most of the pool when an urgent one arrives at 25 ms
    work = [WorkloadRequest([3] * 40, 40, priority=5),
            WorkloadRequest([4] * 30, 4, arrival_s=0.025, priority=0)]
    eng = fake_engine(max_num_seqs=4, num_kv_blocks=22, block_size=4, queue=queue)
    run = run_workload(eng, work)
    low, high = run.requests
    assert all(r.status is RequestStatus.FINISHED_LENGTH for r in run.requests)
    assert (low.metrics.num_preemptions > 0) is expect_preemption
    assert (high.metrics.finished_time < low.metrics.finished_time) is expect_preemption
    eng.check_integrity()


def test_priority_never_preempts_an_equal_or_better_request():
    q = registry.load("queue", "priority")(aging_rate=1.0)
    a, b = Request("a", [1], SamplingParams(), priority=1), Request("b", [1], SamplingParams(),
                                                                     priority=1, arrival_time=9)
    assert not q.outranks(a, b) and not q.outranks(b, a)
    assert registry.load("queue", "fcfs")().outranks(a, b) is False


# ---- metrics and report ------------------------------------------------------------------
def test_jain_index():
    assert jain_index([5, 5, 5]) == pytest.approx(1.0)
    assert jain_index([9, 0, 0]) == pytest.approx(1 / 3)
    assert jain_index([]) is None and jain_index([0, 0]) is None


@pytest.mark.parametrize("slo", [None, {"tpot": 100}, {"ttft": 1e6}])
def test_goodput_is_one_count_for_the_run_and_its_groups(slo):
    """A request is goodput when it met its own deadline (when it has one) and the run's SLO
    (when given): the run's request_goodput is its clients' (and its classes') summed."""
    rng = random.Random(1)
    work = [WorkloadRequest([3] * 6, 4, arrival_s=0.001 * i, client_id=rng.choice("ab"),
                            slo_class="chat" if i % 2 else "batch",
                            deadline_ms=5.0 if i % 2 else 1000.0) for i in range(12)]
    m = compute_metrics(run_workload(fake_engine(), work), slo=slo)
    assert 0 < m["per_slo_class"]["chat"]["deadline_attainment"] < 1.0  # deadlines missed
    for groups in ("per_client", "per_slo_class"):
        total = sum(g["request_goodput"] for g in m[groups].values())
        assert m["request_goodput"] == pytest.approx(total)
    assert m["request_goodput"] < m["request_throughput"]
    plain = [WorkloadRequest([3] * 6, 4, client_id=c) for c in "abab"]
    m = compute_metrics(run_workload(fake_engine(), plain), slo=slo)
    if slo is None:  # nothing to meet: no goodput, in the run or its groups
        assert m["request_goodput"] is None
        assert {g["request_goodput"] for g in m["per_client"].values()} == {None}
    else:
        assert m["request_goodput"] == pytest.approx(sum(
            g["request_goodput"] for g in m["per_client"].values()))


def test_per_client_and_per_class_metrics_reach_results_and_report(tmp_path):
    rng = random.Random(0)
    work = [WorkloadRequest([3] * 6, 4, arrival_s=0.001 * i, client_id=rng.choice("ab"),
                            slo_class="chat" if i % 2 else "batch",
                            deadline_ms=5.0 if i % 2 else 1000.0) for i in range(12)]
    run = run_workload(fake_engine(queue="vtc"), work)
    m = compute_metrics(run, slo={"tpot": 100})
    assert set(m["per_slo_class"]) == {"chat", "batch"}
    assert sum(g["num_requests"] for g in m["per_client"].values()) == 12
    assert m["per_slo_class"]["batch"]["deadline_attainment"] == 1.0
    assert m["per_slo_class"]["chat"]["deadline_attainment"] < 1.0
    assert m["per_slo_class"]["chat"]["request_goodput"] < m["per_slo_class"]["batch"][
        "request_goodput"]
    tl = m["service_timeline"]
    total = sum(sum(v) for v in tl["clients"].values()) * tl["t_s"][0]
    assert total == pytest.approx(sum(g["service"] for g in m["per_client"].values()))
    table = format_table(m)
    assert "Jain's fairness index" in table and "a: done / TTFT mean" in table
    write_results(tmp_path / "run", m, {"queue": {"name": "vtc"}})
    doc = json.loads((tmp_path / "run" / "results.json").read_text())
    assert doc["per_client"].keys() == m["per_client"].keys()
    paths, _ = write_report(find_runs(tmp_path), tmp_path)
    text = paths[0].read_text()
    assert "## Per client" in text and "## Per SLO class" in text and "| chat |" in text


# ---- greedy parity on the real executor ------------------------------------------------------
@pytest.mark.parametrize("queue,options", [("vtc", {}), ("edf", {"on_miss": "demote"}),
                                           ("rate_limit", {"max_requests": 100}),
                                           ("priority", {"aging_rate": 1.0})])
def test_new_queues_keep_greedy_parity(llama_dir, hf_reference, queue, options):
    rng = random.Random(1)
    ps = [[rng.randrange(2, 400) for _ in range(rng.randint(3, 30))] for _ in range(6)]
    eng = Engine(EngineConfig(model=llama_dir, queue=queue, queue_options=options,
                              max_model_len=64, max_num_batched_tokens=64, num_kv_blocks=14,
                              block_size=4, max_num_seqs=4))
    reqs = [eng.add_request(p, SamplingParams(temperature=0.0, max_tokens=10),
                            client_id=f"c{i % 2}", priority=i % 3, deadline_ms=50.0 * (i + 1))
            for i, p in enumerate(ps)]
    eng.run_until_done(check=True)
    for p, r in zip(ps, reqs, strict=True):
        assert r.output_token_ids == hf_reference(llama_dir, p, 10), r.request_id


def test_edf_never_drops_a_preempted_request_that_has_output():
    q = registry.load("queue", "edf")(on_miss="drop")
    started = req("started", deadline_ms=1.0)
    started.output_token_ids.append(7)
    q.prepend(started)
    q.add(req("fresh", deadline_ms=1.0))
    assert q.peek() is started
    assert q.expire(now=10.0) == []  # the started one heads the queue: nothing given up yet
    q.pop()
    assert [d.request.request_id for d in q.expire(now=10.0)] == ["fresh"]
    q.check_integrity()
