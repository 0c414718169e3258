"""A streaming run's step records (`driver.save_detailed=false`): taken from the engines as the
run goes, handed on in the detailed run's step order, counted into the same engine metrics and
instance peaks, and not kept; steps.csv's writer and reader."""

from __future__ import annotations

import csv
import dataclasses
import gc
from operator import attrgetter

import numpy as np
import pytest

import schedlab.cli.steps_csv as steps_csv
import schedlab.cluster.record as record
from schedlab.cluster import Cluster, ClusterConfig
from schedlab.config import EngineConfig
from schedlab.engine import Engine
from schedlab.runs.driver import run_workload
from schedlab.runs.metrics import compute_metrics
from schedlab.runs.workload import build_workload
from schedlab.stats import StepStats

#: one engine, replicas (round robin and least loaded), 1P+1D
LAYOUTS = {"one": None, "replicas": {"num_instances": 3},
           "least_loaded": {"num_instances": 3, "router": "least_loaded"},
           "pd": {"num_instances": None, "prefill_instances": 1, "decode_instances": 1}}
#: the simulated numbers of a step (the host-time fields vary from run to run)
SIMULATED = attrgetter(*[f.name for f in dataclasses.fields(StepStats)
                         if f.name == "step_time" or not f.name.endswith("_time")])


def _target(layout):
    ec = EngineConfig(model="llama3_8b", executor="sim", executor_options={"hardware": "h100"},
                      num_kv_blocks=256)
    return Engine(ec) if layout is None else Cluster(ClusterConfig(**layout), ec)


def _run(layout, detailed: bool, num_requests: int = 60, **kw):
    wl = build_workload({"type": "synthetic", "num_requests": num_requests,
                         "input_len": {"dist": "uniform", "min": 16, "max": 400},
                         "output_len": {"dist": "uniform", "min": 2, "max": 40},
                         "arrival": {"process": "poisson", "rate": 60.0}}, 128_256, seed=3)
    target = _target(layout)
    run = run_workload(target, wl, save_detailed=detailed, **kw)
    return target, run


def _host_free(m: dict) -> dict:
    return {k: v for k, v in m.items() if not (k.startswith("mean_") and k.endswith("_time_ms")
                                               and k != "mean_step_time_ms")}


def _live_step_records() -> int:
    gc.collect()
    # NOTE: inside a run the collection froze what it found alive (`frozen_survivors`), which
    # `gc.get_objects()` does not list: back in the oldest generation to be counted
    gc.unfreeze()
    return sum(type(o) is StepStats for o in gc.get_objects())


@pytest.mark.parametrize("drain", [1, 7, 4096])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_streaming_run_hands_on_the_detailed_runs_steps_in_its_order(layout, drain,
                                                                       monkeypatch):
    """Every step, in the order steps.csv has for a detailed run (by time, ties by the lower
    instance), however often the records are taken; the same engine metrics (KV use, batch,
    step time, to the last bit) and each instance's peak KV in results.json's `cluster`."""
    monkeypatch.setattr(record, "DRAIN_STEPS", drain)
    full_target, full = _run(LAYOUTS[layout], True)
    handed: list[StepStats] = []
    target, streamed = _run(LAYOUTS[layout], False, steps_out=handed.extend)
    assert len(full.step_stats) > 100
    assert list(map(SIMULATED, handed)) == list(map(SIMULATED, full.step_stats))
    assert streamed.step_stats == []
    engine_keys = {"num_steps", "peak_kv_used_blocks", "mean_kv_usage_pct", "mean_batch_size",
                   "mean_num_running", "max_num_running", "mean_step_time_ms",
                   "kv_waste_pct", "mean_tokens_per_step", "mean_num_waiting"}
    m_full, m_streamed = compute_metrics(full), compute_metrics(streamed)
    assert engine_keys <= set(m_streamed)
    for k in set(_host_free(m_streamed)):
        assert m_streamed[k] == m_full[k], k
    if layout != "one":
        assert ([dataclasses.asdict(s) for s in target.result_with_summary(streamed).instances]
                == [dataclasses.asdict(s)
                    for s in full_target.result_with_summary(full).instances])


