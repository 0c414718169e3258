"""experiments/bench_gpu.py --smoke: every engine of issue 12's table runs and is reported
(tiny model on the CPU; the GPU numbers come from the same script on a CUDA machine)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "experiments"))

import bench_gpu  # noqa: E402


def test_smoke_run_of_the_padded_path_and_the_simulator(tmp_path, capsys, llama_dir):
    """The quick part: schedlab through the graph path's padding, profiled, the sim, and the
    sim calibrated in the same run (its profile written next to bench_gpu.json)."""
    rc = bench_gpu.main(["--smoke", "--engines", "sdpa-graphs,sim,sim-calibrated",
                         "--out", str(tmp_path), "--model", llama_dir])
    assert rc == 0
    doc = json.loads((tmp_path / "bench_gpu.json").read_text())
    graphs, sim, calibrated = doc["rows"]
    assert graphs["engine"] == "sdpa-graphs" and graphs["note"].startswith("graphs emulated")
    assert graphs["output_tokens"] == sim["output_tokens"] > 0 and sim["tok_per_s"] > 0
    assert doc["decode_step_profiles"]["sdpa-graphs"]["wall_ms"] > 0
    assert calibrated["engine"] == "sim-calibrated" and calibrated["seconds"] > 0
    assert calibrated["output_tokens"] == sim["output_tokens"]
    assert "calibrated on cpu, sdpa" in calibrated["note"] and "fit error" in calibrated["note"]
    info = doc["sim_calibrated"]
    assert info["calibration_s"] > 0 and len(info["grid"]) == len(bench_gpu.bench_grid(
        bench_gpu.SMOKE))
    profile = json.loads((tmp_path / "bench_gpu_sim_profile.json").read_text())
    assert profile == info["profile"] and profile["dtype"] == "float32"


@pytest.mark.slow  # transformers' engines and the profiler: ~30 s on a busy 2-core machine
def test_smoke_run_reports_every_engine(tmp_path, capsys):
    engines = ["sdpa-eager", "sdpa-graphs", "sdpa-chunked", "hf-static", "hf-cb", "sim"]
    rc = bench_gpu.main(["--smoke", "--engines", ",".join(engines), "--out", str(tmp_path),
                         "--cache", str(tmp_path / "models")])
    assert rc == 0
    doc = json.loads((tmp_path / "bench_gpu.json").read_text())
    rows = {r["engine"]: r for r in doc["rows"]}
    assert list(rows) == engines
    expected_tokens = rows["sim"]["output_tokens"]
    for name, r in rows.items():
        assert r["tok_per_s"] > 0 and r["output_tokens"] == expected_tokens, name
        assert not r["note"].startswith("FAILED"), r["note"]
    # float32 greedy: the padded (graph-bucketed) path, chunked prefill and transformers agree
    for name in ("sdpa-graphs", "sdpa-chunked", "hf-static", "hf-cb"):
        assert rows[name]["agreement_tokens"] == 1.0, name
    assert rows["sdpa-graphs"]["note"].startswith("graphs emulated")
    assert rows["sdpa-eager"]["phases_ms"]["mean_forward_time_ms"] > 0
    prof = doc["decode_step_profiles"]["sdpa-eager"]
    assert prof["num_seqs"] == doc["setup"]["num_requests"] and prof["wall_ms"] > 0
    assert prof["gpu_busy_ms"] is None  # no GPU here
    table = (tmp_path / "bench_gpu.md").read_text()
    assert "| sim |" in table and "Decode step profile" in table
