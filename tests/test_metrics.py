"""Metric definitions (vLLM's `bench serve`) against hand-computed values on a made-up timeline."""

from __future__ import annotations

import numpy as np
import pytest

from schedlab.request import Request, RequestStatus, SamplingParams
from schedlab.runs.metrics import compute_metrics, parse_slo
from schedlab.runs.run_result import RunResult
from schedlab.runs.token_reads import itls, token_times
from schedlab.stats import StepStats


def _request(rid: str, prompt_len: int, arrival: float, scheduled: float | None,
             token_times: list[float], status: RequestStatus = RequestStatus.FINISHED_LENGTH,
             reason: str | None = None) -> Request:
    r = Request(rid, list(range(2, 2 + prompt_len)), SamplingParams(max_tokens=8),
                arrival_time=arrival)
    r.status = status
    r.finish_reason = status.value
    r.reject_reason = reason
    r.output_token_ids = [7] * len(token_times)
    m = r.metrics
    m.first_scheduled_time = scheduled
    m.token_times = list(token_times)
    m.first_token_time = token_times[0] if token_times else None
    m.finished_time = token_times[-1] if token_times else arrival
    return r


def _step(i: int, seqs: int, reserved: int, used: int, blocks: int) -> StepStats:
    return StepStats(step=i, time=float(i), step_time=0.01, num_running=seqs, num_waiting=0,
                     num_scheduled_tokens=seqs * 2, num_prefill_tokens=0, num_decode_tokens=seqs,
                     num_scheduled_seqs=seqs, num_preempted=0, kv_used_blocks=blocks,
                     kv_free_blocks=10 - blocks, kv_cached_blocks=0,
                     kv_reserved_tokens=reserved, kv_used_tokens=used)


@pytest.fixture
def run() -> RunResult:
    reqs = [
        # TTFT 0.5, E2EL 1.0, TPOT 0.5 / 2 = 0.25, ITLs 0.2 and 0.3, queued 0.1
        _request("a", 4, 0.0, 0.1, [0.5, 0.7, 1.0]),
        # one output token: TTFT 0.2 = E2EL, no TPOT, no ITL
        _request("b", 2, 1.0, 1.0, [1.2]),
        # TTFT 0.3, E2EL 0.4, TPOT 0.1, ITL 0.1, queued 0.1
        _request("c", 3, 0.5, 0.6, [0.8, 0.9]),
        # rejected: counted, never timed
        _request("d", 100, 0.2, None, [], RequestStatus.REJECTED, "prompt too long"),
    ]
    steps = [_step(1, 3, reserved=16, used=12, blocks=4), _step(2, 1, reserved=8, used=8,
                                                                blocks=2)]
    return RunResult(requests=reqs, duration_s=2.0, step_stats=steps, num_preemptions=1,
                     prefix_hit_rate=0.25, num_kv_blocks=10, block_size=4)


def test_counts_and_throughput(run):
    m = compute_metrics(run)
    assert m["completed"] == 3
    assert m["num_rejected"] == 1
    assert m["total_input_tokens"] == 4 + 2 + 3
    assert m["total_output_tokens"] == 3 + 1 + 2
    assert m["duration"] == 2.0
    assert m["request_throughput"] == pytest.approx(1.5)
    assert m["output_throughput"] == pytest.approx(3.0)
    assert m["total_token_throughput"] == pytest.approx(7.5)
    assert m["request_goodput"] is None  # no SLO given
    assert m["errors"] == ["prompt too long"]


def test_latencies_follow_vllm_definitions(run):
    m = compute_metrics(run, percentiles=(50, 99))
    assert m["mean_ttft_ms"] == pytest.approx(1000 / 3)
    assert m["median_ttft_ms"] == pytest.approx(300)
    assert m["p99_ttft_ms"] == pytest.approx(300 + 0.98 * 200)
    # TPOT only over requests with more than one output token
    assert m["mean_tpot_ms"] == pytest.approx(175)
    assert m["median_tpot_ms"] == pytest.approx(175)
    assert m["std_tpot_ms"] == pytest.approx(75)
    # ITL pooled over every gap: 200, 300, 100
    assert m["mean_itl_ms"] == pytest.approx(200)
    assert m["p99_itl_ms"] == pytest.approx(200 + 0.98 * 100)
    assert m["p50_itl_ms"] == pytest.approx(200)
    assert m["mean_e2el_ms"] == pytest.approx(1600 / 3)
    assert m["median_e2el_ms"] == pytest.approx(400)
    assert m["mean_queue_ms"] == pytest.approx(200 / 3)
    assert "p90_ttft_ms" not in m