@pytest.mark.parametrize("drain", [1, 7, 4096])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_detailed_run_hands_on_its_steps_as_it_goes_in_its_order(layout, drain,
                                                                    monkeypatch):
    """steps.csv's rows of a detailed run go to its writer while the run goes (every
    `DRAIN_STEPS` steps, the rest at the end), each once, in the order of the run's own
    `step_stats`, which the run keeps whole; the engine metrics counted as they went equal
    those of a run that hands nothing on, to the last bit; a second run on the same target
    hands on only its own steps."""
    monkeypatch.setattr(record, "DRAIN_STEPS", drain)
    handed: list[StepStats] = []
    calls: list[int] = []

    def out(steps):
        calls.append(len(steps))
        handed.extend(steps)

    target, run = _run(LAYOUTS[layout], True, steps_out=out)
    assert len(run.step_stats) > 100
    assert len(handed) == len(run.step_stats)
    assert all(a is b for a, b in zip(handed, run.step_stats, strict=True))
    if drain < 100:
        assert len(calls) > 10  # as the run went, not all at the end
    _, untapped = _run(LAYOUTS[layout], True)
    assert run.step_totals is not None and untapped.step_totals is None
    assert _host_free(compute_metrics(run)) == _host_free(compute_metrics(untapped))
    wl = build_workload({"type": "synthetic", "num_requests": 20, "input_len": 32,
                         "output_len": 8, "arrival": {"process": "poisson", "rate": 60.0}},
                        128_256, seed=4)
    handed.clear()
    again = run_workload(target, wl, save_detailed=True, steps_out=out)
    assert all(a is b for a, b in zip(handed, again.step_stats, strict=True))
    assert len(handed) == len(again.step_stats) > 0


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_streaming_run_keeps_no_step_records(layout, monkeypatch):
    """Memory stays flat however long the run: a streaming run holds a bounded number of
    step records while it runs (about `DRAIN_STEPS`, here 8) and none once it returned,
    while its metrics count every step."""
    monkeypatch.setattr(record, "DRAIN_STEPS", 8)
    before = _live_step_records()
    most = [0]

    def out(steps):
        most[0] = max(most[0], _live_step_records() - before - len(steps))

    _, run = _run(LAYOUTS[layout], False, num_requests=120, steps_out=out)
    m = compute_metrics(run)
    assert m["num_steps"] > 20 * 8
    assert _live_step_records() <= before
    assert most[0] <= 4 * 8, most[0]


def test_a_second_run_on_a_cluster_reports_the_same_instance_peaks_in_both_modes():
    """An instance's summary covers its engine's life (its `num_steps` does): a streaming run
    took the first run's step records, and the second run's peak KV still counts them."""

    def work(lo, hi, seed):
        return build_workload({"type": "synthetic", "num_requests": 20,
                               "input_len": {"dist": "uniform", "min": lo, "max": hi},
                               "output_len": 8, "arrival": {"process": "poisson", "rate": 50.0}},
                              128256, seed=seed)

    summaries = []
    for detailed in (True, False):
        cluster = _target({"num_instances": 2})
        run_workload(cluster, work(1500, 2000, 1), save_detailed=detailed)  # big prompts
        run = run_workload(cluster, work(10, 20, 2), save_detailed=detailed)  # small ones
        summaries.append(cluster.result_with_summary(run).summary()["instances"])
    detailed, streaming = summaries
    assert streaming == detailed
    assert min(i["peak_kv_used_blocks"] for i in streaming) > 50  # the big prompts' blocks


def test_an_idle_instance_holds_back_only_what_it_could_precede():
    """A record goes out once no instance can still write an earlier one: an instance idle at
    clock 5 holds back the busy one's steps after 5, not those before; the end hands on
    the rest, by time (ties: the lower instance)."""

    class Inst:
        def __init__(self, t):
            self.t, self.engine = t, self
            self.drained_kv_peak = 0

        def now(self):
            return self.t

        def drain_step_stats(self):
            out, self.steps = self.steps, []
            return out

    def st(n, t, blocks=1):
        return StepStats(n, t, 0.0, 1, 0, 1, 0, 1, 1, 0, blocks, 0, 0, 0, 0)

    a, b = Inst(5.0), Inst(9.0)
    a.steps = [st(1, 1.0), st(2, 5.0)]
    b.steps = [st(1, 2.0), st(2, 5.0, blocks=7), st(3, 9.0)]
    stream = record.StepStream([a, b], [0, 0])
    got: list[StepStats] = []
    stream.out = got.extend
    stream.take()
    # (5.0, a) ties with a's clock: held; b's 5.0 comes after a's 5.0
    assert [(s.time, s.step) for s in got] == [(1.0, 1), (2.0, 1)]
    assert stream.held() == 3
    stream.take(final=True)
    assert [(s.time, s.step) for s in got] == [(1.0, 1), (2.0, 1), (5.0, 2), (5.0, 2),
                                                (9.0, 3)]
    assert got[2] is not got[3] and got[3].kv_used_blocks == 7
    assert [a.drained_kv_peak, b.drained_kv_peak] == [1, 7] and stream.totals.num_steps == 5
    assert stream.totals.max_num_running == 2  # both running at 5.0


