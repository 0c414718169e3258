"""`schedlab run`: a thin `@hydra.main` over a plain `run(cfg) -> metrics`."""

from __future__ import annotations

import json
import os
import random
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig
from omegaconf.errors import OmegaConfBaseException

from schedlab.cli.settings import RunSettings, build_settings
from schedlab.cli.steps_csv import StepsCsv, read_steps_csv, write_steps_csv
from schedlab.config import ConfigError
from schedlab.faults import PluginContractError, full_traceback
from schedlab.registry import PluginError

CONFIG_PACKAGE = "pkg://schedlab.conf"


def user_errors() -> tuple[type[Exception], ...]:
    """Exceptions that mean a bad configuration or input, reported without a traceback."""
    from schedlab.runs.distributions import WorkloadError

    return ConfigError, PluginError, WorkloadError, OmegaConfBaseException


#: messages of the jobs of this process that failed on a bad configuration
FAILURES: list[str] = []
#: what an interrupted job saved (the CLI prints it in its one line after Ctrl-C)
INTERRUPTED: list[str] = []


def run(cfg: DictConfig, group: str | None = None,
        run_name: str | None = None) -> dict[str, Any]:
    """Run one configuration: build the engine, drive the workload, write the results.

    Args:
        cfg: a composed config (`conf/config.yaml` plus overrides).
        group, run_name: the W&B group and run name (under Hydra: from its job, see
            `hydra_main`).

    Returns:
        The metrics (vLLM's benchmark keys), as written to `results.json`.

    Raises:
        ConfigError, PluginError, WorkloadError: a bad configuration, before any work starts.
    """
    from schedlab.runs.driver import fewer_collections

    with fewer_collections():  # NOTE: the whole job: the workload, the run, its metrics
        return execute(build_settings(cfg, group=group, run_name=run_name))


def execute(s: RunSettings) -> dict[str, Any]:
    """Run validated settings (see `run`): one engine, N instances or prefill/decode
    disaggregation, through the one run loop. A cluster's results.json carries each
    instance's counters under `cluster`; steps.csv and W&B get every instance's steps in time
    order."""
    from schedlab.engine_plugins import resolve_plugins

    resolve_plugins(s.engine)  # a broken plugin or option fails first, before torch and the model
    from schedlab.cluster import Cluster, ClusterConfig
    from schedlab.runs.driver import run_workload
    from schedlab.runs.interrupt import InterruptLatch
    from schedlab.runs.metrics import compute_metrics
    from schedlab.runs.results import collect_environment, write_results
    from schedlab.runs.workload import build_workload

    seed_everything(s.seed)
    s.model.prepare()
    try:
        cluster = Cluster(s.cluster or ClusterConfig(), s.engine)
    except (ValueError, OSError, RuntimeError) as e:
        # e.g. an executor rejecting its options, attention=triton on a CPU without the
        # interpreter, engine.device=cuda without a GPU: one sentence, no traceback
        if isinstance(e, user_errors()):
            raise
        what = "engine" if s.cluster is None else "cluster"
        raise ConfigError(f"the {what} could not be built from this config: {e}") from None
    seed_everything(s.seed)  # torch too, now that the engine imported it (a real executor)
    vocab = cluster.instances[0].engine.model_spec.vocab_size
    workload = build_workload(s.workload, vocab, seed=s.seed)

    s.output_dir.mkdir(parents=True, exist_ok=True)
    metrics: dict[str, Any] = {}
    summary: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    run = None
    # NOTE: steps.csv's rows go to its writer as the run hands them over (streaming: as it
    # goes, each step record then forgotten); the file is finished before anything reads it
    steps_out = StepsCsv(s.output_dir / STEPS_FILE)
    try:
        try:
            with InterruptLatch() as latch:
                run = run_workload(cluster, workload, temperature=s.temperature,
                                   ignore_eos=s.ignore_eos, max_concurrency=s.max_concurrency,
                                   progress=s.progress, save_detailed=s.save_detailed,
                                   interrupt=latch, steps_out=steps_out, workers=s.workers,
                                   plugin_timeout_s=s.plugin_timeout_s)
        except KeyboardInterrupt:  # partial results, then the one line
            res = cluster.interrupt()  # NOTE: streaming: the steps left go to `steps_out`
            run = res.run
            run.max_concurrency = s.max_concurrency
            if s.save_detailed:  # NOTE: what the run's own hand-off had not taken yet
                steps_out(run.step_stats[steps_out.num_rows:])
            steps_out.close()
            if s.cluster is not None:
                extra["cluster"] = res.summary()
            metrics = _write_interrupted(s, run, **extra)
            raise
        metrics = compute_metrics(run, percentiles=s.percentiles, slo=s.slo)
        if s.cluster is not None:
            metrics["cluster"] = cluster.result_with_summary(run).summary()
        path = write_results(s.output_dir, metrics, s.config, collect_environment())
        steps_out.close()
        # W&B's summary = results.json's scalars, read back (a tracker that records
        # nothing needs none: a long run's per-request arrays are the file's bulk)
        summary = json.loads(path.read_text()) if s.tracking.backend != "none" else metrics
        if s.plots:
            from schedlab.runs.plots import write_plots

            write_plots(s.output_dir, run, metrics, steps=_kept_steps(s, run))
    except BaseException:
        steps_out.close(check=False)
        _track(s, run, summary or metrics, failed=True)
        raise
    _announce(s, metrics, path, _track(s, run, summary))
    return metrics


