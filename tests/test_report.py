"""`schedlab report` over real run directories made with run_workload + write_results."""

from __future__ import annotations

import csv
import warnings

import pytest

from schedlab.config import EngineConfig
from schedlab.engine import Engine
from schedlab.runs.driver import run_workload
from schedlab.runs.metrics import compute_metrics
from schedlab.runs.report import main
from schedlab.runs.results import write_results
from schedlab.runs.workload import build_workload


@pytest.fixture(scope="module")
def sweep(llama_dir, tmp_path_factory):
    """A two-by-two sweep over scheduler seats and arrival rate, laid out like a multirun."""
    root = tmp_path_factory.mktemp("multirun")
    i = 0
    for seqs in (1, 4):
        for rate in (50.0, 500.0):
            eng = Engine(EngineConfig(model=llama_dir, max_num_seqs=seqs, max_model_len=128,
                                      num_kv_blocks=32))
            spec = {"type": "synthetic", "num_requests": 4, "input_len": 8, "output_len": 3,
                    "arrival": {"process": "poisson", "rate": rate}}
            run = run_workload(eng, build_workload(spec, eng.model_spec.vocab_size, seed=0))
            config = {"model": {"path": "tiny"}, "engine": {"max_num_seqs": seqs},
                      "workload": spec, "output_dir": str(root / str(i))}
            write_results(root / str(i), compute_metrics(run), config, {"python": "3"})
            i += 1
    return root


