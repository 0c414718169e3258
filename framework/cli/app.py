"""`schedlab run`: a thin `@hydra.main` over a plain `run(cfg) -> metrics`."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig
from omegaconf.errors import OmegaConfBaseException

from schedlab.cli.settings import RunSettings, build_settings
from schedlab.config import ConfigError
from schedlab.registry import PluginError

CONFIG_PACKAGE = "pkg://schedlab.conf"


def user_errors() -> tuple[type[Exception], ...]:
    """Exceptions that mean a bad configuration or input, reported without a traceback."""
    from schedlab.runs.workload import WorkloadError

    return ConfigError, PluginError, WorkloadError, OmegaConfBaseException


#: messages of the jobs of this process that failed on a bad configuration
FAILURES: list[str] = []
#: what an interrupted job saved (the CLI prints it in its one line after Ctrl-C)
INTERRUPTED: list[str] = []


def run(cfg: DictConfig) -> dict[str, Any]:
    """Run one configuration: build the engine, drive the workload, write the results.

    Args:
        cfg: a composed config (`conf/config.yaml` plus overrides).

    Returns:
        The metrics (vLLM's benchmark keys), as written to `results.json`.

    Raises:
        ConfigError, PluginError, WorkloadError: a bad configuration, before any work starts.
    """
    group, name = _sweep_names()
    settings = build_settings(cfg, group=group, run_name=name)
    return execute(settings)


def execute(s: RunSettings) -> dict[str, Any]:
    """Run validated settings (see `run`)."""
    from schedlab.engine import Engine
    from schedlab.runs.driver import run_workload
    from schedlab.runs.metrics import compute_metrics
    from schedlab.runs.results import collect_environment, write_results
    from schedlab.runs.workload import build_workload

    seed_everything(s.seed)
    s.model.prepare()
    if s.cluster is not None:
        return _execute_cluster(s)
    try:
        engine = Engine(s.engine)
    except (ValueError, OSError, RuntimeError) as e:
        # e.g. an executor rejecting its options, attention=triton on a CPU without the
        # interpreter, engine.device=cuda without a GPU: one sentence, no traceback
        if isinstance(e, user_errors()):
            raise
        raise ConfigError(f"the engine could not be built from this config: {e}") from None
    seed_everything(s.seed)
    workload = build_workload(s.workload, engine.model_spec.vocab_size, seed=s.seed)

    s.output_dir.mkdir(parents=True, exist_ok=True)
    metrics: dict[str, Any] = {}
    summary: dict[str, Any] = {}
    try:
        try:
            result = run_workload(engine, workload, temperature=s.temperature,
                                  ignore_eos=s.ignore_eos, max_concurrency=s.max_concurrency,
                                  progress=s.progress)
        except KeyboardInterrupt:
            metrics = _save_interrupted(s, engine)
            raise
        metrics = compute_metrics(result, percentiles=s.percentiles, slo=s.slo)
        path = write_results(s.output_dir, metrics, s.config, collect_environment())
        summary = json.loads(path.read_text())  # W&B's summary = results.json's scalars
        if s.plots:
            from schedlab.runs.plots import write_plots

            write_plots(s.output_dir, result, metrics)
    except BaseException:
        _track(s, engine, summary or metrics, failed=True)
        raise
    _announce(s, metrics, path, _track(s, engine, summary))
    return metrics


def _execute_cluster(s: RunSettings) -> dict[str, Any]:
    """`execute` for N instances or prefill/decode disaggregation: one results.json for the
    whole cluster (vLLM's keys over every request) with each instance's counters under
    `cluster`; steps.csv and W&B get every instance's steps in time order."""
    from schedlab.cluster import Cluster
    from schedlab.runs.metrics import compute_metrics
    from schedlab.runs.results import collect_environment, write_results
    from schedlab.runs.workload import build_workload

    try:
        cluster = Cluster(s.cluster, s.engine)
    except (ValueError, OSError, RuntimeError) as e:
        if isinstance(e, user_errors()):
            raise
        raise ConfigError(f"the cluster could not be built from this config: {e}") from None
    vocab = cluster.instances[0].engine.model_spec.vocab_size
    workload = build_workload(s.workload, vocab, seed=s.seed)
    s.output_dir.mkdir(parents=True, exist_ok=True)
    try:
        result = cluster.run(workload, temperature=s.temperature, ignore_eos=s.ignore_eos)
    except KeyboardInterrupt:  # as `_save_interrupted`: partial results, then the one line
        result = cluster.interrupt()
        _write_interrupted(s, result.run, cluster=result.summary())
        raise
    metrics = compute_metrics(result.run, percentiles=s.percentiles, slo=s.slo)
    metrics["cluster"] = result.summary()
    path = write_results(s.output_dir, metrics, s.config, collect_environment())
    if s.plots:
        from schedlab.runs.plots import write_plots

        write_plots(s.output_dir, result.run, metrics)
    _announce(s, metrics, path, _track(s, result.run, json.loads(path.read_text())))
    return metrics


def _announce(s: RunSettings, metrics: dict[str, Any], path: Path, tracker) -> None:
    """The end of a run on the console: the metrics table, where the results and W&B are."""
    from schedlab.runs.results import format_table

    if s.print_table:
        print(format_table(metrics))
    print(f"results: {path}")
    if tracker.location:
        print(f"W&B run: {tracker.location}")


def _save_interrupted(s: RunSettings, engine) -> dict[str, Any]:
    """Ctrl-C mid-run: abort what is still in flight and write results.json over the requests
    submitted so far (`interrupted: true`); W&B gets the same, marked failed, in `execute`."""
    from schedlab.runs.driver import RunResult

    for rid, req in list(engine.requests.items()):
        if not req.is_finished:
            engine.abort(rid)
    c = engine.counters()
    reqs = list(engine.requests.values())
    start = min((r.arrival_time for r in reqs), default=0.0)
    queried = c.num_prefix_query_tokens
    result = RunResult(
        requests=reqs, duration_s=max(engine.clock.now() - start, 0.0),
        step_stats=list(engine.step_stats), num_preemptions=c.num_preemptions,
        prefix_hit_rate=c.num_prefix_hit_tokens / queried if queried else 0.0,
        start_time=start, num_kv_blocks=c.num_kv_blocks, block_size=engine.config.block_size,
        max_concurrency=s.max_concurrency, num_prefix_hit_tokens=c.num_prefix_hit_tokens,
        num_swaps=c.num_swaps)
    return _write_interrupted(s, result)


def _write_interrupted(s: RunSettings, run, **extra: Any) -> dict[str, Any]:
    """results.json of an interrupted run (`interrupted: true`, plus `extra`) and the one
    line the command prints at exit."""
    from schedlab.runs.metrics import compute_metrics
    from schedlab.runs.results import collect_environment, write_results

    metrics = compute_metrics(run, percentiles=s.percentiles, slo=s.slo)
    metrics.update(extra, interrupted=True)
    path = write_results(s.output_dir, metrics, s.config, collect_environment())
    INTERRUPTED.append(f"{metrics.get('completed', 0)} of {len(run.requests)} submitted "
                       f"requests completed; partial results: {path}")
    return metrics


def _track(s: RunSettings, engine, summary: dict[str, Any], failed: bool = False):
    """Open the tracker, replay the per-step series and close it, after the run.

    NOTE: W&B is opened only once the workload is done: its background service and a call
    per step would compete with the engine for the CPU and inflate the latencies measured.
    """
    from schedlab.runs.tracking import open_tracker

    write_steps_csv(s.output_dir / STEPS_FILE, engine.step_stats)
    tracker = open_tracker(s.tracking, s.output_dir, s.config)
    for stats in engine.step_stats:
        tracker.log_step(stats)
    tracker.finish(summary, failed=failed)
    return tracker


#: the per-step series in the run directory, whatever the logger (columns: `StepStats` fields)
STEPS_FILE = "steps.csv"


def write_steps_csv(path: Path, step_stats: list) -> Path:
    """One row per engine step, one column per `StepStats` field. Returns the path."""
    import csv
    import dataclasses

    from schedlab.stats import StepStats

    names = [f.name for f in dataclasses.fields(StepStats)]
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(names)
        w.writerows([getattr(st, n) for n in names] for st in step_stats)
    return path


def seed_everything(seed: int) -> None:
    """Seed python, numpy and, once this process has imported it, torch (the engine seeds its
    own sampler from the config). A simulated run never imports torch, so it is not seeded
    here: `execute` seeds again once the engine is built."""
    import numpy as np

    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.manual_seed(seed)


def _sweep_names() -> tuple[str | None, str | None]:
    """(W&B group, run name) from Hydra's runtime: a sweep's runs share its directory name."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized():
        return None, None
    hc = HydraConfig.get()
    if hc.mode == RunMode.MULTIRUN:
        sweep = Path(hc.sweep.dir)
        group = f"{sweep.parent.name}_{sweep.name}" if sweep.parent.name else sweep.name
        name = hc.job.override_dirname or f"job{hc.job.num}"
        return group, f"{hc.job.num}:{name}"
    out = Path(hc.runtime.output_dir)
    return None, f"{out.parent.name}_{out.name}"


@hydra.main(version_base="1.3", config_path=CONFIG_PACKAGE, config_name="config")
def hydra_main(cfg: DictConfig) -> dict[str, Any] | None:
    """Hydra's task function: one job of a run or a sweep.

    A bad configuration is printed as one line and recorded, so the other jobs of a sweep
    still run and the command exits non-zero at the end.
    """
    try:
        return run(cfg)
    except user_errors() as e:
        msg = str(e).strip()
        FAILURES.append(msg)
        print(f"schedlab: error: {msg}", file=sys.stderr)
        return None
