"""`schedlab compare` and `schedlab.runs.compare` on synthetic sweeps whose true differences
are known: the test writes results.json files where a candidate differs from the baseline by a
chosen effect on top of a per-seed workload effect shared by both sides, plus run noise."""

from __future__ import annotations

import csv

import numpy as np
import pytest

from schedlab.cli import main as schedlab
from schedlab.runs.bootstrap import bootstrap_ci, min_pairs
from schedlab.runs.compare import CompareError, compare_runs, load_runs
from schedlab.runs.metric_diff import NOT_SIGNIFICANT, SIGNIFICANT, TOO_FEW, diff_metric
from schedlab.runs.metric_names import metric_value
from schedlab.runs.paired import min_pairs_for, paired_test, sign_test, t_test, wilcoxon_test
from schedlab.runs.results import write_results


def write_sweep(root, seeds, effect=10.0, noise=1.0, rates=(2, 8), order=None, extra=None,
                variant=False):
    """A scheduler.name x workload.arrival.rate x seed sweep.

    Per seed, a workload effect shared by both schedulers (spread 30, far larger than
    `effect`) sets the level; `continuous` adds `effect` to output_throughput and nothing to
    mean_ttft_ms; every value gets independent noise of sd `noise`.
    """
    rng = np.random.default_rng(123)
    level = {s: 30.0 * rng.standard_normal() for s in seeds}
    i = 0
    for sched in ("static", "continuous"):
        for rate in rates:
            sched_seeds = list(order(seeds) if order and sched == "continuous" else seeds)
            if extra is not None and sched == "continuous":
                sched_seeds.append(extra)
            for s in sched_seeds:
                w = level.get(s, 0.0)
                metrics = {
                    "output_throughput": 500.0 + w + (effect if sched == "continuous" else 0)
                    + noise * rng.standard_normal(),
                    "mean_ttft_ms": 100.0 + w + noise * rng.standard_normal(),
                    "completed": 10, "output_lens": [1, 2]}
                config = {"seed": s, "engine": {"seed": s, "max_num_seqs": 4},
                          "scheduler": {"name": sched}, "workload": {"arrival": {"rate": rate}},
                          "output_dir": str(root / str(i))}
                if variant:
                    config["exp"] = {"sched": f"v_{sched}"}
                    config["engine"]["max_num_batched_tokens"] = 512 if sched == "static" else 64
                write_results(root / str(i), metrics, config)
                i += 1
    return root


def by_key(report):
    return {(c.context.get("workload.arrival.rate"), m.metric): (c, m)
            for c in report.comparisons for m in c.metrics}


def test_a_clear_difference_is_significant_and_noise_is_not(tmp_path):
    runs = load_runs(write_sweep(tmp_path, seeds=range(10)))
    report = compare_runs(runs, by="scheduler.name", baseline="static",
                          metrics=["output_throughput", "mean_ttft_ms"])
    assert report.baseline == "static" and len(report.comparisons) == 2
    for rate in (2, 8):
        c, thr = by_key(report)[(rate, "output_throughput")]
        assert c.candidate == "continuous" and c.seeds == tuple(range(10))
        assert thr.verdict == SIGNIFICANT and thr.significant
        assert thr.ci.lo > 0 and thr.ci.covers(10.0)  # the true effect
        assert 8 < thr.diff < 12
        assert thr.candidate - thr.baseline == pytest.approx(thr.diff)  # all means under t
        assert thr.ratio_ci.lo > 1.0
        _, ttft = by_key(report)[(rate, "mean_ttft_ms")]
        assert ttft.verdict == NOT_SIGNIFICANT and ttft.ci.covers(0.0)


