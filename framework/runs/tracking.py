"""Experiment tracking: Weights & Biases, offline by default, or nothing at all.

The command line builds a `TrackingConfig` and opens a tracker for one run:
`log_step` receives the engine's `StepStats` (replayed after the run) and `finish`
stores the run's metrics. `backend="none"` never imports wandb.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from schedlab.config import ConfigError
from schedlab.stats import StepStats

WandbMode = Literal["offline", "online", "disabled"]
WANDB_MODES: tuple[WandbMode, ...] = ("offline", "online", "disabled")


@dataclass(frozen=True, slots=True)
class TrackingConfig:
    """Where and how a run is tracked.

    Args:
        backend: "wandb" or "none".
        project: W&B project.
        entity: W&B team or user (None: the default entity).
        mode: "offline" (files only; `wandb sync` later), "online" or "disabled".
        group: runs of one sweep share a group.
        run_name: the run's display name.
        tags: W&B tags.
        log_steps: log the per-step series.
        log_requests: log a per-request table.
    """

    backend: str = "none"
    project: str = "schedlab"
    entity: str | None = None
    mode: str = "offline"
    group: str | None = None
    run_name: str | None = None
    tags: tuple[str, ...] = ()
    log_steps: bool = True
    log_requests: bool = True

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ConfigError(f"logger={self.backend!r}; accepted: {', '.join(BACKENDS)}")
        if self.mode not in WANDB_MODES:
            raise ConfigError(f"logger.mode={self.mode!r}; accepted: {', '.join(WANDB_MODES)}")


class Tracker:
    """Tracks nothing. The base of every tracker."""

    def __init__(self, cfg: TrackingConfig, run_dir: str | Path, config: dict[str, Any]) -> None:
        self.cfg = cfg

    def log_step(self, stats: StepStats) -> None:
        """Record one engine step."""

    def finish(self, metrics: dict[str, Any], failed: bool = False) -> None:
        """Record the run's metrics and close the tracker."""

    @property
    def location(self) -> str | None:
        """Where the tracked run lives (a directory or URL), if anywhere."""
        return None


#: per-step series: W&B key -> StepStats field
STEP_SERIES = {
    "running": "num_running",
    "waiting": "num_waiting",
    "scheduled_seqs": "num_scheduled_seqs",
    "scheduled_tokens": "num_scheduled_tokens",
    "prefill_tokens": "num_prefill_tokens",
    "decode_tokens": "num_decode_tokens",
    "preempted": "num_preempted",
    "kv_used_blocks": "kv_used_blocks",
    "kv_free_blocks": "kv_free_blocks",
    "kv_cached_blocks": "kv_cached_blocks",
    "engine_time_s": "time",
}


class WandbTracker(Tracker):
    """One W&B run whose files live in `<run_dir>/wandb`.

    The environment is set before wandb is imported: `WANDB_MODE` (offline unless asked
    otherwise; the `mode=` argument alone still makes a network lookup) and every W&B
    directory inside the run directory.
    """

    def __init__(self, cfg: TrackingConfig, run_dir: str | Path, config: dict[str, Any]) -> None:
        run_dir = Path(run_dir).resolve()
        wandb_dir = run_dir / "wandb"
        wandb_dir.mkdir(parents=True, exist_ok=True)
        os.environ["WANDB_MODE"] = cfg.mode
        os.environ["WANDB_DIR"] = str(run_dir)
        for var, sub in (("WANDB_CACHE_DIR", ".cache"), ("WANDB_DATA_DIR", ".data"),
                         ("WANDB_CONFIG_DIR", ".config")):
            os.environ[var] = str(wandb_dir / sub)
        os.environ.setdefault("WANDB_SILENT", "true")
        import wandb

        super().__init__(cfg, run_dir, config)
        self._wandb = wandb
        self.run = wandb.init(
            project=cfg.project,
            entity=cfg.entity,
            group=cfg.group,
            name=cfg.run_name,
            tags=list(cfg.tags) or None,
            config=config,
            dir=str(run_dir),
            mode=next(m for m in WANDB_MODES if m == cfg.mode),  # checked in TrackingConfig
            reinit="finish_previous",
            settings=wandb.Settings(console="off", silent=True, disable_git=True,
                                    x_disable_stats=True),
        )

    @property
    def location(self) -> str | None:
        if self.cfg.mode == "online":
            return self.run.url
        return self.run.dir and str(Path(self.run.dir).parent)

    def log_step(self, stats: StepStats) -> None:
        if not self.cfg.log_steps:
            return
        row = {key: getattr(stats, name) for key, name in STEP_SERIES.items()}
        row["step_time_ms"] = stats.step_time * 1000.0
        row["framework_time_ms"] = stats.framework_time * 1000.0
        self.run.log(row, step=stats.step)

    def finish(self, metrics: dict[str, Any], failed: bool = False) -> None:
        self.run.summary.update(summary_metrics(metrics))
        if self.cfg.log_requests:
            table = request_table(metrics)
            if table is not None:
                columns, rows = table
                names: list[str | int] = list(columns)
                self.run.log({"requests": self._wandb.Table(columns=names, data=rows)})
        self.run.finish(exit_code=1 if failed else 0)


def summary_metrics(metrics: dict[str, Any]) -> dict[str, Any]:
    """The scalar metrics (numbers, strings, booleans) as they appear in results.json."""
    out: dict[str, Any] = {}
    for k, v in metrics.items():
        if isinstance(v, bool | str) or v is None:
            out[k] = v
        elif isinstance(v, int | float):
            out[k] = v if math.isfinite(v) else None
    return out


def request_table(metrics: dict[str, Any]) -> tuple[list[str], list[list[Any]]] | None:
    """Per-request columns: the metric lists with one entry per request (input_lens first)."""
    lens = metrics.get("input_lens")
    if not isinstance(lens, list) or not lens:
        return None
    n = len(lens)
    columns = [k for k, v in metrics.items() if isinstance(v, list) and len(v) == n
               and all(x is None or isinstance(x, int | float) for x in v)]
    rows = [[i, *(metrics[c][i] for c in columns)] for i in range(n)]
    return ["request", *columns], rows


BACKENDS: dict[str, type[Tracker]] = {"none": Tracker, "wandb": WandbTracker}


def open_tracker(cfg: TrackingConfig, run_dir: str | Path, config: dict[str, Any]) -> Tracker:
    """The tracker `cfg.backend` names, opened for a run in `run_dir` with its `config`."""
    return BACKENDS[cfg.backend](cfg, run_dir, config)
