"""`schedlab calibrate` with an explicit device, dtype and attention backend: what a GPU run
does (there with device=cuda and a datasheet preset), tested on the CPU through the same path."""

from __future__ import annotations

import json

import pytest
import torch

from schedlab.calibration.calibrate import base_profile, calibrate, check_setup, main
from schedlab.config import EngineConfig
from schedlab.engine import Engine
from schedlab.request import RequestStatus
from schedlab.runs.driver import run_workload
from schedlab.runs.workload import build_workload
from schedlab.sim.hardware import PRESETS

SPEC = {"type": "synthetic", "num_requests": 4, "input_len": 32, "output_len": 8}


def _sim_duration(model: str, profile, attention: str) -> tuple[float, Engine]:
    engine = Engine(EngineConfig(model=model, executor="sim", attention=attention,
                                 executor_options={"hardware": str(profile)}, block_size=8))
    run = run_workload(engine, build_workload(SPEC, engine.model_spec.vocab_size, seed=0))
    assert all(r.status is RequestStatus.FINISHED_LENGTH for r in run.requests)
    return run.duration_s, engine


@pytest.mark.slow  # bf16 matmuls crawl on a CPU
def test_bfloat16_calibration_gives_a_profile_the_sim_runs_at_two_bytes(llama_dir, tmp_path):
    out = tmp_path / "bf16.json"
    grid = [((8,), (0,)), ((32,), (0,)), ((1,) * 4, (16,) * 4), ((1,) * 8, (32,) * 8)]
    fit = calibrate(llama_dir, out=out, repeats=1, grid=grid, verbose=False, block_size=8,
                    device="cpu", dtype="bf16", attention="sdpa")
    saved = json.loads(out.read_text())
    assert saved["dtype"] == "bfloat16" and saved["device"] == "cpu"
    assert saved["decode_pad_waste"] == 0.25  # sdpa pads decode groups
    assert len(fit.rel_errors) == len(grid)
    duration, engine = _sim_duration(llama_dir, out, "sdpa")
    assert duration > 0 and engine.executor.dtype == "bfloat16"


def test_triton_calibration_charges_no_decode_padding(llama_dir, tmp_path):
    """The Triton backend (in its interpreter here) reads each decode's own context."""
    out = tmp_path / "triton.json"
    fit = calibrate(llama_dir, out=out, repeats=1, grid=[((16,), (0,)), ((1,) * 4, (8,) * 4)],
                    verbose=False, host_overhead=False, block_size=8, device="cpu",
                    dtype="float32", attention="triton")
    assert fit.profile.decode_pad_waste is None
    assert _sim_duration(llama_dir, out, "triton")[0] > 0


def test_a_gpu_base_profile_is_the_preset_with_efficiencies_at_one():
    base = base_profile("cuda", "H200", "bfloat16", "triton", label="m")
    h200 = PRESETS["h200"]
    assert (base.matmul_flops, base.mem_bandwidth) == (h200.matmul_flops, h200.mem_bandwidth)
    assert base.linear_efficiency == base.kv_efficiency == 1.0 and base.step_overhead == 0.0
    assert base.device == "cuda" and base.dtype == "bfloat16"
    assert base.decode_pad_waste is None and base.name == "H200-SXM-calibrated-m"


@pytest.mark.parametrize("kwargs, message", [
    (dict(device="tpu"), "accepted: cpu, cuda"),
    (dict(device="cuda", hardware="b200"), "accepted: a100, h100, h200"),
    (dict(device="cuda"), "needs a base preset"),
    (dict(device="cuda", clock="cpu", hardware="h200"), "use clock='wall' on a CUDA device"),
    (dict(hardware="h100"), "on device=cpu the base is this CPU"),
    (dict(dtype="int8"), "accepted: float32"),
    (dict(attention="flash"), "installed: sdpa, triton"),
    (dict(clock="gpu"), "accepted: wall, cpu"),
])
def test_settings_that_cannot_be_calibrated_fail_in_one_sentence(kwargs, message):
    with pytest.raises(ValueError, match=message):
        check_setup(**kwargs)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error where CUDA is absent")
def test_cli_says_when_cuda_is_absent(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--device", "cuda", "--hardware", "h200"])
    assert e.value.code == 2
    assert "torch sees no CUDA device" in capsys.readouterr().err


def test_cli_names_the_new_options(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    text = capsys.readouterr().out
    for opt in ("--device", "--dtype", "--attention", "--hardware", "--max-model-len",
                "--enforce-eager"):
        assert opt in text, opt


def test_decode_shapes_are_timed_through_the_cuda_graph_path(llama_dir, monkeypatch):
    """On a GPU the calibration times what is served: decode-only steps replay graphs. Here
    the graphs' padded path runs eagerly (`emulate_cuda_graphs`), through the same runner."""
    from schedlab.calibration.measure import measure_torch
    from schedlab.plugins.executors.cuda_graphs import DecodeGraphRunner

    replays = []
    run = DecodeGraphRunner.run

    def counted(self, input_ids, *args, **kwargs):
        replays.append(input_ids.shape[-1])
        return run(self, input_ids, *args, **kwargs)

    monkeypatch.setattr(DecodeGraphRunner, "run", counted)
    grid = [((16,), (0,)), ((1,) * 3, (20,) * 3), ((1,) * 2 + (8,), (20, 20, 0))]
    times = measure_torch(llama_dir, grid, repeats=1, warm_s=0.0, max_model_len=64,
                          executor_options={"emulate_cuda_graphs": True})
    assert len(times) == 3 and min(times) > 0
    assert replays and set(replays) == {3}  # the decode-only step only, never the others


def test_operators_measured_here_give_a_profile_with_each_operators_error(llama_dir, tmp_path,
                                                                          capsys):
    """`calibrate --operators CSV --measure-operators` times the model's operators on this
    CPU, writes the documented CSV, fits it and says each operator's held-out error."""
    from schedlab.calibration.profile_csv import read_profile
    from schedlab.sim.operators import OPERATORS

    ops, out = tmp_path / "ops.csv", tmp_path / "ops.json"
    assert main(["--model", llama_dir, "--operators", str(ops), "--measure-operators",
                 "--repeats", "1", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert {r.operator for r in read_profile(ops)} == set(OPERATORS)
    assert "gemm" in text and "held out" in text
    saved = json.loads(out.read_text())
    assert saved["device"] == "cpu" and saved["kernel_time"] > 0
    # the profile runs the simulator
    assert _sim_duration(llama_dir, out, "sdpa")[0] > 0
