"""`schedlab report` over real run directories made with run_workload + write_results."""

from __future__ import annotations

import csv

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