def test_pairs_are_formed_by_seed_not_by_position(tmp_path):
    """A constant shift under a large per-seed spread: paired, every difference is the shift.

    The candidate's runs are written in reversed seed order and with one seed the baseline
    lacks; a pairing by position would mix seeds and give a wide interval around the shift.
    """
    root = write_sweep(tmp_path, seeds=range(8), effect=5.0, noise=0.0, rates=(4,),
                       order=lambda s: list(reversed(list(s))), extra=99)
    report = compare_runs(load_runs(root), by="scheduler.name", baseline="static",
                          metrics=["output_throughput"])
    (c,) = report.comparisons
    assert c.seeds == tuple(range(8)) and c.unpaired == (99,)
    (m,) = c.metrics
    assert m.n == 8 and m.verdict == SIGNIFICANT
    assert m.ci.lo == pytest.approx(5.0) and m.ci.hi == pytest.approx(5.0)


def test_three_seeds_are_too_few_for_a_95_percent_bootstrap_verdict(tmp_path):
    runs = load_runs(write_sweep(tmp_path, seeds=range(3), rates=(4,)))
    m = compare_runs(runs, by="scheduler.name", baseline="static", method="percentile",
                     metrics=["output_throughput"]).comparisons[0].metrics[0]
    assert m.verdict == TOO_FEW and m.ci is not None and m.p_value is None
    loose = compare_runs(runs, by="scheduler.name", baseline="static", method="percentile",
                         metrics=["output_throughput"], needed=2).comparisons[0].metrics[0]
    assert loose.verdict == SIGNIFICANT
    assert (min_pairs(0.95), min_pairs(0.9), min_pairs(0.99)) == (6, 5, 8)


def test_a_variant_key_moves_its_parts_with_it(tmp_path):
    """`--by exp.sched` where the variant also sets scheduler and token budget: still paired."""
    runs = load_runs(write_sweep(tmp_path, seeds=range(6), rates=(4,), variant=True))
    report = compare_runs(runs, by="exp.sched", metrics=["output_throughput"])
    assert report.baseline == "v_continuous"  # default: the first value in order
    assert set(report.implied) == {"scheduler.name", "engine.max_num_batched_tokens"}
    (c,) = report.comparisons
    assert c.candidate == "v_static" and c.metrics[0].diff < 0


@pytest.mark.parametrize("method", ["percentile", "bca"])
def test_bootstrap_interval_covers_the_true_mean_about_as_often_as_it_says(method):
    rng = np.random.default_rng(0)
    hits = sum(bootstrap_ci(rng.exponential(1.0, size=40), confidence=0.9, resamples=1000,
                            method=method, seed=i).covers(1.0) for i in range(200))
    assert 0.8 <= hits / 200 <= 0.97


def test_bootstrap_is_reproducible_from_its_seed():
    x = np.random.default_rng(1).normal(size=12)
    assert bootstrap_ci(x, seed=3) == bootstrap_ci(x, seed=3)
    assert bootstrap_ci(x, seed=3) != bootstrap_ci(x, seed=4)
    wide, narrow = bootstrap_ci(x, confidence=0.99), bootstrap_ci(x, confidence=0.5)
    assert wide.lo < narrow.lo < narrow.hi < wide.hi


