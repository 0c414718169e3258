"""The paper experiments (conf/experiment/*, experiments/summarize.py): configs, summaries, runs.

The fast tests check every experiment's configs and run one tiny simulated sweep end to end.
The slow ones (`pytest -m slow tests/test_experiments.py`) run each experiment's grid in both
modes at a reduced size and check the table and figure it produces. Nothing here asserts a
timing or a paper's claim: only that each experiment produces well-formed results.
"""

from __future__ import annotations

import csv
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf" / "experiment"
sys.path.insert(0, str(ROOT / "experiments"))

import summarize  # noqa: E402
from summaries import SPECS  # noqa: E402

SCHEDLAB = [sys.executable, "-c", "import sys; from schedlab.cli import main; sys.exit(main())"]
EXPERIMENTS = sorted(SPECS)
#: per experiment: overrides that shrink the grid for a test (both modes), and the points left
REDUCED: dict[str, tuple[list[str], int]] = {
    "orca": (["workload.num_requests=16", "workload.output_len.sigma=0.001,1.0"], 4),
    "paged_vs_contiguous": (["workload.num_requests=16"], 3),
    "chunked_prefill": (["workload.num_requests=8", "workload.arrival.rate=8,32"], 4),
    "prefix_caching": (["workload.num_requests=16", "exp.split={pct:0,prefix:0,suffix:64},"
                        "{pct:90,prefix:58,suffix:6}", "workload.output_len.min=4",
                        "workload.output_len.max=8"], 6),
    "latency_throughput": (["workload.num_requests=16", "workload.arrival.rate=16,64"], 4),
    "disaggregation": (["workload.num_requests=8", "workload.arrival.rate=8,32"], 6),
    "fairness": (["workload.num_requests=16", "queue=fcfs,vtc"], 2),
}
#: columns every experiment's table must have (beyond the spec's own labels)
EXPECTED = {
    "orca": ["scheduler", "output sigma", "output tok/s", "norm. latency (ms/tok)"],
    "paged_vs_contiguous": ["KV allocator", "peak running", "token state / pool (%)",
                            "output tok/s"],
    "chunked_prefill": ["scheduler", "rate (req/s)", "p99 ITL (ms)", "p99 TPOT (ms)",
                        "p50 TTFT (ms)"],
    "prefix_caching": ["prefix cache", "shared %", "hit rate", "mean TTFT (ms)"],
    "latency_throughput": ["max concurrency", "rate (req/s)", "p99 TTFT (ms)", "p99 TPOT (ms)",
                           "output tok/s"],
    "disaggregation": ["layout", "rate (req/s)", "attain. SLO 1", "p90 TTFT (ms)",
                       "p90 TPOT (ms)"],
    "fairness": ["policy", "light mean TTFT (ms)", "heavy mean TTFT (ms)", "Jain, 1st half"],
}


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    """A model cache with llama_small built once (the real mode's model)."""
    from schedlab.tiny import build_tiny_model

    d = tmp_path_factory.mktemp("schedlab-cache")
    build_tiny_model(d / "llama-small-s0", family="llama", size="small", seed=0)
    return d