def test_per_request_arrays(run):
    m = compute_metrics(run)
    assert m["ttfts"] == pytest.approx([0.5, 0.2, 0.3])
    assert m["e2els"] == pytest.approx([1.0, 0.2, 0.4])
    assert m["tpots"][0] == pytest.approx(0.25) and m["tpots"][1] is None
    assert [len(x) for x in m["itls"]] == [2, 0, 1]
    assert m["input_lens"] == [4, 2, 3] and m["output_lens"] == [3, 1, 2]


@pytest.mark.parametrize("slo,good", [
    ({"ttft": 400}, 2),  # a (500 ms) misses
    ({"tpot": 200}, 2),  # a (250 ms) misses; b's one token counts as TPOT 0
    ({"ttft": 400, "tpot": 50}, 1),  # only b
    ({"e2el": 300}, 1),
    ({"ttft": 10_000, "tpot": 10_000, "e2el": 10_000}, 3),  # the rejected one never counts
])
def test_goodput(run, slo, good):
    m = compute_metrics(run, slo=slo)
    assert m["request_goodput"] == pytest.approx(good / 2.0)


def test_engine_metrics(run):
    m = compute_metrics(run)
    assert m["num_preemptions"] == 1
    assert m["prefix_cache_hit_rate"] == 0.25
    assert m["peak_kv_usage_pct"] == pytest.approx(40.0)
    assert m["kv_waste_pct"] == pytest.approx(100 * (1 - 20 / 24))
    assert m["mean_batch_size"] == pytest.approx(2.0)
    assert m["mean_tokens_per_step"] == pytest.approx(4.0)
    # requests in flight, arrival to end: a and c overlap, b arrives as a ends
    assert m["max_concurrent_requests"] == 2
    assert m["max_num_running"] == 3  # the running seats of the busiest step


def test_completed_rejected_and_failed_are_disjoint(run):
    aborted = _request("e", 3, 0.1, 0.2, [0.4], RequestStatus.FINISHED_ABORTED)
    run.requests.append(aborted)
    m = compute_metrics(run)
    assert (m["completed"], m["num_rejected"], m["num_failed"]) == (3, 1, 1)
    assert m["completed"] + m["num_rejected"] + m["num_failed"] == len(run.requests)


def test_all_rejected_reports_zeros():
    r = _request("x", 5, 0.0, None, [], RequestStatus.REJECTED, "too long")
    m = compute_metrics(RunResult([r], 0.0, [], 0, 0.0), slo={"ttft": 1})
    assert m["completed"] == 0 and m["num_rejected"] == 1
    assert m["mean_ttft_ms"] == 0.0 and m["request_throughput"] == 0.0


def test_parse_slo():
    assert parse_slo("ttft=200,tpot=50") == {"ttft": 200.0, "tpot": 50.0}
    assert parse_slo("ttft:200 e2el:1500") == {"ttft": 200.0, "e2el": 1500.0}
    with pytest.raises(ValueError, match="accepted: ttft, tpot, e2el"):
        parse_slo("latency=3")
    with pytest.raises(ValueError, match="positive"):
        parse_slo("ttft=0")
    with pytest.raises(ValueError, match="key=milliseconds"):
        parse_slo("ttft")


def test_token_times_filed_in_bulk_read_as_filed_one_by_one(monkeypatch):
    """A streaming run files each request's token times into a pending list moved into the
    run's buffer in bulk: the metrics read from it equal those of every request read at
    once, whether the move happened mid-run, at the end, or several times."""
    import random

    from schedlab.runs import request_stats
    from schedlab.runs.request_stats import RequestStats

    rnd = random.Random(3)
    reqs = []
    for k in range(60):
        t0 = rnd.random() * 10
        times = sorted(t0 + rnd.random() for _ in range(rnd.randint(1, 40)))
        reqs.append(_request(str(k), rnd.randint(1, 9), t0, t0, times))
    full = compute_metrics(RunResult(requests=reqs, duration_s=12.0, step_stats=[],
                                     num_preemptions=0, prefix_hit_rate=0.0))
    for pending in (1, 7, 1 << 16):
        monkeypatch.setattr(request_stats, "_PENDING_TIMES", pending)
        stats = RequestStats(len(reqs), 0.0)
        for k in rnd.sample(range(len(reqs)), len(reqs)):  # in the order they end
            stats.add(k, reqs[k])
        got = compute_metrics(RunResult(requests=[], duration_s=12.0, step_stats=[],
                                        num_preemptions=0, prefix_hit_rate=0.0, stats=stats))
        assert got == {k: v for k, v in full.items() if k in got}
        done = stats.completed
        assert itls(stats, done) == full["itls"]


