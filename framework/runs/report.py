"""`schedlab report <dir>`: compare every run under a run or multirun directory.

Finds each results.json below the directory, works out which config values differ between the
runs (the swept parameters), and writes one comparison table (report.md, report.csv) with
those parameters and the key metrics as columns, plus trade-off plots (tradeoff.png).
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
#: columns of the per-client and per-SLO-class tables (keys of results.json's `per_client`)
GROUP_COLUMNS: tuple[tuple[str, str], ...] = (
    ("num_requests", "d"), ("completed", "d"), ("num_rejected", "d"), ("service", ".0f"),
    ("request_throughput", ".2f"), ("request_goodput", ".2f"), ("deadline_attainment", ".3f"),
    ("mean_ttft_ms", ".1f"), ("p99_ttft_ms", ".1f"), ("mean_tpot_ms", ".2f"),
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
    try:
        runs = find_runs(args.dir)
        out = args.out if args.out is not None else args.dir
        paths, table = write_report(runs, out)
    except ReportError as e:
        print(f"schedlab report: error: {e}", file=sys.stderr)
        return 2
    print(table)
    print()
    for p in paths:
        print(f"wrote {p}")
    return 0


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
    """Header and rows (raw values) of the comparison table."""
    params = swept_parameters(runs)
    metrics = [k for k, _ in COLUMNS if any(r.metrics.get(k) is not None for r in runs)]
    ordered = sorted(runs, key=lambda r: ([_sort_key(r.config.get(p)) for p in params], r.name))
    rows = [[r.name, *(r.config.get(p) for p in params), *(r.metrics.get(k) for k in metrics)]
            for r in ordered]
    return ["run", *params, *metrics], rows


def write_report(runs: Sequence[RunRecord], out: Path) -> tuple[list[Path], str]:
    """Write report.md, report.csv and tradeoff.png into `out`.

    Returns:
        The paths written and the markdown table.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    header, rows = comparison_rows(runs)
    fmts = dict(COLUMNS)
    cells = [[_cell(v, fmts.get(h)) for h, v in zip(header, row, strict=True)] for row in rows]
    table = "\n".join(["| " + " | ".join(header) + " |",
                       "|" + "|".join("---" for _ in header) + "|",
                       *("| " + " | ".join(c) + " |" for c in cells)])
    md = out / "report.md"
    groups = "".join(f"\n## Per {title}\n\n{group_table(runs, key)}\n"
                     for key, title in (("per_client", "client"), ("per_slo_class", "SLO class"))
                     if any(r.metrics.get(key) for r in runs))
    md.write_text(f"# schedlab report\n\n{len(runs)} runs.\n\n{table}\n{groups}")
    csv_path = out / "report.csv"
    with csv_path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows([["" if v is None else v for v in row] for row in rows])
    return [md, csv_path, _tradeoff_plot(runs, out / "tradeoff.png")], table


def group_table(runs: Sequence[RunRecord], key: str) -> str:
    """A markdown table of each run's `per_client` or `per_slo_class` metrics (one row per
    run and group)."""
    cols = [c for c, _ in GROUP_COLUMNS]
    fmts = dict(GROUP_COLUMNS)
    lines = ["| run | group | " + " | ".join(cols) + " |", "|---|---|" + "---|" * len(cols)]
    for r in sorted(runs, key=lambda r: r.name):
        for name, g in (r.metrics.get(key) or {}).items():
            cells = [_cell(g.get(c), fmts[c]) for c in cols]
            lines.append(f"| {r.name} | {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _tradeoff_plot(runs: Sequence[RunRecord], path: Path) -> Path:
    from schedlab.runs.plots import new_figure

    params = swept_parameters(runs)
    categorical = [p for p in params if not all(_is_number(r.config.get(p)) for r in runs)]
    numeric = [p for p in params if p not in categorical]
    groups: dict[str, list[RunRecord]] = {}
    for r in runs:
        label = ", ".join(f"{p}={r.config.get(p)}" for p in categorical) or "runs"
        groups.setdefault(label, []).append(r)
    panels = (("output_throughput", "p99_tpot_ms", "output throughput (tok/s)", "P99 TPOT (ms)"),
              ("request_throughput", "p99_ttft_ms", "request throughput (req/s)", "P99 TTFT (ms)"))
    fig, axes = new_figure(2, 1, size=(5.5, 4.0))
    for ax, (xk, yk, xl, yl) in zip(axes, panels, strict=True):
        for label, members in groups.items():
            pts = sorted(((r.metrics.get(xk), r.metrics.get(yk), r) for r in members
                          if _is_number(r.metrics.get(xk)) and _is_number(r.metrics.get(yk))),
                         key=lambda p: (p[0], p[1]))
            if not pts:
                continue
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=label)
            for x, y, r in pts:
                if numeric:
                    tag = ", ".join(f"{p.rsplit('.', 1)[-1]}={r.config.get(p)}" for p in numeric)
                    ax.annotate(tag, (x, y), fontsize=7, xytext=(3, 3),
                                textcoords="offset points")
        ax.set_xlabel(xl)
        ax.set_ylabel(yl)
        ax.grid(alpha=0.3)
        if len(groups) > 1:
            ax.legend(fontsize=7)
    fig.suptitle(f"{len(runs)} runs")
    fig.savefig(path, dpi=100)
    return path


def _cell(v: Any, fmt: str | None) -> str:
    if v is None:
        return "-"
    if fmt and _is_number(v):
        return f"{int(v):d}" if fmt == "d" else f"{v:{fmt}}"
    return str(v)


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _sort_key(v: Any) -> tuple[int, Any]:
    return (0, v) if _is_number(v) else (1, str(v))