def _announce(s: RunSettings, metrics: dict[str, Any], path: Path, tracker) -> None:
    """The end of a run on the console: the metrics table, where the results and W&B are."""
    from schedlab.runs.results import format_table

    if s.print_table:
        print(format_table(metrics))
    print(f"results: {path}")
    if tracker.location:
        print(f"W&B run: {tracker.location}")


def _write_interrupted(s: RunSettings, run, **extra: Any) -> dict[str, Any]:
    """results.json of an interrupted run (`interrupted: true`, plus `extra`) and the one
    line the command prints at exit."""
    from schedlab.runs.metrics import compute_metrics
    from schedlab.runs.results import collect_environment, write_results

    metrics = compute_metrics(run, percentiles=s.percentiles, slo=s.slo)
    metrics.update(extra, interrupted=True)
    path = write_results(s.output_dir, metrics, s.config, collect_environment())
    # NOTE: a streaming run keeps no requests: its stats count those that ended (all, once
    # the interrupt aborted what was in flight)
    submitted = len(run.requests) if run.stats is None else run.stats.num_ended()
    INTERRUPTED.append(f"{metrics.get('completed', 0)} of {submitted} submitted "
                       f"requests completed; partial results: {path}")
    return metrics


def _track(s: RunSettings, run, summary: dict[str, Any], failed: bool = False):
    """Open the tracker, replay the per-step series and close it, after the run (a run that
    failed before it ended leaves a steps.csv without rows).

    NOTE: W&B is opened only once the workload is done: its background service and a call
    per step would compete with the engine for the CPU and inflate the latencies measured.
    """
    from schedlab.runs.tracking import open_tracker

    if run is None:
        write_steps_csv(s.output_dir / STEPS_FILE, [])
    tracker = open_tracker(s.tracking, s.output_dir, s.config)
    if run is not None and s.tracking.backend != "none":
        for stats in _kept_steps(s, run):
            tracker.log_step(stats)
    tracker.finish(summary, failed=failed)
    return tracker


def _kept_steps(s: RunSettings, run) -> Iterable[Any]:
    """The run's steps: those it kept, or, streaming, steps.csv's rows read back."""
    return run.step_stats if run.stats is None else read_steps_csv(
        s.output_dir / STEPS_FILE)


#: the per-step series in the run directory, whatever the logger (columns: `StepStats` fields)
STEPS_FILE = "steps.csv"


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
    """(W&B group, run name) from the running Hydra job: a sweep's runs share its directory
    name."""
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

    A bad configuration, or a plugin that broke a rule or raised while running, is printed as
    one line and recorded, so the other jobs of a sweep still run and the command exits
    non-zero at the end. `HYDRA_FULL_ERROR=1` prints the plugin's traceback before the line.
    """
    try:
        return run(cfg, *_sweep_names())
    except user_errors() as e:
        msg = str(e).strip()
        FAILURES.append(msg)
        if isinstance(e, PluginContractError) and os.environ.get("HYDRA_FULL_ERROR") == "1":
            print(full_traceback(e), file=sys.stderr, end="")
        print(f"schedlab: error: {msg}", file=sys.stderr)
        return None
