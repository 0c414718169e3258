"""The simulated executor: same engine, same plugins, a cost model on a virtual clock."""

from __future__ import annotations

import textwrap

import pytest

from schedlab import registry
from schedlab.config import ConfigError, EngineConfig
from schedlab.engine import Engine
from schedlab.plan import SchedulerOutput
from schedlab.request import RequestStatus, SamplingParams
from schedlab.runs.driver import run_workload
from schedlab.runs.workload import build_workload
from schedlab.sim.costmodel import CostModel, StepShape
from schedlab.sim.hardware import PRESETS

SIM_H100 = dict(executor="sim", executor_options={"hardware": "h100"})
WORKLOAD = {
    "type": "synthetic",
    "num_requests": 300,
    "input_len": {"dist": "uniform", "min": 64, "max": 2048},
    "output_len": {"dist": "uniform", "min": 16, "max": 512},
    "arrival": {"process": "poisson", "rate": 20.0},
}


def _sim_run(seed: int = 0, **kw):
    engine = Engine(EngineConfig(model="llama3_8b", **SIM_H100, **kw))
    work = build_workload(WORKLOAD, engine.model_spec.vocab_size, seed=seed)
    return engine, work, run_workload(engine, work)


def test_sim_run_is_deterministic_and_finishes_every_request():
    engine, work, run = _sim_run()
    _, _, again = _sim_run()
    times = [r.metrics.token_times for r in run.requests]
    assert times == [r.metrics.token_times for r in again.requests]
    assert run.duration_s == again.duration_s > 0
    assert all(r.status is RequestStatus.FINISHED_LENGTH for r in run.requests)
    assert [r.num_output_tokens for r in run.requests] == [w.max_tokens for w in work]
    eos = set(engine.model_spec.eos_token_ids)
    assert not any(t in eos for r in run.requests for t in r.output_token_ids)
    _, _, other = _sim_run(seed=1)
    assert [r.metrics.token_times for r in other.requests] != times


def test_time_advances_only_by_the_cost_model():
    engine = Engine(EngineConfig(model="llama3_8b", **SIM_H100))
    cost = CostModel(engine.model_spec, PRESETS["h100"], dtype_bytes=2)
    predicted: list[float] = []
    orig = engine.executor.execute

    def spy(plan):
        predicted.append(cost.step_time(StepShape.from_plan(plan), engine.config.block_size))
        return orig(plan)

    engine.executor.execute = spy
    spec = dict(WORKLOAD, num_requests=50, arrival={"process": "offline"})
    run = run_workload(engine, build_workload(spec, engine.model_spec.vocab_size, seed=0))
    steps = [s.step_time for s in run.step_stats]
    assert steps == predicted
    # offline: no idle time, so the clock is exactly the sum of the predicted steps
    assert engine.clock.now() == pytest.approx(sum(predicted), rel=1e-12)
    assert run.duration_s == pytest.approx(sum(predicted), rel=1e-12)


def test_same_plans_as_the_real_executor(llama_dir):
    """Offline, the schedule does not depend on time: both executors see the same plans."""
    common = dict(model=llama_dir, max_model_len=256, num_kv_blocks=24, block_size=8,
                  max_num_seqs=6)
    spec = {"type": "synthetic", "num_requests": 12, "input_len": {"dist": "uniform", "min": 8,
            "max": 64}, "output_len": {"dist": "uniform", "min": 4, "max": 24}}
    runs = {}
    for name, opts in (("torch", {}), ("sim", {"hardware": "h100"})):
        engine = Engine(EngineConfig(executor=name, executor_options=opts, **common))
        runs[name] = run_workload(engine, build_workload(spec, engine.model_spec.vocab_size, 3))
    plan = [(s.num_scheduled_seqs, s.num_prefill_tokens, s.num_decode_tokens, s.num_preempted)
            for s in runs["torch"].step_stats]
    assert plan == [(s.num_scheduled_seqs, s.num_prefill_tokens, s.num_decode_tokens,
                     s.num_preempted) for s in runs["sim"].step_stats]
    assert runs["sim"].num_preemptions == runs["torch"].num_preemptions > 0
    assert ([r.num_output_tokens for r in runs["sim"].requests]
            == [r.num_output_tokens for r in runs["torch"].requests])


