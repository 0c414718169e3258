"""Summarise one experiment's sweep: median over seeds with a bootstrap interval, a table and a
figure.

    python experiments/summarize.py <multirun dir> [--experiment NAME] [--publish]

Reads every results.json under the sweep directory (`schedlab.runs.report.find_runs`), groups the
runs by the swept parameters except the seed, and writes `<name>_<mode>.md`, `.csv` and `.png`
into the sweep directory; `--publish` copies them to `experiments/results/`. The experiment
(its columns, derived metrics, notes and figure) is looked up in `summaries.SPECS` by
`--experiment` or by the runs' `exp.name`; the mode (`real` | `sim`) comes from `exp.mode`.
`schedlab run -m experiment=<name>` calls this at the end of the sweep (a Hydra callback).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import shutil
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from summaries import SPECS, Metric, Spec  # noqa: E402
from summaries.common import INTERVAL, MINMAX_SEEDS, median_ci  # noqa: E402

from schedlab.runs.report import ReportError, RunRecord, find_runs, swept_parameters  # noqa: E402

#: config keys that vary between seeds of one point and are never a grouping parameter
SEED_KEYS = ("seed", "engine.seed")
RESULTS_DIR = Path(__file__).resolve().parent / "results"


@dataclass(frozen=True, slots=True)
class Stat:
    """One metric over the seeds of one point: the median, its bootstrap interval (`lo`, `hi`:
    `summaries.common.median_ci`; the median itself with one seed), and the range."""

    median: float | None
    lo: float | None
    hi: float | None
    n: int
    min: float | None = None
    max: float | None = None


@dataclass(slots=True)
class Row:
    """One point of the sweep: its parameters and its runs (one per seed)."""

    params: dict[str, Any]
    runs: list[RunRecord]
    stats: dict[str, Stat] = field(default_factory=dict)

    def get(self, key: str) -> float | None:
        """The median of a metric (None when no seed produced it)."""
        return self.stats[key].median

    @property
    def seeds(self) -> list[int]:
        return sorted(r.config.get("seed") for r in self.runs)


def aggregate(values: Sequence[float | None]) -> Stat:
    """Median, its bootstrap interval and min-max of the finite values."""
    xs = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    if not xs:
        return Stat(None, None, None, 0)
    med = statistics.median(xs)
    lo, hi = median_ci(xs) if len(xs) > 1 else (med, med)
    return Stat(med, lo, hi, len(xs), min(xs), max(xs))


def group_runs(runs: Sequence[RunRecord], spec: Spec) -> tuple[list[str], list[Row]]:
    """Group runs by every swept parameter but the seed.

    Returns:
        The parameter columns (the spec's, then any other swept key the spec does not know)
        and the rows in sweep order.
    """
    swept = [k for k in swept_parameters(runs) if k not in SEED_KEYS]
    known = [k for k, _ in spec.params]
    extra = [k for k in swept if k not in known and k not in spec.hidden
             and not any(k.startswith(h + ".") for h in spec.hidden)]
    keys = [*known, *extra]
    by_point: dict[str, Row] = {}
    for r in runs:
        ident = json.dumps([r.config.get(k) for k in [*keys, *swept]], default=str)
        row = by_point.setdefault(ident, Row({k: r.config.get(k) for k in keys}, []))
        row.runs.append(r)
    rows = sorted(by_point.values(),
                  key=lambda row: [_sort_key(row.params[k], spec.order.get(k)) for k in keys])
    for row in rows:
        for m in spec.metrics:
            row.stats[m.key] = aggregate([m.value(r) for r in row.runs])
    return keys, rows


def render(spec: Spec, mode: str, keys: list[str], rows: list[Row], runs: Sequence[RunRecord],
           source: Path) -> tuple[str, list[list[Any]]]:
    """The markdown document and the CSV rows (header first)."""
    labels = dict(spec.params)
    header = [labels.get(k, k) for k in keys] + ["seeds"] + [m.label for m in spec.metrics]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    csv_rows: list[list[Any]] = [[*keys, "seeds",
                                  *(f"{m.key}{s}" for m in spec.metrics
                                    for s in ("", "_min", "_max", "_ci_lo", "_ci_hi"))]]
    for row in rows:
        cells = [_param_cell(row.params[k]) for k in keys]
        cells.append(",".join(map(str, row.seeds)))
        cells += [_stat_cell(row.stats[m.key], m.fmt) for m in spec.metrics]
        lines.append("| " + " | ".join(cells) + " |")
        csv_rows.append([*(row.params[k] for k in keys), " ".join(map(str, row.seeds)),
                         *(v for m in spec.metrics for v in (
                             row.stats[m.key].median, row.stats[m.key].min, row.stats[m.key].max,
                             row.stats[m.key].lo, row.stats[m.key].hi))])
    few = (f"; with {MINMAX_SEEDS} seeds or fewer it is the min-max range"
           if max(len(r.runs) for r in rows) <= MINMAX_SEEDS else "")
    doc = [f"# {spec.title} ({mode})", "", spec.claim, "", f"Setup: {setup_line(runs)}.", "",
           f"Each cell: median over seeds [{INTERVAL}{few}]; the CSV also has min and max.", "",
           *lines, ""]
    if spec.sections is not None:
        doc += spec.sections(rows, runs)
    notes = spec.notes(rows, runs)
    if notes:
        doc += ["## Summary", "", *(f"- {n}" for n in notes), ""]
    doc += [f"Source: {len(runs)} runs under `{source}`.", ""]
    return "\n".join(doc), csv_rows


def setup_line(runs: Sequence[RunRecord]) -> str:
    """What was run, from the first run's config: model, executor, hardware, sizes."""
    c = runs[0].config
    hw = c.get("hardware.preset") or ("this CPU" if c.get("executor.name") == "torch" else "?")
    parts = [f"model {c.get('model.name')}", f"executor {c.get('executor.name')}",
             f"hardware {hw}", f"{c.get('workload.num_requests')} requests per run",
             f"max_num_seqs {c.get('engine.max_num_seqs')}",
             f"seeds {sorted({r.config.get('seed') for r in runs})}"]
    return ", ".join(parts)


def summarize(sweep_dir: Path, experiment: str | None = None, out: Path | None = None,
              publish: bool = False) -> list[Path]:
    """Write the experiment's table (md, csv) and figure (png); return the paths written.

    Raises:
        ReportError: no results under `sweep_dir`, or an unknown experiment.
    """
    sweep_dir = Path(sweep_dir)
    runs = find_runs(sweep_dir)
    name = experiment or runs[0].config.get("exp.name")
    if name not in SPECS:
        raise ReportError(f"experiment {name!r} is unknown; known: {', '.join(SPECS)}")
    spec = SPECS[name]
    mode = runs[0].config.get("exp.mode") or "real"
    keys, rows = group_runs(runs, spec)
    doc, csv_rows = render(spec, mode, keys, rows, runs, sweep_dir)
    out = Path(out) if out is not None else sweep_dir
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"{name}_{mode}"
    md, csv_path, png = (stem.with_suffix(s) for s in (".md", ".csv", ".png"))
    md.write_text(doc)
    with csv_path.open("w", newline="") as f:
        csv.writer(f).writerows([["" if v is None else v for v in r] for r in csv_rows])
    spec.figure(rows, png, f"{spec.title} ({mode})")
    paths = [md, csv_path, png]
    if publish:
        RESULTS_DIR.mkdir(parents=True, exist_ok=True)
        paths += [Path(shutil.copy2(p, RESULTS_DIR / p.name)) for p in (md, csv_path, png)]
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dir", type=Path, help="the experiment's multirun (sweep) directory")
    parser.add_argument("--experiment", default=None, help=f"one of {', '.join(SPECS)}")
    parser.add_argument("--out", type=Path, default=None, help="default: the sweep directory")
    parser.add_argument("--publish", action="store_true",
                        help=f"also copy the table and figure to {RESULTS_DIR}")
    args = parser.parse_args(argv)
    try:
        paths = summarize(args.dir, args.experiment, args.out, args.publish)
    except ReportError as e:
        print(f"summarize: error: {e}", file=sys.stderr)
        return 2
    print(paths[0].read_text())
    for p in paths:
        print(f"wrote {p}")
    return 0


def _sort_key(v: Any, order: Sequence[Any] | None) -> tuple[int, Any]:
    if order is not None and v in order:
        return (0, order.index(v))
    if v is None:
        return (1, 0)
    if isinstance(v, int | float) and not isinstance(v, bool):
        return (2, v)
    return (3, str(v))


def _param_cell(v: Any) -> str:
    return "none" if v is None else str(v)


def _stat_cell(s: Stat, fmt: str) -> str:
    if s.median is None:
        return "-"
    text = f"{s.median:{fmt}}"
    if s.n > 1 and f"{s.lo:{fmt}}" != f"{s.hi:{fmt}}":
        text += f" [{s.lo:{fmt}}, {s.hi:{fmt}}]"
    return text


__all__ = ["Metric", "Row", "Stat", "aggregate", "group_runs", "main", "summarize"]

if __name__ == "__main__":
    sys.exit(main())