def test_cli_prints_and_writes_the_table(tmp_path, capsys):
    root = write_sweep(tmp_path / "sweep", seeds=range(8))
    code = schedlab(["compare", str(root), "--by", "scheduler.name", "--baseline", "static",
                     "--metrics", "output_throughput,mean_ttft_ms", "--confidence", "0.9",
                     "--out", str(tmp_path / "out")])
    assert code == 0
    printed = capsys.readouterr().out
    assert "# schedlab compare: scheduler.name (baseline static)" in printed
    header = next(line for line in printed.splitlines() if line.startswith("| "))
    assert header.startswith("| workload.arrival.rate | scheduler.name | metric | n |")
    assert "| baseline (mean) | candidate (mean) | difference (mean) [90% CI] |" in header
    assert "ratio (geometric mean) [90% CI] | p | verdict |" in header
    body = [line for line in printed.splitlines() if line.startswith("| ") and "---" not in line]
    assert len(body) == 1 + 2 * 2  # header + 2 rates x 2 metrics
    assert sum(line.endswith("| significant |") for line in body) == 2
    assert sum(line.endswith("| not significant |") for line in body) == 2
    assert (tmp_path / "out" / "compare_scheduler.name.md").read_text().strip() in printed
    with (tmp_path / "out" / "compare_scheduler.name.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 4
    thr = [r for r in rows if r["metric"] == "output_throughput"]
    assert all(float(r["ci_lo"]) > 0 and r["verdict"] == "significant" for r in thr)
    assert {r["seeds"] for r in rows} == {"0 1 2 3 4 5 6 7"}


def test_cli_output_is_the_same_on_a_rerun(tmp_path, capsys):
    root = write_sweep(tmp_path, seeds=range(6), rates=(4,))
    outs = []
    for _ in range(2):
        assert schedlab(["compare", str(root), "--by", "scheduler.name"]) == 0
        outs.append(capsys.readouterr().out)
    assert outs[0] == outs[1]


def _bad(tmp_path, capsys, argv):
    code = schedlab(["compare", *map(str, argv)])
    err = capsys.readouterr().err
    assert code == 2
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    return err


def test_cli_refuses_bad_input_in_one_sentence(tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "no readable results.json" in _bad(tmp_path, capsys, [empty, "--by", "x"])
    root = write_sweep(tmp_path / "sweep", seeds=range(6), rates=(4,))
    err = _bad(tmp_path, capsys, [root, "--by", "engine.max_num_seqs"])
    assert "not a swept parameter" in err and "scheduler.name" in err
    err = _bad(tmp_path, capsys, [root, "--by", "scheduler.name", "--baseline", "nope"])
    assert "continuous, static" in err
    err = _bad(tmp_path, capsys, [root, "--by", "scheduler.name", "--metrics", "nope"])
    assert "output_throughput" in err
    assert "between 0 and 1" in _bad(tmp_path, capsys, [root, "--by", "scheduler.name",
                                                          "--confidence", "95"])
    assert "at least 1 pair" in _bad(tmp_path, capsys, [root, "--by", "scheduler.name",
                                                         "--min-pairs", "-1"])


def test_cli_refuses_an_out_that_is_not_a_directory_in_one_sentence(tmp_path, capsys):
    root = write_sweep(tmp_path / "sweep", seeds=range(3), rates=(4,))
    taken = tmp_path / "existing_file.jsonl"
    taken.write_text("{}\n")
    err = _bad(tmp_path, capsys, [root, "--by", "scheduler.name", "--out", taken])
    assert f"--out {taken} is a file; --out names a directory" in err
    err = _bad(tmp_path, capsys, [root, "--by", "scheduler.name", "--out", taken / "sub"])
    assert f"--out {taken / 'sub'}: cannot create or write into this directory" in err
    assert taken.read_text() == "{}\n"


def test_runs_without_seeds_to_pair_are_refused(tmp_path, capsys):
    one_seed = write_sweep(tmp_path / "one", seeds=[0], rates=(4,))
    err = _bad(tmp_path, capsys, [one_seed, "--by", "scheduler.name"])
    assert "every run has seed 0" in err
    unseeded = tmp_path / "unseeded"
    for i, sched in enumerate(("static", "continuous")):
        write_results(unseeded / str(i), {"output_throughput": 1.0},
                      {"scheduler": {"name": sched}})
    assert "no seed" in _bad(tmp_path, capsys, [unseeded, "--by", "scheduler.name"])
    disjoint = tmp_path / "disjoint"
    for i, (sched, seed) in enumerate([("static", 0), ("static", 1), ("continuous", 2),
                                       ("continuous", 3)]):
        write_results(disjoint / str(i), {"output_throughput": 1.0},
                      {"seed": seed, "scheduler": {"name": sched}})
    assert "no pairs" in _bad(tmp_path, capsys, [disjoint, "--by", "scheduler.name"])
    with pytest.raises(CompareError):
        compare_runs(load_runs(disjoint), by="scheduler.name")


def test_experiment_tables_publish_a_bootstrap_interval_of_the_median(tmp_path):
    """summarize.py over 8 seeds: each cell's interval lies inside min-max and is narrower."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))
    import summarize
    from summaries.common import paired_ratio

    for i, (kv, seed) in enumerate((k, s) for k in ("contiguous", "paged") for s in range(8)):
        thr = (200.0 if kv == "paged" else 100.0) + 10.0 * ((seed * 7) % 8)  # spread 0..70
        metrics = {"output_throughput": thr, "num_kv_blocks": 64, "mean_kv_used_tokens": 200.0,
                   "mean_kv_reserved_tokens": 900.0, "kv_waste_pct": 50.0,
                   "max_num_running": 4, "mean_num_running": 2.0}
        write_results(tmp_path / "sweep" / str(i), metrics,
                      {"seed": seed, "exp": {"name": "paged_vs_contiguous", "mode": "sim",
                                             "kv": kv}, "engine": {"block_size": 16}})
    summarize.summarize(tmp_path / "sweep")
    md = (tmp_path / "sweep" / "paged_vs_contiguous_sim.md").read_text()
    assert "percentile bootstrap interval of the median" in md
    with (tmp_path / "sweep" / "paged_vs_contiguous_sim.csv").open() as f:
        row = {r["exp.kv"]: r for r in csv.DictReader(f)}["contiguous"]
    lo, hi = float(row["output_throughput_ci_lo"]), float(row["output_throughput_ci_hi"])
    assert float(row["output_throughput_min"]) < lo <= float(row["output_throughput"]) <= hi
    assert hi < float(row["output_throughput_max"])
    assert f"[{lo:.1f}, {hi:.1f}]" in md
    runs = summarize.find_runs(tmp_path / "sweep")
    _, rows = summarize.group_runs(runs, summarize.SPECS["paged_vs_contiguous"])
    cont, paged = rows
    assert paired_ratio(paged, cont, "output_throughput").startswith("1.")
    assert "(not significant)" in paired_ratio(cont, cont, "output_throughput")


# ---- grouped metrics and the small-sample methods -------------------------------------------
def write_client_sweep(root, seeds, light_effect=-50.0, noise=5.0):
    """queue.name fcfs vs wfq x seed, each run with a heavy client, light0..2 and two SLO
    classes; wfq moves the light clients' mean TTFT by `light_effect` (ms) and nothing else."""
    rng = np.random.default_rng(7)
    i = 0
    for queue in ("fcfs", "wfq"):
        for s in seeds:
            level = 100.0 + 20.0 * ((s * 5) % 7)
            shift = light_effect if queue == "wfq" else 0.0
            clients = {"heavy": {"mean_ttft_ms": level + noise * rng.standard_normal(),
                                 "completed": 40}}
            for k in range(3):
                clients[f"light{k}"] = {"mean_ttft_ms": level + 10 * k + shift
                                        + noise * rng.standard_normal(), "completed": 4}
            metrics = {"mean_ttft_ms": level, "per_client": clients,
                       "per_slo_class": {"chat": {"p99_ttft_ms": level + shift},
                                         "batch": {"p99_ttft_ms": level}}}
            write_results(root / str(i), metrics, {"seed": s, "queue": {"name": queue}})
            i += 1
    return root


def test_group_metrics_one_client_a_glob_mean_and_an_slo_class(tmp_path):
    root = write_client_sweep(tmp_path, seeds=range(5))
    runs = load_runs(root)
    report = compare_runs(runs, by="queue.name", baseline="fcfs",
                          metrics=["per_client.light*.mean_ttft_ms",
                                   "per_client.heavy.mean_ttft_ms",
                                   "per_client.light1.mean_ttft_ms",
                                   "per_slo_class.chat.p99_ttft_ms",
                                   "per_slo_class.batch.p99_ttft_ms"])
    light, heavy, light1, chat, batch = report.comparisons[0].metrics
    fcfs0 = next(r for r in runs if r.config["queue.name"] == "fcfs" and r.config["seed"] == 0)
    lights = [fcfs0.metrics["per_client"][f"light{k}"]["mean_ttft_ms"] for k in range(3)]
    assert metric_value(fcfs0.metrics, "per_client.light*.mean_ttft_ms") == pytest.approx(
        sum(lights) / 3)
    assert light.n == 5 and light.verdict == SIGNIFICANT and light.ci.covers(-50.0)
    assert light1.verdict == SIGNIFICANT and light.ratio < 1.0
    assert heavy.verdict == NOT_SIGNIFICANT
    assert chat.diff == pytest.approx(-50.0) and chat.verdict == SIGNIFICANT
    assert batch.diff == 0.0 and batch.verdict == NOT_SIGNIFICANT


def test_a_group_metric_that_matches_nothing_lists_what_there_is(tmp_path, capsys):
    root = write_client_sweep(tmp_path / "sweep", seeds=range(3))
    err = _bad(tmp_path, capsys, [root, "--by", "queue.name", "--metrics",
                                  "per_client.lite*.mean_ttft_ms"])
    assert "per_client.{heavy,light0,light1,light2}.{mean_ttft_ms,completed}" in err
    err = _bad(tmp_path, capsys, [root, "--by", "queue.name", "--metrics", "ttft"])
    assert "mean_ttft_ms" in err and "per_slo_class.{chat,batch}.{p99_ttft_ms}" in err


def test_cli_takes_a_glob_metric_and_labels_every_number(tmp_path, capsys):
    root = write_client_sweep(tmp_path / "sweep", seeds=range(5))
    assert schedlab(["compare", str(root), "--by", "queue.name", "--baseline", "fcfs",
                     "--metrics", "per_client.light*.mean_ttft_ms"]) == 0
    printed = capsys.readouterr().out
    (row,) = [line for line in printed.splitlines()
              if line.startswith("| wfq | per_client.light*.mean_ttft_ms | 5 |")]
    assert row.endswith("| significant |") and "| too few seeds |" not in printed
    assert "paired t interval" in printed and "assumes the differences roughly normal" in printed


def test_paired_tests_match_their_textbook_values():
    d = np.arange(1.0, 6.0)
    t = t_test(d, 0.95)  # t = 3 / (sd / sqrt 5) = 4.243 on 4 df
    assert t.estimate == 3.0 and t.p_value == pytest.approx(0.013236, abs=1e-5)
    assert t.ci.lo == pytest.approx(3.0 - 2.776445 * np.std(d, ddof=1) / np.sqrt(5), rel=1e-5)
    six = np.arange(1.0, 7.0)
    assert wilcoxon_test(six, 0.95).p_value == pytest.approx(2 / 64)
    assert wilcoxon_test(six * [-1, 1, 1, 1, 1, 1], 0.95).p_value == pytest.approx(4 / 64)
    assert sign_test(six, 0.95).p_value == pytest.approx(2 / 64)
    # below 6 pairs the exact tests cannot reach 95%: no interval, the smallest p is 2 / 2^n
    assert wilcoxon_test(d, 0.95).ci is None and sign_test(d, 0.95).ci is None
    assert wilcoxon_test(d, 0.95).p_value == pytest.approx(2 / 32)
    assert [min_pairs_for(m, 0.95) for m in ("t", "wilcoxon", "sign")] == [2, 6, 6]


@pytest.mark.parametrize("method", ["t", "wilcoxon", "sign"])
def test_paired_intervals_cover_the_truth_at_least_as_often_as_they_say(method):
    """A location shift of 1 under skewed-free noise: 90% intervals from 8 pairs (t: also 5)."""
    rng = np.random.default_rng(0)
    n = 5 if method == "t" else 8
    hits = sum(paired_test(method, 1.0 + rng.standard_normal(n), 0.9).ci.covers(1.0)
               for _ in range(400))
    assert 0.86 <= hits / 400 <= 0.995


@pytest.mark.parametrize("method,verdict", [("t", SIGNIFICANT), ("wilcoxon", TOO_FEW),
                                            ("sign", TOO_FEW), ("percentile", TOO_FEW)])
def test_five_seeds_give_a_verdict_only_where_the_method_can(tmp_path, method, verdict):
    runs = load_runs(write_sweep(tmp_path, seeds=range(5), rates=(4,)))
    m = compare_runs(runs, by="scheduler.name", baseline="static", method=method,
                     metrics=["output_throughput"]).comparisons[0].metrics[0]
    assert m.verdict == verdict
    assert (m.p_value is None) == (method == "percentile")
    if method in ("wilcoxon", "sign"):
        assert m.p_value == pytest.approx(2 / 32) and m.ci is None  # the smallest p at n = 5


def test_median_methods_show_medians_throughout(tmp_path):
    runs = load_runs(write_sweep(tmp_path, seeds=range(8), rates=(4,)))
    for method, stat in (("wilcoxon", "pseudo-median"), ("sign", "median")):
        report = compare_runs(runs, by="scheduler.name", baseline="static", method=method,
                              metrics=["output_throughput"])
        m = report.comparisons[0].metrics[0]
        base = sorted(r.metrics["output_throughput"] for r in runs
                      if r.config["scheduler.name"] == "static")
        assert report.statistic == stat and m.baseline == pytest.approx(np.median(base))
        assert m.verdict == SIGNIFICANT and m.p_value < 0.05 and m.ci.lo > 0


def test_a_difference_at_rounding_level_is_no_difference():
    """The same schedule summed in another order: a constant 1e-13 shift is not a finding."""
    base = [100.0 + s for s in range(5)]
    m = diff_metric("mean_tpot_ms", base, [v + 1e-13 for v in base])
    assert m.diff == 0.0 and m.verdict == NOT_SIGNIFICANT
    shifted = diff_metric("mean_tpot_ms", base, [v + 0.5 for v in base])
    assert shifted.verdict == SIGNIFICANT and shifted.diff == pytest.approx(0.5)


def test_a_wfq_queue_written_from_the_docs_beats_fcfs_for_light_clients_at_5_seeds(tmp_path):
    """The issue's question end to end, in miniature: fcfs vs the WFQ fixture
    (tests/fixtures/fairness/wfq_queue.py, as `module:Class`) over 5 seeds of a heavy client
    and three light ones on a fake engine, then `compare` on a globbed client metric."""
    import sys
    from pathlib import Path

    from fakes import FakeExecutor

    from schedlab.config import EngineConfig
    from schedlab.engine import Engine
    from schedlab.runs.driver import run_workload
    from schedlab.runs.metrics import compute_metrics
    from schedlab.runs.workload import build_workload

    sys.path.insert(0, str(Path(__file__).parent / "fixtures" / "fairness"))
    spec = {"type": "synthetic", "num_requests": 40, "input_len": 8, "output_len": 6,
            "arrival": {"process": "poisson", "rate": None},
            "clients": [{"id": "heavy", "rate": 2000.0}, {"id": "light", "count": 3,
                                                          "rate": 200.0}]}
    i = 0
    for queue in ("fcfs", "wfq_queue:WFQQueue"):
        for seed in range(5):
            eng = Engine(EngineConfig(model="fake", max_num_seqs=2, max_model_len=64,
                                      num_kv_blocks=64, block_size=4, queue=queue),
                         executor_cls=FakeExecutor)
            run = run_workload(eng, build_workload(spec, 100, seed=seed))
            write_results(tmp_path / str(i), compute_metrics(run),
                          {"seed": seed, "queue": {"name": queue}})
            i += 1
    (m,) = compare_runs(load_runs(tmp_path), by="queue.name", baseline="fcfs",
                        metrics=["per_client.light*.mean_ttft_ms"]).comparisons[0].metrics
    assert m.n == 5 and m.verdict == SIGNIFICANT and m.ratio < 0.8


def test_default_metrics_add_each_client_groups_mean_ttft(tmp_path):
    runs = load_runs(write_client_sweep(tmp_path, seeds=range(3)))
    report = compare_runs(runs, by="queue.name", baseline="fcfs")
    names = [m.metric for m in report.comparisons[0].metrics]
    assert names[-2:] == ["per_client.heavy.mean_ttft_ms", "per_client.light*.mean_ttft_ms"]
    assert "mean_ttft_ms" in names  # the report's columns come first
