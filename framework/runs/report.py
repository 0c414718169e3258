"""`schedlab report <dir>`: compare every run under a run or multirun directory.

Finds each results.json below the directory, works out which config values differ between the
runs (the swept parameters), and writes one comparison table (report.md, report.csv) with
those parameters and the key metrics as columns, medians over seeds per configuration,
per-client and per-SLO-class tables, plus trade-off plots (tradeoff.png).
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from schedlab.runs.report_tables import (
    GROUP_TITLES,
    cell,
    configurations,
    group_medians_table,
    group_runs_table,
    markdown,
    medians_table,
    point_parameters,
    run_order,
    shown_parameters,
)
from schedlab.runs.results import RESULTS_FILE, load_results

#: metric columns of the comparison table, with their number formats
COLUMNS: tuple[tuple[str, str], ...] = (
    ("completed", "d"), ("num_rejected", "d"), ("duration", ".2f"),
    ("request_throughput", ".2f"), ("output_throughput", ".1f"), ("request_goodput", ".2f"),
    ("mean_ttft_ms", ".1f"), ("p99_ttft_ms", ".1f"), ("mean_tpot_ms", ".2f"),
    ("p99_tpot_ms", ".2f"), ("p99_itl_ms", ".2f"), ("mean_e2el_ms", ".1f"),
    ("mean_queue_ms", ".1f"), ("num_preemptions", "d"), ("prefix_cache_hit_rate", ".3f"),
    ("peak_kv_usage_pct", ".1f"), ("kv_waste_pct", ".1f"), ("mean_batch_size", ".2f"),
    ("jain_fairness_index", ".3f"), ("deadline_attainment", ".3f"),
)
#: config keys that differ between runs without being a swept parameter
_IGNORED_SUFFIXES = ("output_dir", "run_dir", "out_dir")


class ReportError(Exception):
    """A report that cannot be made; the message says why (printed without a traceback)."""


@dataclass(slots=True)
class RunRecord:
    """One run found under the report directory."""

    name: str
    path: Path
    metrics: dict[str, Any]
    config: dict[str, Any]  # flattened: "scheduler.name" -> "continuous"


def main(argv: list[str] | None = None) -> int:
    """Entry point of `schedlab report`. Returns the exit status (0 ok, 2 error)."""
    parser = argparse.ArgumentParser(
        prog="schedlab report",
        description="Compare the runs (results.json files) under a run or multirun directory.")
    parser.add_argument("dir", type=Path, help="a run directory or a multirun sweep directory")
    parser.add_argument("--out", type=Path, default=None,
                        help="where to write report.md, report.csv and plots (default: DIR)")
    args = parser.parse_args(argv)
    out = args.out if args.out is not None else args.dir
    try:
        runs = find_runs(args.dir)
        paths, table = write_report(runs, out)
    except ReportError as e:
        print(f"schedlab report: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"schedlab report: error: {out_dir_error(out, e, args.out is not None)}",
              file=sys.stderr)
        return 2
    print(table)
    print()
    for p in paths:
        print(f"wrote {p}")
    return 0


def out_dir_error(out: Path, e: OSError, flag: bool) -> str:
    """The sentence for an output directory that cannot be made or written into (`flag`: it
    came from `--out`)."""
    where = f"--out {out}" if flag else str(out)
    if out.exists() and not out.is_dir():
        return f"{where} is a file; --out names a directory to write into"
    return f"{where}: cannot create or write into this directory ({e.strerror or e})"


def find_runs(root: Path) -> list[RunRecord]:
    """Every readable results.json under `root`, ordered by path.

    Raises:
        ReportError: `root` is not a directory or holds no readable results.json.
    """
    root = Path(root)
    if not root.is_dir():
        raise ReportError(f"{root} is not a directory")
    runs = []
    for path in sorted(root.rglob(RESULTS_FILE)):
        try:
            metrics, config, _ = load_results(path)
        except ValueError as e:
            print(f"schedlab report: skipping {e}", file=sys.stderr)
            continue
        rel = path.parent.relative_to(root).as_posix()
        runs.append(RunRecord(rel if rel != "." else root.name, path, metrics, flatten(config)))
    if not runs:
        raise ReportError(f"no readable {RESULTS_FILE} under {root}; run `schedlab run` "
                          "(or a multirun sweep) with its output there first")
    return runs


def flatten(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested config -> {"a.b.c": value}; lists become JSON text."""
    out: dict[str, Any] = {}
    for k, v in config.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        else:
            out[key] = json.dumps(v) if isinstance(v, list) else v
    return out


def swept_parameters(runs: Sequence[RunRecord]) -> list[str]:
    """Config keys whose values differ between runs, in first-seen order."""
    keys: dict[str, None] = {}
    for r in runs:
        keys.update(dict.fromkeys(r.config))
    return [k for k in keys
            if not k.startswith("hydra.") and not k.endswith(_IGNORED_SUFFIXES)
            and len({json.dumps(r.config.get(k), sort_keys=True, default=str) for r in runs}) > 1]


def comparison_rows(runs: Sequence[RunRecord]) -> tuple[list[str], list[list[Any]]]:
    """Header and rows (raw values) of the comparison table: one row per run, sorted
    numerically by the shown parameters, then seed."""
    params = shown_parameters(runs, swept_parameters(runs))
    metrics = [k for k, _ in COLUMNS if any(r.metrics.get(k) is not None for r in runs)]
    ordered = sorted(runs, key=run_order(point_parameters(params)))
    rows = [[r.name, *(r.config.get(p) for p in params), *(r.metrics.get(k) for k in metrics)]
            for r in ordered]
    return ["run", *params, *metrics], rows


def write_report(runs: Sequence[RunRecord], out: Path) -> tuple[list[Path], str]:
    """Write report.md, report.csv and tradeoff.png into `out`.

    report.md: every run; with several seeds, the median over seeds per configuration; and,
    for runs with clients or SLO classes, their medians over seeds and every run's rows.

    Returns:
        The paths written and the markdown table of every run.
    """
    from schedlab.runs.sweep_plots import tradeoff_plot

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    header, rows = comparison_rows(runs)
    fmts = dict(COLUMNS)
    table = markdown(header, [[cell(v, fmts.get(h)) for h, v in zip(header, row, strict=True)]
                              for row in rows])
    params = shown_parameters(runs, swept_parameters(runs))
    point = point_parameters(params)
    configs = configurations(runs, point)
    parts = [f"# schedlab report\n\n{len(runs)} runs", f"; {len(configs)} configurations of "
             f"{', '.join(point)}" if point else "", ".\n\n"]
    if len(configs) < len(runs):
        parts.append(f"## Median over seeds\n\n{medians_table(runs, params, COLUMNS)}\n\n"
                     "## Every run\n\n")
    parts.append(f"{table}\n")
    for key, title in GROUP_TITLES:
        if not any(r.metrics.get(key) for r in runs):
            continue
        if len(configs) < len(runs):
            parts.append(f"\n## Per {title}, median over seeds\n\n"
                         f"{group_medians_table(runs, params, key)}\n")
        parts.append(f"\n## Per {title}, every run\n\n{group_runs_table(runs, params, key)}\n")
    md = out / "report.md"
    md.write_text("".join(parts))
    csv_path = out / "report.csv"
    with csv_path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows([["" if v is None else v for v in row] for row in rows])
    return [md, csv_path, tradeoff_plot(runs, point, out / "tradeoff.png")], table