@pytest.fixture
def fake_plugin(tmp_path, monkeypatch):
    """A third-party scheduler installed as a distribution with entry points."""
    (tmp_path / "fake_sched_plugin.py").write_text(textwrap.dedent("""
        from schedlab.plugins.schedulers.continuous import ContinuousScheduler

        class CountingScheduler(ContinuousScheduler):
            instances = []

            def __init__(self, *args, **kwargs):
                super().__init__(*args, **kwargs)
                self.num_plans = 0
                CountingScheduler.instances.append(self)

            def schedule(self):
                self.num_plans += 1
                return super().schedule()
    """))
    info = tmp_path / "fake_plugin-0.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fake-plugin\nVersion: 0.0\n")
    (info / "entry_points.txt").write_text(
        "[schedlab.schedulers]\ncounting = fake_sched_plugin:CountingScheduler\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    registry.refresh()
    yield
    monkeypatch.undo()
    registry.refresh()


def test_third_party_scheduler_runs_under_sim_unchanged(fake_plugin):
    assert "counting" in registry.available("scheduler")
    engine, work, run = _sim_run(scheduler="counting")
    sched = engine.scheduler
    assert type(sched).__name__ == "CountingScheduler" and sched.num_plans >= len(run.step_stats)
    assert all(r.status is RequestStatus.FINISHED_LENGTH for r in run.requests)
    _, _, builtin = _sim_run()  # the subclass changes nothing: same token times
    assert ([r.metrics.token_times for r in run.requests]
            == [r.metrics.token_times for r in builtin.requests])


def test_kv_pool_is_what_the_weights_leave():
    engine = Engine(EngineConfig(model="llama3_8b", **SIM_H100))
    left = PRESETS["h100"].memory_capacity * 0.9 - engine.executor.weight_bytes()
    assert engine.num_kv_blocks == int(left // engine.kv_spec.bytes_per_block)
    assert engine.kv_spec.bytes_per_token == 2 * 32 * 8 * 128 * 2  # bf16
    with pytest.raises(ConfigError, match="raise tp"):
        Engine(EngineConfig(model="llama3_70b", **SIM_H100))
    big = Engine(EngineConfig(model="llama3_70b", executor="sim",
                              executor_options={"hardware": "h100", "tp": 4}))
    assert big.num_kv_blocks > 0


def test_options_and_bad_values():
    eng = Engine(EngineConfig(model="qwen2_5_7b", executor="sim", executor_options={
        "hardware": {"preset": "h200", "step_overhead": 0.0}, "linear_efficiency": 0.5}))
    hw = eng.executor.hardware
    assert (hw.name, hw.step_overhead, hw.linear_efficiency) == ("H200-SXM", 0.0, 0.5)
    with pytest.raises(ConfigError, match="h100"):
        Engine(EngineConfig(model="llama3_8b", executor="sim",
                            executor_options={"hardware": "h1000"}))
    with pytest.raises(ConfigError, match="llama3_8b"):
        Engine(EngineConfig(model="llama-9000", executor="sim",
                            executor_options={"hardware": "h100"}))
    with pytest.raises(ConfigError, match="not_an_option"):
        Engine(EngineConfig(model="llama3_8b", executor="sim",
                            executor_options={"hardware": "h100", "not_an_option": 1}))


def test_calibration_fits_the_real_executor_through_the_engine_api(llama_dir, tmp_path):
    """`schedlab calibrate` times the torch executor on CPU time, fits a profile, saves it, and
    the simulator loads it; the host-overhead run uses an injected clock, nothing patched."""
    from schedlab.calibration.calibrate import calibrate

    grid = [((8,), (0,)), ((32,), (0,)), ((1,) * 4, (16,) * 4), ((1,) * 8, (32,) * 8)]
    out = tmp_path / "cpu.json"
    fit = calibrate(llama_dir, out=out, repeats=1, grid=grid, verbose=False, clock="cpu",
                    block_size=8)
    assert len(fit.rel_errors) == len(grid)
    assert fit.profile.step_overhead >= 0 and fit.profile.seq_overhead >= 0
    engine = Engine(EngineConfig(model=llama_dir, executor="sim",
                                 executor_options={"hardware": str(out)}, block_size=8))
    spec = {"type": "synthetic", "num_requests": 4, "input_len": 32, "output_len": 8}
    run = run_workload(engine, build_workload(spec, engine.model_spec.vocab_size, seed=0))
    assert run.duration_s > 0
    assert all(r.status is RequestStatus.FINISHED_LENGTH for r in run.requests)


@pytest.mark.parametrize("enforce_eager", [False, True])
def test_decode_steps_replay_graphs_unless_eager(llama_dir, enforce_eager):
    """A small model's eager decode on an H200 is launch-bound; captured graphs are not."""
    from schedlab.plan import ScheduledRequest, SchedulerOutput
    from schedlab.request import Request, SamplingParams

    cfg = EngineConfig(model=llama_dir, executor="sim", enforce_eager=enforce_eager)
    ex = registry.load("executor", "sim")(cfg, hardware="h200")
    req = Request("a", [1] * 10, SamplingParams(max_tokens=4))
    plan = SchedulerOutput([ScheduledRequest(req, 1, 9, [0])])
    shape = StepShape.from_plan(plan)
    eager = ex.cost_model.step_cost(shape, cfg.block_size)
    assert eager.launch > 0  # the kernels finish before their launches do
    want = eager.total if enforce_eager else ex.cost_model.step_time(shape, cfg.block_size, True)
    assert ex.execute(plan).step_time == pytest.approx(want)
    assert (ex.execute(plan).step_time < eager.total) is not enforce_eager


class _BothWays:
    """Costs every plan both ways: from the engine's `plan.totals` (the aggregate paths) and
    from the plan itself (`StepShape.from_plan`); and samples it again on a twin executor
    that sees the plan without its totals (the general path)."""

    def __init__(self, engine: Engine) -> None:
        self.pairs: list[tuple[float, float]] = []
        self.tokens: list[tuple[list[int | None], list[int | None]]] = []
        self.kinds: set[str] = set()
        ex = engine.executor
        twin = registry.load("executor", "sim")(engine.config, **engine.config.executor_options)
        execute = ex.execute

        def both(plan):
            out = execute(plan)
            shape = StepShape.from_plan(plan, None, ex.pad_waste)
            graphs = shape.num_prefills == 0 and shape.num_seqs <= ex.graph_max_seqs
            self.pairs.append((out.step_time, ex.cost_model.step_time(shape, ex.block_size,
                                                                      graphs)))
            ref = twin.execute(SchedulerOutput(plan.scheduled, plan.preempted, plan.swap_out))
            self.pairs.append((out.step_time, ref.step_time))
            self.tokens.append((out.sampled_token_ids, ref.sampled_token_ids))
            t = plan.totals
            self.kinds.add("mixed" if t.num_prefill_tokens and t.num_decode_tokens
                           else "prefill" if t.num_prefill_tokens else "decode")
            if t.num_sampled < len(plan.scheduled):
                self.kinds.add("partial")
            if plan.swap_out or t.num_swap_in:
                self.kinds.add("swap")
            return out

        ex.execute = both


@pytest.mark.parametrize("cfg", [
    dict(preemption_mode="swap", max_num_seqs=24),
    dict(scheduler="chunked_prefill", max_num_batched_tokens=200, max_num_seqs=16),
], ids=["swap", "chunked"])
def test_the_step_shortcuts_cost_and_sample_what_the_plan_does(cfg):
    engine = Engine(EngineConfig(model="llama3_8b", num_kv_blocks=60, block_size=16,
                                 **SIM_H100, **cfg))
    seen = _BothWays(engine)
    work = build_workload({**WORKLOAD, "num_requests": 40}, engine.model_spec.vocab_size)
    run_workload(engine, work)
    assert seen.kinds >= ({"decode", "swap"} if "preemption_mode" in cfg
                          else {"decode", "mixed", "partial"})
    assert len(seen.pairs) == 2 * engine.counters().num_steps
    assert all(a == b for a, b in seen.pairs)  # bit for bit, whichever path a step took
    assert all(a == b for a, b in seen.tokens)
    assert any(None in a for a, _ in seen.tokens) is ("partial" in seen.kinds)


def test_stop_ids_are_never_sampled_on_either_path():
    def run(stops: list[int]) -> tuple[list[list[int]], _BothWays]:
        engine = Engine(EngineConfig(model="llama3_8b", scheduler="chunked_prefill",
                                     max_num_batched_tokens=200, **SIM_H100))
        seen = _BothWays(engine)
        reqs = [engine.add_request(list(range(2, 92 + 7 * i)), SamplingParams(
            max_tokens=12, ignore_eos=True, stop_token_ids=stops if i % 3 == 0 else []))
            for i in range(9)]
        engine.run_until_done()
        return [r.output_token_ids for r in reqs], seen

    plain, _ = run([])
    stops = plain[0][:9]
    out, seen = run(stops)
    assert all(a == b for a, b in seen.pairs) and all(a == b for a, b in seen.tokens)
    assert "mixed" in seen.kinds
    assert all(len(o) == 12 and not set(o) & set(stops) for o in out[::3])
    assert out[1] == plain[1]  # a request without stop ids samples as before


def test_a_host_clock_on_the_simulator_is_refused_with_a_sentence():
    """The simulator moves time by its predicted step durations: an engine built on a host
    clock (wall or CPU time) is refused when it is built, naming the clock it needs, instead
    of failing at its first step."""
    from schedlab.clock import CPUTimeClock, PacedClock

    cfg = EngineConfig(model="llama3_8b", executor="sim", executor_options={"hardware": "h100"})
    with pytest.raises(ConfigError, match="executor=sim runs on a VirtualClock.*CPUTimeClock"):
        Engine(cfg, clock=CPUTimeClock())
    eng = Engine(cfg, clock=PacedClock())  # a virtual clock (serve paces one): accepted
    eng.add_request([5, 6, 7])
    eng.run_until_done()
    assert eng.clock.now() > 0


def test_the_cpu_preset_is_measured_once_per_machine_and_imports_no_torch_after(tmp_path):
    """`hardware=cpu` (and no hardware) keeps this machine's probe in the cache directory:
    two runs simulate the same system (each measured its own before: the README promises
    repeatable simulated runs), and a later process takes it without importing torch."""
    import json
    import os
    import subprocess
    import sys

    from schedlab.sim.hardware import CPU_PROBE_FILE

    env = dict(os.environ, SCHEDLAB_CACHE=str(tmp_path))
    code = ("import json, sys; from schedlab.sim.hardware import resolve_hardware; "
            "p = resolve_hardware(None); "
            "print(json.dumps([p.matmul_flops, p.mem_bandwidth, 'torch' in sys.modules]))")

    def probe() -> list:
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                             text=True, check=True).stdout
        return json.loads(out)

    first = probe()
    kept = json.loads((tmp_path / CPU_PROBE_FILE).read_text())
    assert kept["profile"]["matmul_flops"] == first[0] and first[2] is True  # measured
    assert probe() == [first[0], first[1], False]  # kept: the same, no torch
    kept["machine"] = "another machine"
    (tmp_path / CPU_PROBE_FILE).write_text(json.dumps(kept))
    assert probe()[2] is True  # measured again


def test_an_unknown_sim_option_is_named_as_an_option_not_a_hardware_field():
    """`executor.options.foo=1` was refused as an unknown hardware field, listing only those."""
    from schedlab.config import ConfigError, EngineConfig
    from schedlab.engine import Engine

    with pytest.raises(ConfigError, match=r"executor=sim: unknown option\(s\) \['foo'\]; "
                                          r"accepted: hardware, tp, dtype, tokenizer, and any "
                                          r"hardware profile field"):
        Engine(EngineConfig(model="llama3_8b", executor="sim",
                            executor_options={"hardware": "h100", "foo": 1}))
    e = Engine(EngineConfig(model="llama3_8b", executor="sim",
                            executor_options={"hardware": "h100", "step_overhead": 0.002}))
    assert e.executor.hardware.step_overhead == 0.002