@pytest.mark.parametrize("chunk_tokens", [1, 5, 37, 1 << 20])
def test_itls_are_each_requests_own_gaps_whatever_the_chunks(monkeypatch, chunk_tokens):
    """results.json's `itls`: request by request (in completion order), the gaps between
    that request's own token times, none across two requests, for requests of 1, 2 and
    many tokens and however the token times are read in chunks; the same floats as
    `np.diff` of each request's times."""
    import random

    from schedlab.runs import token_reads
    from schedlab.runs.request_stats import RequestStats

    monkeypatch.setattr(token_reads, "ITL_CHUNK_TOKENS", chunk_tokens)
    rnd = random.Random(5)
    reqs = []
    for k in range(40):
        t0 = rnd.random() * 10
        times = sorted(t0 + rnd.random() for _ in range(rnd.choice([1, 1, 2, 3, 17])))
        reqs.append(_request(str(k), 3, t0, t0, times))
    order = rnd.sample(range(len(reqs)), len(reqs))
    stats = RequestStats(len(reqs), 0.0)
    for k in order:
        stats.add(k, reqs[k])
    got = itls(stats, stats.completed)
    want = [np.diff(reqs[k].metrics.token_times).tolist() for k in sorted(order)]
    assert got == want
    assert [len(g) for g in got] == [len(reqs[k].metrics.token_times) - 1 for k in sorted(order)]


def test_request_rows_stored_in_bulk_read_as_filed_one_by_one(monkeypatch):
    """Each filed request's numbers wait in a row until a batch is stored a column at a
    time: every column reads as if each request were stored when filed, a read mid-run
    included (rejected and unfinished requests, clients, classes and deadlines too)."""
    from schedlab.runs import request_stats
    from schedlab.runs.request_stats import (
        COMPLETED,
        FAILED,
        NO_GROUP,
        OPEN,
        REJECTED,
        RequestStats,
    )

    reqs = [_request(str(k), 3 + k % 4, 0.5 * k, 0.5 * k + 0.1,
                     [0.5 * k + 0.2 + 0.01 * j for j in range(1 + k % 5)]) for k in range(12)]
    reqs[3].status, reqs[3].reject_reason = RequestStatus.REJECTED, "too long"
    reqs[3].metrics.token_times = []
    reqs[5].status, reqs[5].finish_reason = RequestStatus.FINISHED_ABORTED, "abort"
    reqs[7].client_id, reqs[7].slo_class, reqs[7].deadline_ms = "acme", "chat", 250
    reqs[8].client_id = "zeta"
    for rows in (1, 5, 4096):
        monkeypatch.setattr(request_stats, "_PENDING_ROWS", rows)
        stats = RequestStats(len(reqs) + 1, 0.0)
        for k in range(6):
            stats.add(k, reqs[k])
        assert stats.status[:7].tolist() == [COMPLETED] * 3 + [REJECTED, COMPLETED, FAILED,
                                                               OPEN]
        for k in range(6, len(reqs)):
            stats.add(k, reqs[k])
        r = reqs[7]
        assert stats.ttft[7] == r.metrics.first_token_time - r.metrics.arrival_time
        assert stats.e2el[7] == r.metrics.finished_time - r.metrics.arrival_time
        assert stats.queue[7] == r.metrics.first_scheduled_time - r.metrics.arrival_time
        assert stats.arrival.tolist()[:12] == [x.metrics.arrival_time for x in reqs]
        assert stats.num_input[7] == len(r.prompt_token_ids)
        assert stats.num_output.tolist() == [len(x.output_token_ids) if x.metrics.token_times
                                             else 0 for x in reqs] + [0]
        assert stats.ttft[3] == stats.e2el[3] == stats.num_tokens[3] == 0
        assert np.isnan(stats.finished[12]) and stats.finished[3] == reqs[3].metrics.finished_time
        assert stats.client.tolist() == [NO_GROUP] * 7 + [0, 1] + [NO_GROUP] * 4
        assert stats.slo_class.tolist() == [NO_GROUP] * 7 + [0] + [NO_GROUP] * 5
        assert stats.deadline_ms[7] == 250.0 and np.isnan(stats.deadline_ms).sum() == 12
        assert stats.errors == {3: "too long", 5: "abort"}
        assert token_times(stats, np.array([7, 2])).tolist() == (
            reqs[7].metrics.token_times + reqs[2].metrics.token_times)


