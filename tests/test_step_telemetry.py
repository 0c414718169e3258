"""Per-step host time by phase: recorded by the engine and the torch executor, reported in
results.json's metrics and the console table."""

from __future__ import annotations

import pytest
from fakes import FakeExecutor

from schedlab import LLM, SamplingParams
from schedlab.config import EngineConfig
from schedlab.engine import Engine
from schedlab.runs.metrics import engine_metrics
from schedlab.runs.results import format_table
from schedlab.runs.run_result import RunResult
from schedlab.stats import STEP_PHASES


def test_every_phase_of_a_real_step_is_timed(llama_dir):
    llm = LLM(llama_dir, block_size=4, max_model_len=64, num_kv_blocks=64)
    llm.generate([[5, 6, 7, 8], [9, 10, 11]], SamplingParams(max_tokens=4, ignore_eos=True))
    steps = llm.engine.step_stats
    assert len(steps) == 4
    for s in steps:
        for phase in ("schedule", "prepare", "forward", "sample", "update"):
            assert getattr(s, f"{phase}_time") > 0, phase
        assert s.device_wait_time == 0.0  # a CPU has nothing to wait for
        assert s.framework_time == s.schedule_time + s.update_time
        # the executor's parts make up the step it reported, nothing left out
        parts = s.prepare_time + s.forward_time + s.device_wait_time + s.sample_time
        assert parts == pytest.approx(s.step_time, rel=1e-9, abs=1e-9)

    run = RunResult(requests=[], duration_s=1.0, step_stats=steps, num_preemptions=0,
                    prefix_hit_rate=0.0, num_kv_blocks=64)
    metrics = engine_metrics(run)
    for phase in STEP_PHASES:
        assert f"mean_{phase}_time_ms" in metrics
    assert metrics["mean_forward_time_ms"] > 0 and metrics["mean_update_time_ms"] > 0
    table = format_table(metrics)
    row = next(line for line in table.splitlines() if line.startswith("Mean step (ms):"))
    assert all(word in row for word in ("schedule", "prepare", "forward", "wait", "sample",
                                        "update"))


def test_a_simulated_or_fake_executor_reports_no_executor_phases():
    eng = Engine(EngineConfig(model="fake"), executor_cls=FakeExecutor)
    eng.add_request([1, 2, 3], SamplingParams(max_tokens=2, ignore_eos=True))
    eng.run_until_done()
    s = eng.step_stats[-1]
    assert s.schedule_time > 0 and s.update_time > 0
    assert s.prepare_time == s.forward_time == s.sample_time == 0.0