def run_experiment(name: str, overrides: list[str], sweep: Path, cache: Path
                   ) -> subprocess.CompletedProcess:
    env = dict(os.environ, SCHEDLAB_CACHE=str(cache), OMP_NUM_THREADS="1")
    env.pop("HYDRA_FULL_ERROR", None)
    p = subprocess.run([*SCHEDLAB, "run", "-m", f"experiment={name}", f"hydra.sweep.dir={sweep}",
                        *overrides], cwd=sweep.parent, env=env, capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, f"exit {p.returncode}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}"
    return p


def check_outputs(sweep: Path, name: str, mode: str, num_points: int, seeds: int) -> None:
    """The table (md + csv) has the expected columns and rows, finite values; the PNG opens."""
    spec = SPECS[name]
    stem = sweep / f"{name}_{mode}"
    md = stem.with_suffix(".md").read_text()
    header = next(line for line in md.splitlines() if line.startswith("| "))
    columns = [c.strip() for c in header.strip("|").split("|")]
    assert set(EXPECTED[name]) <= set(columns), columns
    assert [m.label for m in spec.metrics] == columns[-len(spec.metrics):]
    first = md.split(header, 1)[1].split("\n\n", 1)[0]  # the main table (sections follow)
    body = [line for line in first.splitlines() if line.startswith("| ")]
    assert len(body) == num_points, md
    assert "## Summary" in md
    with stem.with_suffix(".csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == num_points
    for row in rows:
        assert len(row["seeds"].split()) == seeds
        for m in spec.metrics:
            v = float(row[m.key])
            assert math.isfinite(v), (m.key, row)
            assert float(row[f"{m.key}_min"]) <= v <= float(row[f"{m.key}_max"])
    import matplotlib.image

    img = matplotlib.image.imread(stem.with_suffix(".png"))
    assert img.ndim == 3 and img.shape[0] > 100 and img.shape[1] > 100


# ---- fast ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", EXPERIMENTS)
def test_each_experiment_has_a_real_and_a_sim_config(name):
    for mode, stem in (("real", name), ("sim", f"{name}_sim")):
        path = CONF / f"{stem}.yaml"
        assert path.read_text().startswith("# @package _global_"), path
        with initialize_config_module("schedlab.conf", version_base="1.3"):
            cfg = compose("config", overrides=[f"experiment={stem}"], return_hydra_config=True)
        assert cfg.exp.name == name and cfg.exp.mode == mode
        assert cfg.exp.publish is False  # publishing is asked for on the command line
        params = OmegaConf.to_container(cfg.hydra.sweeper.params)
        assert "seed" in params and len(str(params["seed"]).split(",")) >= 3, params
        assert cfg.executor.name == ("sim" if mode == "sim" else "torch")
        assert "summarize" in cfg.hydra.callbacks


def _fake_runs(root: Path, name: str) -> int:
    """results.json files for a 2 x 2 grid (x seeds) of plausible metrics; returns the points."""
    from schedlab.runs.results import write_results

    grids = {
        "orca": [{"scheduler": {"name": s}, "workload": {"output_len": {"sigma": g}}}
                 for s in ("static", "continuous") for g in (0.001, 1.0)],
        "paged_vs_contiguous": [{"exp": {"kv": k}} for k in ("contiguous", "paged")],
        "chunked_prefill": [{"exp": {"sched": s}, "workload": {"arrival": {"rate": r}}}
                            for s in ("continuous", "chunked") for r in (2, 8)],
        "prefix_caching": [{"prefix_cache": {"name": c}, "exp": {"split": {"pct": p}}}
                           for c in ("none", "radix") for p in (0, 90)],
        "latency_throughput": [{"driver": {"max_concurrency": c}, "workload": {
            "arrival": {"rate": r}}} for c in (None, 8) for r in (2, 8, 32)],
        "disaggregation": [{"exp": {"layout": v, "slos": [[30, 8], [15, 20]]},
                            "workload": {"arrival": {"rate": r}}}
                           for v in ("colocated", "disaggregated") for r in (2, 8)],
        "fairness": [{"queue": {"name": q}} for q in ("fcfs", "vtc")],
    }
    n = 0
    for i, point in enumerate(grids[name]):
        for seed in (0, 1, 2):
            rate = point.get("workload", {}).get("arrival", {}).get("rate", 1)
            lat = 10.0 * (1 + (rate / 8) ** 3) + seed
            metrics = {k: 1.0 + i + seed for k in (
                "request_throughput", "max_concurrent_requests", "max_num_running",
                "mean_num_running", "num_preemptions", "prefix_cache_hit_rate",
                "mean_batch_size", "mean_e2el_ms", "mean_framework_time_ms")}
            metrics.update(
                output_throughput=100.0 * min(rate, 8) + seed, median_ttft_ms=lat,
                p99_ttft_ms=3 * lat, mean_ttft_ms=2 * lat, median_tpot_ms=5.0 + seed,
                p99_tpot_ms=9.0 + i, median_itl_ms=5.0, p99_itl_ms=10.0 * (1 + i) * rate,
                num_kv_blocks=64, mean_kv_used_tokens=200.0 + i, mean_kv_reserved_tokens=900.0,
                kv_waste_pct=50.0, output_lens=[4, 8, 16 + seed], e2els=[0.1, 0.2, 0.3],
                p90_ttft_ms=2 * lat, p90_tpot_ms=7.0 + i, completed=3, num_failed=0,
                ttfts=[lat / 1000, 0.02, 0.04], tpots=[0.005, 0.01 * (1 + i), None])
            config = {"seed": seed, "engine": {"seed": seed, "block_size": 16},
                      "exp": {"name": name, "mode": "sim", "slo_tbt_ms": [100],
                              "slo_median_ttft_ms": 2000, "focus_rate": 8},
                      "model": {"name": "fake"}, "workload": {"num_requests": 3}}
            if name == "fairness":  # per-client metrics, as results.json has them
                metrics.update(num_rejected=0, per_client={c: {
                    "num_requests": 4, "num_rejected": i, "mean_ttft_ms": lat * (1 + k),
                    "p99_ttft_ms": 3 * lat * (1 + k)} for k, c in enumerate(
                        ("heavy", "medium", "light0", "light1"))},
                    service_timeline={"t_s": [1.0, 2.0, 3.0, 4.0], "clients": {
                        "heavy": [9.0 - i, 9.0, 1.0, 0.0], "medium": [6.0, 5.0 + i, 1.0, 0.0],
                        "light0": [3.0, 2.0 + i, 3.0, 0.0],
                        "light1": [2.0 + seed, 3.0, 0.0, 0.0]}})
            _merge(config, point)
            write_results(root / f"{n}", metrics, config)
            n += 1
    return len(grids[name])


def _merge(into: dict, delta: dict) -> None:
    for k, v in delta.items():
        if isinstance(v, dict) and isinstance(into.get(k), dict):
            _merge(into[k], v)
        else:
            into[k] = v


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_summarize_groups_seeds_and_writes_table_and_figure(name, tmp_path, monkeypatch):
    points = _fake_runs(tmp_path / "sweep", name)
    monkeypatch.setattr(summarize, "RESULTS_DIR", tmp_path / "published")
    paths = summarize.summarize(tmp_path / "sweep", publish=True)
    check_outputs(tmp_path / "sweep", name, "sim", points, seeds=3)
    assert sorted(p.name for p in (tmp_path / "published").iterdir()) == sorted(
        f"{name}_sim{s}" for s in (".csv", ".md", ".png"))
    assert len(paths) == 6


def test_summarize_reports_median_and_range_over_seeds(tmp_path):
    _fake_runs(tmp_path / "sweep", "paged_vs_contiguous")
    summarize.summarize(tmp_path / "sweep")
    with (tmp_path / "sweep" / "paged_vs_contiguous_sim.csv").open() as f:
        rows = {r["exp.kv"]: r for r in csv.DictReader(f)}
    # output_throughput = 100 + seed over seeds 0, 1, 2
    assert float(rows["contiguous"]["output_throughput"]) == 101.0
    assert float(rows["contiguous"]["output_throughput_min"]) == 100.0
    assert float(rows["contiguous"]["output_throughput_max"]) == 102.0
    assert rows["contiguous"]["seeds"] == "0 1 2"


def test_summarize_rejects_an_unknown_experiment(tmp_path):
    _fake_runs(tmp_path / "sweep", "orca")
    assert summarize.main([str(tmp_path / "sweep"), "--experiment", "nope"]) == 2


def test_sim_sweep_end_to_end_is_summarized(tmp_path):
    """A tiny simulated orca sweep: the callback writes the table and figure into the sweep."""
    sweep = tmp_path / "sweep"
    run_experiment("orca_sim", ["workload.num_requests=12", "seed=0,1",
                                "workload.output_len.sigma=1.0"], sweep, tmp_path)
    check_outputs(sweep, "orca", "sim", num_points=2, seeds=2)
    results = sorted(sweep.glob("*/results.json"))
    assert len(results) == 4
    cfg = json.loads(results[0].read_text())["config"]
    assert cfg["exp"] == {**cfg["exp"], "name": "orca", "mode": "sim"}


# ---- slow: every experiment, both modes, reduced -----------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("mode", ["real", "sim"])
@pytest.mark.parametrize("name", EXPERIMENTS)
def test_experiment_runs_in_both_modes(name, mode, tmp_path, cache):
    overrides, points = REDUCED[name]
    stem = name if mode == "real" else f"{name}_sim"
    sweep = tmp_path / "sweep"
    run_experiment(stem, [*overrides, "seed=0,1"], sweep, cache)
    check_outputs(sweep, name, mode, points, seeds=2)


@pytest.mark.slow
def test_sim_results_are_identical_on_a_rerun(tmp_path, cache):
    runs = []
    for i in range(2):
        sweep = tmp_path / f"sweep{i}"
        run_experiment("paged_vs_contiguous_sim", ["workload.num_requests=50", "seed=3"], sweep,
                       cache)
        runs.append((sweep / "paged_vs_contiguous_sim.csv").read_text())
    assert runs[0] == runs[1]