def test_steps_csv_reads_as_the_csv_module_writes_it(tmp_path, monkeypatch):
    """steps.csv, written row by row as one format, is byte for byte what `csv.writer`
    writes of the same records (floats by repr, ints by str, \\r\\n line ends)."""
    import csv
    import dataclasses
    from operator import attrgetter

    from schedlab.cli import steps_csv

    steps = [_step(i, i % 5, reserved=16 * i, used=12 * i, blocks=i % 9) for i in range(1, 40)]
    for i, s in enumerate(steps):
        s.time, s.step_time, s.framework_time = i / 7, 1e-5 / (i + 1), 2.5e-17 * i
    # a plugin executor's or clock's numpy floats and a None, in one chunk of the file
    steps[20].step_time, steps[21].time = np.float64(0.1), np.float32(0.25)
    steps[22].forward_time = None
    names = [f.name for f in dataclasses.fields(StepStats)]
    with open(tmp_path / "ref.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(names)
        w.writerows(map(attrgetter(*names), steps))
    monkeypatch.setattr(steps_csv, "ROWS_PER_WRITE", 8)  # several writes
    out = steps_csv.write_steps_csv(tmp_path / "steps.csv", steps)
    assert out.read_bytes() == (tmp_path / "ref.csv").read_bytes()
    steps_csv.write_steps_csv(tmp_path / "empty.csv", [])
    assert (tmp_path / "empty.csv").read_text().splitlines() == [",".join(names)]


def test_percentile_keys_equal_one_percentile_call_each():
    """The percentiles of a series, taken in one call, are each the value its own
    `np.percentile` call gives (bit for bit)."""
    import numpy as np

    from schedlab.runs.groups import percentile_keys

    rng = np.random.default_rng(4)
    for n in (1, 2, 7, 10_001):
        a = rng.random(n) * 1000.0
        ps = (50, 90, 95, 99, 99.9, 0, 100)
        got = percentile_keys("x", a, ps)
        assert list(got.values()) == [float(np.percentile(a, p)) for p in ps]
        assert list(got) == [f"p{w}_x_ms" for w in ("50", "90", "95", "99", "99.9", "0", "100")]
    assert percentile_keys("x", np.ones(3), ()) == {}


@pytest.mark.parametrize("far", [5.0, 1e12, 1e15])
def test_peak_output_rate_counts_whole_seconds_however_far_apart(far, monkeypatch):
    """`max_output_tokens_per_s`: the most tokens in one whole second, the same whether the
    run's tokens span seconds or 1e15 s (a near-zero arrival rate), chunks or not."""
    from schedlab.runs import token_reads

    reqs = [_request("a", 4, 0.0, 0.0, [0.1, 0.5, 0.9, 1.1]),  # 3 in second 0
            _request("b", 4, 0.2, 0.2, [0.95, 1.5]),  # second 0 has 4; second 1 has 2
            _request("c", 4, far, far, [far + 0.1, far + 0.2, far + 0.3])]
    run = RunResult(requests=reqs, duration_s=far + 1.0, step_stats=[], num_preemptions=0,
                    prefix_hit_rate=0.0)
    assert compute_metrics(run)["max_output_tokens_per_s"] == 4.0
    monkeypatch.setattr(token_reads, "CHUNK_TOKENS", 1)  # one request a chunk
    assert compute_metrics(run)["max_output_tokens_per_s"] == 4.0
    run.requests[2].metrics.token_times = [1.2, 1.3, 1.4]  # now second 1 has 5
    assert compute_metrics(run)["max_output_tokens_per_s"] == 5.0
