"""`schedlab compare <sweep dir> --by <param>`: paired differences over seeds, with intervals.

The statistics are `schedlab.runs.compare.compare_runs`; this module parses the command line
and renders its CompareReport as a markdown table (printed and written) and a CSV.
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path
from typing import Any

from schedlab.runs.bootstrap import METHODS
from schedlab.runs.compare import CompareError, CompareReport, compare_runs, load_runs

PROG = "schedlab compare"


def main(argv: list[str] | None = None) -> int:
    """Entry point of `schedlab compare`. Returns the exit status (0 ok, 2 error)."""
    parser = argparse.ArgumentParser(
        prog=PROG, description="Compare the values of one swept parameter, paired by seed: "
        "per metric the mean difference with a bootstrap confidence interval.")
    parser.add_argument("dir", type=Path, help="a multirun (sweep) directory of results.json")
    parser.add_argument("--by", required=True, help="the swept config key to compare, e.g. "
                        "scheduler.name")
    parser.add_argument("--baseline", default=None, help="the value of --by to compare "
                        "against (default: the first: none, then numbers, then names)")
    parser.add_argument("--metrics", nargs="+", default=None, help="results.json keys, space "
                        "or comma separated (default: the report's columns)")
    parser.add_argument("--confidence", type=float, default=0.95, help="default 0.95")
    parser.add_argument("--resamples", type=int, default=10_000, help="default 10000")
    parser.add_argument("--method", choices=METHODS, default="percentile",
                        help="default percentile")
    parser.add_argument("--statistic", choices=("mean", "median"), default="mean",
                        help="of the paired differences (default mean)")
    parser.add_argument("--seed", type=int, default=0, help="the bootstrap's seed (default 0)")
    parser.add_argument("--min-pairs", type=int, default=None, help="pairs needed for a "
                        "verdict (default: the fewest at which a sign test can reach the "
                        "confidence, 6 at 0.95)")
    parser.add_argument("--out", type=Path, default=None,
                        help="where to write compare_<by>.md and .csv (default: DIR)")
    args = parser.parse_args(argv)
    metrics = ([m for arg in args.metrics for m in arg.split(",") if m]
               if args.metrics else None)
    try:
        runs = load_runs(args.dir)
        report = compare_runs(runs, args.by, args.baseline, metrics, args.confidence,
                              args.resamples, args.method, args.statistic, args.seed,
                              args.min_pairs)
    except CompareError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    md = to_markdown(report, f"{len(runs)} runs under `{args.dir}`")
    out = args.out if args.out is not None else args.dir
    out.mkdir(parents=True, exist_ok=True)
    md_path, csv_path = out / f"compare_{args.by}.md", out / f"compare_{args.by}.csv"
    md_path.write_text(md)
    with csv_path.open("w", newline="") as f:
        csv.writer(f).writerows(to_rows(report))
    print(md)
    print(f"wrote {md_path}\nwrote {csv_path}")
    return 0


def to_markdown(report: CompareReport, source: str = "") -> str:
    """The report as a markdown document: how it was computed, then one row per metric."""
    r = report
    ctx = list(r.comparisons[0].context) if r.comparisons else []
    pct = f"{100 * r.confidence:g}%"
    head = [f"# schedlab compare: {r.by} (baseline {_text(r.baseline)})", ""]
    if source:
        head += [f"{source}; paired by seed"
                 + (f" within each setting of {', '.join(ctx)}." if ctx else "."), ""]
    if r.implied:
        head += [f"Also changes with {r.by}: {', '.join(r.implied)}.", ""]
    head += [f"Each row: candidate - baseline over the seeds both ran. Baseline and candidate "
             f"are medians; the difference is the {r.statistic} with a {pct} {_method(r)} "
             f"bootstrap interval ({r.resamples} resamples, seed {r.seed}); the ratio is the "
             f"geometric mean of candidate / baseline with its interval. \"not significant\": "
             f"the interval covers 0; \"too few seeds\": under {r.min_pairs} pairs, too few "
             f"for a {pct} verdict.", ""]
    header = [*ctx, r.by, "metric", "n", "baseline", "candidate", f"{r.statistic} diff "
              f"[{pct} CI]", "median diff", f"ratio [{pct} CI]", "verdict"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for c in r.comparisons:
        for m in c.metrics:
            diff = m.median_diff if r.statistic == "median" else m.mean_diff
            cells = [*(_text(c.context[k]) for k in ctx), _text(c.candidate), m.metric,
                     str(m.n), _num(m.baseline), _num(m.candidate),
                     _num(diff) + (f" [{_num(m.ci.lo)}, {_num(m.ci.hi)}]" if m.ci else ""),
                     _num(m.median_diff), _ratio(m), m.verdict]
            lines.append("| " + " | ".join(cells) + " |")
    tail = [""]
    if r.num_tests:
        tail.append(f"{r.num_tests} intervals at {pct}: if nothing differed, about "
                    f"{r.num_tests * (1 - r.confidence):.1f} of them would exclude 0 by "
                    "chance alone.")
    for c in r.comparisons:
        if c.unpaired:
            where = ", ".join(f"{k}={_text(v)}" for k, v in c.context.items())
            seeds = "seed" + ("s" if len(c.unpaired) > 1 else "")
            tail.append(f"{r.by}={_text(c.candidate)}{' at ' + where if where else ''}: {seeds} "
                        f"{', '.join(map(str, c.unpaired))} ran on one side only (left out).")
    return "\n".join([*head, *lines, *tail, ""])


def to_rows(report: CompareReport) -> list[list[Any]]:
    """The report as CSV rows (header first): one row per comparison and metric."""
    ctx = list(report.comparisons[0].context) if report.comparisons else []
    rows: list[list[Any]] = [[*ctx, report.by, "baseline", "metric", "n", "baseline_median",
                              "candidate_median", "mean_diff", "median_diff", "ci_lo", "ci_hi",
                              "ratio", "ratio_lo", "ratio_hi", "verdict", "seeds"]]
    for c in report.comparisons:
        for m in c.metrics:
            rows.append([*(c.context[k] for k in ctx), c.candidate, report.baseline, m.metric,
                         m.n, m.baseline, m.candidate, m.mean_diff, m.median_diff,
                         *((m.ci.lo, m.ci.hi) if m.ci else ("", "")), m.ratio,
                         *((m.ratio_ci.lo, m.ratio_ci.hi) if m.ratio_ci else ("", "")),
                         m.verdict, " ".join(map(str, c.seeds))])
    return [["" if v is None else v for v in row] for row in rows]


def _method(r: CompareReport) -> str:
    return "BCa" if r.method == "bca" else "percentile"


def _ratio(m: Any) -> str:
    if m.ratio is None:
        return "-"
    ci = f" [{m.ratio_ci.lo:.3f}, {m.ratio_ci.hi:.3f}]" if m.ratio_ci else ""
    return f"{m.ratio:.3f}x{ci}"


def _num(v: float | None) -> str:
    if v is None:
        return "-"
    a = abs(v)
    if a == 0 or a >= 100:
        return f"{v:.1f}"
    return f"{v:.3f}" if a >= 1 else f"{v:.3g}"


def _text(v: Any) -> str:
    return "none" if v is None else str(v)
