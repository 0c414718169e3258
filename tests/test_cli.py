"""The `schedlab` command: runs, sweeps, W&B files, a third-party plugin, bad configurations.

One subprocess smoke per command (each pays for importing torch and transformers); the rest
calls the command's `main` in this process, which runs the same Hydra code path.
"""

from __future__ import annotations

import csv
import json
import math
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from schedlab.cli import main

ROOT = Path(__file__).resolve().parents[1]
SCHEDLAB = [sys.executable, "-c", "import sys; from schedlab.cli import main; sys.exit(main())"]
FIXTURE_PLUGIN = ROOT / "tests" / "fixtures" / "schedlab_example_plugin"
SMALL = ["workload.num_requests=6", "workload.input_len.max=48", "workload.output_len.max=12",
         "driver.progress=false", "print_table=false"]


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    """A model cache with the default tiny model already built (subprocesses share it)."""
    from schedlab.tiny import build_tiny_model

    d = tmp_path_factory.mktemp("schedlab-cache")
    build_tiny_model(d / "llama-tiny-s0", family="llama", size="tiny", seed=0)
    return d


def schedlab(args: list[str], cwd: Path, cache: Path, pythonpath: str | None = None,
             timeout: int = 300) -> subprocess.CompletedProcess:
    env = dict(os.environ, SCHEDLAB_CACHE=str(cache), WANDB_MODE="offline", HYDRA_FULL_ERROR="")
    env.pop("HYDRA_FULL_ERROR")
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    return subprocess.run([*SCHEDLAB, *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


def cli(args: list[str], capsys) -> tuple[int, str, str]:
    """`schedlab ARGS` in this process: (exit status, stdout, stderr)."""
    try:
        rc = main(args)
    except SystemExit as e:  # Hydra exits by itself on overrides it cannot compose
        rc = e.code if isinstance(e.code, int) else 1
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.fixture
def in_process(cache, monkeypatch):
    """The environment `schedlab()` gives its subprocess, for `cli()`."""
    monkeypatch.setenv("SCHEDLAB_CACHE", str(cache))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)


def _ok(p: subprocess.CompletedProcess) -> None:
    assert p.returncode == 0, f"exit {p.returncode}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}"


# ---- reading an offline W&B run (its .wandb file is a LevelDB-style log of protobufs) ---------
def wandb_records(run_dir: Path):
    from wandb.proto import wandb_internal_pb2 as pb

    (path,) = run_dir.glob("wandb/offline-run-*/run-*.wandb")
    data = path.read_bytes()
    assert data[:4] == b":W&B"
    block, pos, buf = 32768, 7, b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _, n, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0 and n == 0:
            pos += left
            continue
        buf += data[pos + 7:pos + 7 + n]
        pos += 7 + n
        if kind in (1, 4):  # a full record, or the last piece of one
            rec = pb.Record()
            rec.ParseFromString(buf)
            buf = b""
            yield rec


def read_wandb_run(run_dir: Path) -> dict:
    """group, config, final summary and number of logged steps of an offline run."""
    out = {"config": {}, "summary": {}, "history": 0, "group": None}
    for rec in wandb_records(run_dir):
        kind = rec.WhichOneof("record_type")
        if kind == "run":
            out["group"] = rec.run.run_group
            for item in rec.run.config.update:
                out["config"][item.key] = json.loads(item.value_json)
        elif kind == "summary":
            for item in rec.summary.update:
                key = item.key or "/".join(item.nested_key)
                out["summary"][key] = json.loads(item.value_json)
        elif kind == "history":
            out["history"] += 1
            out.setdefault("history_keys", set()).update(
                item.key or "/".join(item.nested_key) for item in rec.history.item)
    out["config"].pop("_wandb", None)
    return out


def assert_summary_matches(summary: dict, results: dict) -> None:
    scalars = {k: v for k, v in results.items() if isinstance(v, int | float | str | bool)
               and not (isinstance(v, float) and not math.isfinite(v))}
    assert scalars
    for k, v in scalars.items():
        assert k in summary, f"{k} missing from the W&B summary"
        assert summary[k] == (pytest.approx(v) if isinstance(v, float) else v), k


# ---- subprocess: what a user types ------------------------------------------------------------
def test_run_writes_results_and_plots(tmp_path, cache):
    run_dir = tmp_path / "run"
    p = schedlab(["run", *SMALL, "print_table=true", "logger=none", f"hydra.run.dir={run_dir}"],
                 tmp_path, cache)
    _ok(p)
    assert "Successful requests:" in p.stdout
    results = json.loads((run_dir / "results.json").read_text())
    assert results["completed"] == 6
    assert results["config"]["scheduler"]["name"] == "continuous"
    assert results["config"]["kv_allocator"]["name"] == "paged"
    assert list(run_dir.glob("**/*.png")), "no plots written"
    assert not (run_dir / "wandb").exists(), "logger=none must not open W&B"


def test_multirun_grid_with_wandb(tmp_path, in_process, capsys):
    sweep = tmp_path / "sweep"
    rc, _, err = cli(["run", "-m", "scheduler=static,continuous", "kv_allocator=contiguous",
                      *SMALL, "plots=false", f"hydra.sweep.dir={sweep}"], capsys)
    assert rc == 0, err
    jobs = sorted(d for d in sweep.iterdir() if d.is_dir() and d.name.isdigit())
    assert [d.name for d in jobs] == ["0", "1"]
    combos, groups = set(), set()
    for d in jobs:
        results = json.loads((d / "results.json").read_text())
        cfg = results["config"]
        combos.add((cfg["scheduler"]["name"], cfg["kv_allocator"]["name"]))
        run = read_wandb_run(d)
        assert run["config"] == cfg
        assert_summary_matches(run["summary"], results)
        assert run["history"] > 0, "no per-step series logged"
        assert {"running", "waiting", "scheduled_tokens", "kv_used_blocks",
                "step_time_ms"} <= run["history_keys"]
        (table,) = d.glob("wandb/offline-run-*/files/media/table/requests_*.table.json")
        table = json.loads(table.read_text())
        assert len(table["data"]) == 6 and "input_lens" in table["columns"]
        groups.add(run["group"])
    assert combos == {("static", "contiguous"), ("continuous", "contiguous")}
    assert len(groups) == 1 and groups != {""}, f"runs of one sweep must share a group: {groups}"


def _history(run_dir: Path) -> list[dict]:
    """The per-step series W&B logged, one dict per step (its host-time key and the
    per-request table, logged at the end, left out)."""
    rows = []
    for rec in wandb_records(run_dir):
        if rec.WhichOneof("record_type") == "history":
            row = {item.key or "/".join(item.nested_key): json.loads(item.value_json)
                   for item in rec.history.item}
            if "running" in row:
                rows.append({k: v for k, v in row.items()
                             if k not in ("framework_time_ms", "_timestamp", "_runtime")
                             and not k.startswith("requests")})
    return rows


def test_a_streaming_run_writes_what_a_detailed_one_does(tmp_path, in_process, capsys):
    """driver.save_detailed=false, which keeps no step record: the same steps.csv (every
    simulated column), results.json (but the per-request lists), timeline plot and per-step
    W&B series as the detailed run, on 1P+1D (two instances' steps interleaved)."""
    host = {"framework_time", "schedule_time", "prepare_time", "forward_time",
            "device_wait_time", "sample_time", "update_time"}
    runs = {}
    for detailed in (True, False):
        d = tmp_path / ("detailed" if detailed else "streaming")
        rc, _, err = cli(["run", "executor=sim", "model=llama3_8b", "hardware=h100",
                          "cluster=disaggregated", "workload.num_requests=24",
                          "workload.arrival.rate=30", "logger=wandb", "plots=true",
                          f"driver.save_detailed={str(detailed).lower()}",
                          "driver.progress=false", "print_table=false",
                          f"hydra.run.dir={d}"], capsys)
        assert rc == 0, err
        with open(d / "steps.csv", newline="") as f:
            rows = list(csv.DictReader(f))
        results = json.loads((d / "results.json").read_text())
        runs[detailed] = ([{k: v for k, v in r.items() if k not in host} for r in rows],
                          {k: v for k, v in results.items()
                           if k not in ("date", "output_dir", "environment", "config")
                           and not (k.startswith("mean_") and k.endswith("_time_ms")
                                    and k != "mean_step_time_ms")},
                          (d / "plots" / "timeline.png").read_bytes(), _history(d))
    (steps, results, png, history), (s_steps, s_results, s_png, s_history) = (
        runs[True], runs[False])
    assert len(steps) > 50 and s_steps == steps
    assert set(results) - set(s_results) == {"input_lens", "output_lens", "ttfts", "tpots",
                                             "e2els", "itls", "errors"}
    assert s_results == {k: v for k, v in results.items() if k in s_results}
    assert s_png == png
    # NOTE: W&B keeps a step number's first row (the two engines number their steps apart)
    assert len(history) > 50 and s_history == history


def test_third_party_plugin_package(tmp_path, cache):
    src = tmp_path / "src"
    shutil.copytree(FIXTURE_PLUGIN, src)  # pip builds in the source tree; keep the repo clean
    target = tmp_path / "site"
    pip = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation",
         "--no-index", "--quiet", "--target", str(target), str(src)],
        capture_output=True, text=True, timeout=300)
    assert pip.returncode == 0, pip.stderr
    listing = schedlab(["plugins"], tmp_path, cache, pythonpath=str(target))
    _ok(listing)
    assert "lifo" in listing.stdout and "prefill_first" in listing.stdout
    run_dir = tmp_path / "run"
    p = schedlab(["run", "queue=lifo", "scheduler=prefill_first", *SMALL, "logger=none",
                  "plots=false", f"hydra.run.dir={run_dir}"], tmp_path, cache,
                 pythonpath=str(target))
    _ok(p)
    results = json.loads((run_dir / "results.json").read_text())
    assert results["completed"] == 6
    assert results["config"]["queue"]["name"] == "lifo"
    assert results["config"]["scheduler"]["name"] == "prefill_first"