def test_report_compares_swept_parameters(sweep, tmp_path, capsys):
    assert main([str(sweep), "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    md = (tmp_path / "report.md").read_text()
    header = md.splitlines()[4]
    # the swept parameters are columns, unchanged ones are not
    assert "engine.max_num_seqs" in header and "workload.arrival.rate" in header
    assert "model.path" not in header and "output_dir" not in header
    assert "p99_tpot_ms" in header and "output_throughput" in header
    assert header in printed
    with (tmp_path / "report.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 4
    assert sorted((r["engine.max_num_seqs"], r["workload.arrival.rate"]) for r in rows) == [
        ("1", "50.0"), ("1", "500.0"), ("4", "50.0"), ("4", "500.0")]
    assert all(r["completed"] == "4" for r in rows)
    assert (tmp_path / "tradeoff.png").read_bytes()[:4] == b"\x89PNG"


def test_report_on_a_single_run_writes_next_to_it(sweep):
    run_dir = sweep / "0"
    assert main([str(run_dir)]) == 0
    assert (run_dir / "report.md").is_file()


def test_report_without_results_is_a_clear_error(tmp_path, capsys):
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "results.json").write_text("{not json")
    assert main([str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "no readable results.json" in err and "Traceback" not in err
    assert main([str(tmp_path / "missing")]) == 2
    assert "is not a directory" in capsys.readouterr().err


def test_report_refuses_an_out_that_is_not_a_directory_in_one_sentence(tmp_path, capsys):
    root = client_sweep(tmp_path / "sweep", seeds=range(2), rates=(2,))
    taken = tmp_path / "existing_file.jsonl"
    taken.write_text("{}\n")
    for out, words in ((taken, "is a file; --out names a directory"),
                       (taken / "sub", "cannot create or write into this directory")):
        assert main([str(root), "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"schedlab report: error: --out {out}") and words in err, err
        assert "Traceback" not in err and err.count("\n") == 1


def client_sweep(root, seeds=range(4), rates=(2, 10)):
    """queue x rate x seed, run directories numbered 0..N-1 (string order would put 10 before
    2), each run with two clients; vtc halves the light client's TTFT."""
    i = 0
    for queue in ("fcfs", "vtc"):
        for rate in rates:
            for s in seeds:
                light = (100.0 + s) * (0.5 if queue == "vtc" else 1.0) * rate
                metrics = {"output_throughput": 10.0 * rate + s, "p99_tpot_ms": 5.0 + s,
                           "request_throughput": rate, "p99_ttft_ms": 50.0 * rate + s,
                           "per_client": {"light": {"mean_ttft_ms": light, "completed": 3},
                                          "heavy": {"mean_ttft_ms": 400.0 + s, "completed": 9}}}
                config = {"seed": s, "engine": {"seed": s},
                          "queue": {"name": queue,
                                    "options": {"w": 2.0 if queue == "vtc" else None}},
                          "workload": {"arrival": {"rate": rate}}}
                write_results(root / str(i), metrics, config)
                i += 1
    return root


def _table(md: str, title: str) -> list[list[str]]:
    lines = md.split(f"## {title}\n\n", 1)[1].split("\n\n", 1)[0].splitlines()
    return [[c.strip() for c in line.strip("|").split("|")] for line in lines
            if not line.startswith("|---")]


def test_report_sorts_numerically_and_shows_only_chosen_keys(tmp_path):
    root = client_sweep(tmp_path / "sweep")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no matplotlib layout warning either
        assert main([str(root), "--out", str(tmp_path)]) == 0
    md = (tmp_path / "report.md").read_text()
    every = _table(md, "Every run")
    assert every[0][:4] == ["run", "queue.name", "workload.arrival.rate", "seed"]
    assert "engine.seed" not in md and "queue.options.w" not in md  # they follow seed / queue
    assert [r[0] for r in every[1:5]] == ["0", "1", "2", "3"]
    assert [(r[1], r[2]) for r in every[1:]][3:6] == [("fcfs", "2"), ("fcfs", "10"),
                                                      ("fcfs", "10")]
    med = _table(md, "Median over seeds")
    assert med[0][:3] == ["queue.name", "workload.arrival.rate", "seeds"]
    assert med[1][:3] == ["fcfs", "2", "0,1,2,3"]
    assert med[1][med[0].index("output_throughput")] == "21.5"  # median of 20, 21, 22, 23
    assert len(med) == 1 + 4


def test_report_per_client_tables_carry_the_swept_columns(tmp_path):
    root = client_sweep(tmp_path / "sweep")
    main([str(root), "--out", str(tmp_path)])
    md = (tmp_path / "report.md").read_text()
    med = _table(md, "Per client, median over seeds")
    head = med[0]
    assert head[:4] == ["queue.name", "workload.arrival.rate", "group", "seeds"]
    rows = {(r[0], r[1], r[2]): r for r in med[1:]}
    ttft = head.index("mean_ttft_ms")
    assert rows[("fcfs", "2", "light")][ttft] == "203.0"  # median of 2 x (100..103)
    assert rows[("vtc", "2", "light")][ttft] == "101.5"
    assert rows[("vtc", "10", "heavy")][3] == "4"
    runs = _table(md, "Per client, every run")
    assert runs[0][:5] == ["run", "queue.name", "workload.arrival.rate", "seed", "group"]
    assert [r[0] for r in runs[1:]][:10:2] == ["0", "1", "2", "3", "4"]
    assert len(runs) == 1 + 16 * 2


def test_run_plots_with_clients_add_a_per_client_figure_without_warnings(tmp_path):
    from fakes import FakeExecutor

    from schedlab.runs.plots import write_plots
    from schedlab.runs.workload import WorkloadRequest

    eng = Engine(EngineConfig(model="fake", max_num_seqs=2, max_model_len=64, num_kv_blocks=32,
                              block_size=4), executor_cls=FakeExecutor)
    reqs = [WorkloadRequest([5] * 8, 6, client_id="heavy" if i % 3 else "light",
                            arrival_s=0.001 * i) for i in range(12)]
    run = run_workload(eng, reqs)
    m = compute_metrics(run)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        paths = write_plots(tmp_path, run, m)
    assert [p.name for p in paths] == ["latency_cdf.png", "timeline.png", "clients.png"]
    assert all(p.read_bytes()[:4] == b"\x89PNG" for p in paths)