def test_step_totals_equal_the_whole_lists_metrics_bit_for_bit():
    """The engine metrics summed a chunk at a time equal those of the whole list: np.mean of
    the step times over one float64 column, the integer means exact."""
    from schedlab.stats import StepTotals

    rng = np.random.default_rng(0)
    steps = [StepStats(i, float(i), float(rng.random() * 0.03), int(rng.integers(0, 300)),
                       int(rng.integers(0, 50)), 7, 3, 4, int(rng.integers(1, 256)), 0,
                       int(rng.integers(0, 10**6)), 0, 0, 11, 9, float(rng.random()))
             for i in range(10_001)]
    whole = StepTotals.of(steps)
    parts = StepTotals()
    for at in range(0, len(steps), 333):
        parts.add(steps[at:at + 333])
    n = len(steps)
    step_times = [s.step_time for s in steps]
    assert float(np.mean(np.frombuffer(parts.step_time))) == float(np.mean(step_times))
    assert parts.kv_used_blocks / n == float(np.mean([s.kv_used_blocks for s in steps]))
    assert parts.mean("num_scheduled_seqs") == float(np.mean([s.num_scheduled_seqs
                                                              for s in steps]))
    assert parts.phase_metrics() == whole.phase_metrics()
    assert parts.peak_kv_used_blocks == max(s.kv_used_blocks for s in steps)


def _steps(n: int) -> list[StepStats]:
    steps = [StepStats(i, 0.0, 0.0, i % 5, 0, 3 * i, i, 2 * i, i % 7, 0, i, 100 - i, 0, 0, 0)
             for i in range(n)]
    for i, s in enumerate(steps):
        s.time, s.step_time, s.framework_time = i / 7, 1e-5 / (i + 1), 2.5e-17 * i
    return steps


def _reference(path, steps) -> bytes:
    names = [f.name for f in dataclasses.fields(StepStats)]
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(names)
        w.writerows(map(attrgetter(*names), steps))
    return path.read_bytes()


@pytest.mark.parametrize("child", [True, False])
def test_steps_csv_is_what_the_csv_module_writes_however_the_steps_come(tmp_path, monkeypatch,
                                                                        child):
    """steps.csv, written by its writer process (or in this one) a list at a time, is byte
    for byte what `csv.writer` writes of all the steps at once, plugin values (numpy floats,
    a None, an object that does not pickle) included; it reads back as the same numbers."""
    steps = _steps(100)
    steps[20].step_time, steps[21].time = np.float64(0.1), np.float32(0.25)
    steps[22].forward_time = None

    class Odd(float):  # pickles by reference to a class the writer process cannot import
        pass

    steps[60].sample_time = Odd(0.5)
    monkeypatch.setattr(steps_csv, "ROWS_PER_WRITE", 8)  # several writes per list
    with steps_csv.StepsCsv(tmp_path / "steps.csv", child=child) as out:
        for at in (0, 3, 50, 51, 100):
            out(steps[at:at + {0: 3, 3: 47, 50: 1, 51: 49, 100: 0}[at]])
    assert (tmp_path / "steps.csv").read_bytes() == _reference(tmp_path / "ref.csv", steps)
    back = list(steps_csv.read_steps_csv(tmp_path / "steps.csv"))
    plain = [s for i, s in enumerate(steps) if i not in (20, 21, 22, 60)]
    assert [b for i, b in enumerate(back) if i not in (20, 21, 22, 60)] == plain
    assert back[22].forward_time is None
    with steps_csv.StepsCsv(tmp_path / "empty.csv", child=child):
        pass
    assert (tmp_path / "empty.csv").read_text().splitlines() == [
        ",".join(f.name for f in dataclasses.fields(StepStats))]


def test_a_value_of_a_class_the_writer_cannot_import_is_written_as_csv_writes_it(
        tmp_path, monkeypatch):
    """A step value of a plugin's class that pickles (by reference to a module only this
    process can import, as a script's `__main__` is) is written as `csv.writer` writes it;
    the writer process imports nothing of the plugin's."""
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "my_floats.py").write_text(
        "import enum\n"
        "class Seconds(float):\n    def __str__(self):\n        return f'{float(self):.3f}s'\n"
        "class Tick(float):\n    def __call__(self):\n        return 0\n"
        "class Color(str, enum.Enum):\n    RED = 'red'\n")
    monkeypatch.syspath_prepend(str(tmp_path / "mine"))
    from my_floats import Color, Seconds, Tick

    steps = _steps(10)
    steps[4].step_time, steps[5].step_time, steps[6].step_time = Seconds(0.25), Tick(2.0), Color.RED
    steps[7].forward_time = (1, np.float64(2.0))  # csv.writer writes the tuple's str
    with steps_csv.StepsCsv(tmp_path / "steps.csv") as out:
        out(steps)
    written = (tmp_path / "steps.csv").read_bytes()
    assert written == _reference(tmp_path / "ref.csv", steps)
    assert b",0.250s," in written and b",red," in written and b'"(1, np.float64(2.0))"' in written


def test_a_failed_steps_csv_writer_is_one_clear_error(tmp_path, monkeypatch):
    """The writer process's failure surfaces in the run as an error naming the file and the
    writer's own last words, not as a broken pipe."""
    monkeypatch.setattr(steps_csv, "_WRITER", "import sys; sys.exit('disk full, say')")
    out = steps_csv.StepsCsv(tmp_path / "steps.csv")
    with pytest.raises(RuntimeError, match=r"steps\.csv could not be written.*disk full, say"):
        for _ in range(200):  # until the pipe breaks, or at the close
            out(_steps(50))
        out.close()