BAD = {
    "unknown-group-option": (["scheduler=nonesuch"],
                             ["scheduler='nonesuch'", "continuous", "static"]),
    "unknown-plugin-name": (["queue.name=nonesuch"], ["queue.name='nonesuch'", "fcfs"]),
    "out-of-range": (["engine.block_size=3"], ["engine.block_size=3", "power of two"]),
    "wrong-type": (["engine.max_num_seqs=many"], ["engine.max_num_seqs='many'", "integer"]),
    "incompatible": (["prefix_cache=hash_block", "kv_allocator=contiguous"],
                     ["prefix_cache='hash_block'", "kv_allocator='contiguous'"]),
    "unknown-key": (["engine.blok_size=3"], ["engine.blok_size"]),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_configuration_fails_cleanly(case, tmp_path, in_process, capsys):
    overrides, expected = BAD[case]
    rc, _, err = cli(["run", *overrides, "logger=none", f"hydra.run.dir={tmp_path / 'run'}"],
                     capsys)
    assert rc != 0
    assert "Traceback" not in err, err
    for text in expected:
        assert text in err, f"{text!r} not in:\n{err}"
    assert not (tmp_path / "run" / "results.json").exists()


@pytest.mark.slow
def test_sweep_on_submitit_local(tmp_path, cache):
    sweep = tmp_path / "sweep"
    p = schedlab(["run", "-m", "hydra/launcher=submitit_local", "hydra.launcher.timeout_min=10",
                  "scheduler=static,continuous", *SMALL, "logger=none", "plots=false",
                  f"hydra.sweep.dir={sweep}"], tmp_path, cache, timeout=900)
    _ok(p)
    for job in ("0", "1"):
        results = json.loads((sweep / job / "results.json").read_text())
        assert results["completed"] == 6


def test_logger_none_never_imports_wandb(tmp_path):
    code = ("import sys; from schedlab.runs.tracking import TrackingConfig, open_tracker; "
            f"t = open_tracker(TrackingConfig(backend='none'), {str(tmp_path)!r}, {{}}); "
            "t.finish({'completed': 1}); assert 'wandb' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
    assert not (tmp_path / "wandb").exists()


# ---- in-process ----------------------------------------------------------------------------
def test_usage_and_unknown_command(capsys):
    assert main([]) == 2
    assert "schedlab run" in capsys.readouterr().out
    assert main(["frobnicate"]) == 2
    assert "unknown command 'frobnicate'" in capsys.readouterr().err


def test_plugins_lists_every_interface(capsys):
    assert main(["plugins"]) == 0
    out = capsys.readouterr().out
    for kind, names in {"scheduler": ["static", "continuous"], "queue": ["fcfs"],
                        "kv_allocator": ["paged", "contiguous"], "executor": ["torch"]}.items():
        assert f"{kind} (" in out
        for n in names:
            assert f"  {n} " in out


def test_delegated_subcommands_resolve_to_modules_with_main():
    import importlib

    from schedlab.cli import DELEGATES

    for cmd in ("calibrate", "validate", "report"):
        module, _ = DELEGATES[cmd]
        assert callable(importlib.import_module(module).main), cmd


def test_run_in_process_returns_metrics(tmp_path, llama_dir):
    from hydra import compose, initialize_config_module

    from schedlab.cli.app import run

    with initialize_config_module("schedlab.conf", version_base="1.3"):
        cfg = compose("config", overrides=[
            "model=path", f"model.path={llama_dir}", "logger=none", "plots=false",
            f"paths.output_dir={tmp_path}", "workload.num_requests=3", *SMALL[1:]])
    metrics = run(cfg)
    assert metrics["completed"] == 3
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["completed"] == 3 and saved["config"]["model"]["path"] == llama_dir


def test_missing_hardware_is_one_sentence(tmp_path, in_process, monkeypatch, capsys):
    """attention=triton on a CPU without the interpreter, or device=cuda without a GPU: the
    engine cannot start; the command says why in one line, exit 2, no traceback."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present: both configurations would run")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    for overrides, expected in (
        (["attention=triton"], "set TRITON_INTERPRET=1 before starting"),
        (["engine.device=cuda"], "torch sees no CUDA device"),
    ):
        rc, _, err = cli(["run", *overrides, *SMALL, "logger=none", "plots=false",
                          f"hydra.run.dir={tmp_path / 'run'}"], capsys)
        assert rc == 2, err
        assert "Traceback" not in err and expected in err, err
        assert not (tmp_path / "run" / "results.json").exists()


#: the reviewer's command line (a simulated run: nothing to build)
SIM = ["executor=sim", "model=llama3_8b", "hardware=h100", "logger=none", "plots=false",
       "print_table=false", "driver.progress=false", "workload.num_requests=4"]
ONE_SENTENCE = {  # overrides -> the start of the one line the command prints
    # a key not in the composed config, without + (Hydra's five lines and exit 1 before)
    "engine.foo=1": "engine.foo is not a key of engine; accepted: block_size, max_num_seqs,",
    "workload.foo=1": "workload.foo is not a key of a type=synthetic workload; accepted: type,",
    "workload.arrival.foo=1": "workload.arrival.foo is not a key of workload.arrival; "
                              "accepted: process, rate, burstiness",
    "metrics.foo=1": "metrics.foo is not a key of metrics; accepted: percentiles, slo",
    "driver.foo=1": "driver.foo is not a key of driver; accepted: max_concurrency, progress,",
    "cluster.foo=1": "cluster.foo is not a key of cluster; accepted: name, num_instances,",
    "router.foo=1": "router.foo is not a key of router; accepted: name, options",
    "hardware.foo=1": "hardware.foo is not a key of hardware; accepted: preset, path,",
    "sampling.foo=1": "sampling.foo is not a key of sampling; accepted: temperature, ignore_eos",
    "foo=1": "foo is not a key of the config; accepted: seed,",
    "workload.priority_levels=3": "workload.priority_levels is not in the composed config; add "
                                  "it with +workload.priority_levels=3",
    "queue.options.foo=1": "queue.options.foo is not in the composed config; queue.options "
                           "takes keys of its own: add it with +queue.options.foo=1",
    "-m engine.foo=1,2": "engine.foo is not a key of engine;",
    # added with +, or a value no reader takes (exit 0 or a numpy traceback before)
    "+workload.arrival.burstines=2 workload.arrival.process=gamma":
        "workload.arrival.burstines is not a key of workload.arrival; accepted: process, rate, "
        "burstiness",
    "+driver.max_concurency=2": "driver.max_concurency is not a key of the driver section;",
    "+foo=1": "foo is not a key of the config; accepted: seed,",
    "+workload.clients=[{id:a,wieght:3}]": "workload.clients[0].wieght (client 'a') is not a "
                                           "key of a client; accepted: id, weight,",
    "sampling.ignore_eos=maybe": "sampling.ignore_eos='maybe'; accepted: true, false",
    "plots=maybe": "plots='maybe'; accepted: true, false",
    "seed=-1": "seed=-1 must be an integer >= 0",
    "workload.input_len.max=nan": "workload.input_len.max=nan must be a number (or inf), not NaN",
    "workload.input_len.dist=uniform +workload.input_len.alpha=2":
        "workload.input_len.alpha is not read by a dist=uniform length spec; accepted: dist, min, "
        "max, mean, range_ratio",
    # a choice of a group that holds no plugins (Hydra's search-path dump and exit 1 before)
    "hardware=h900": "hardware='h900' is not a hardware config; configs: a100, calibrated, cpu, "
                     "h100, h200",
    "experiment=foo": "experiment='foo' is not an experiment config; configs: chunked_prefill,",
    "-m workload=synthetic,foo": "workload='foo' is not a workload config; configs: azure,",
    "executor=foo": "executor='foo' is not an executor config; configs: sim, torch; installed "
                    "executor plugins:",
    # options a reader took in silence or blamed on another (a run, or the hardware, before)
    "metrics.slo='ttft=200,ttft=100'": "metrics.slo='ttft=200,ttft=100': SLO ttft is given twice",
    "cluster=disaggregated cluster.num_instances=3":
        "cluster.num_instances=3 but prefill_instances + decode_instances = 2; set "
        "cluster.num_instances=null (or 2), or set prefill_instances and decode_instances",
    # sizes that would hang building them or run for ever (a run, or a numpy warning, before)
    "cluster=replicas cluster.num_instances=1000000000":
        "cluster.num_instances=1000000000: a cluster has at most 10,000 instances",
    "cluster=disaggregated cluster.num_instances=null cluster.prefill_instances=6000 "
    "cluster.decode_instances=6000":
        "cluster.prefill_instances=6000 + cluster.decode_instances=6000: a cluster has at most "
        "10,000 instances",
    "workload.arrival.rate=1e-300": "workload.arrival.rate=1e-300 spreads 4 arrivals over ",
    "workload.arrival.process=gamma workload.arrival.rate=1e-10 "
    "workload.arrival.burstiness=1e-300":
        "workload.arrival: rate=1e-10 x burstiness=1e-300 is too small to draw gaps from",
    "+workload.clients=[{id:a,count:100000000}]":
        "workload.clients[0].count=100000000 makes more than 1,000,000 clients in all",
}


@pytest.mark.parametrize("overrides", list(ONE_SENTENCE))
def test_bad_keys_and_values_are_one_sentence_exit_2(overrides, tmp_path, monkeypatch, capsys):
    """The README's promise: a bad config names the key and what is accepted, in one line
    `schedlab: error: ...`, exit 2, no traceback, nothing run."""
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    words = overrides.split()
    flags = [w for w in words if w == "-m"]  # NOTE: Hydra takes its flags before the overrides
    rc, _, err = cli(["run", *flags, *SIM, *(w for w in words if w != "-m"),
                      f"hydra.run.dir={tmp_path / 'run'}", f"hydra.sweep.dir={tmp_path / 'sweep'}"],
                     capsys)
    assert rc == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err and "HYDRA_FULL_ERROR" not in err, err
    assert lines[0].startswith(f"schedlab: error: {ONE_SENTENCE[overrides]}"), err
    assert not list(tmp_path.rglob("results.json"))


def test_serve_refuses_an_unknown_key_in_one_sentence(monkeypatch, capsys):
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    rc, _, err = cli(["serve", *SIM[:4], "engine.foo=1"], capsys)
    assert rc == 2
    assert err.startswith("schedlab: error: engine.foo is not a key of engine; accepted: "
                          "block_size,") and len(err.strip().splitlines()) == 1, err
