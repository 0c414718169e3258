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

from schedlab.runs.compare import CompareError, CompareReport, compare_runs, load_runs
from schedlab.runs.metric_diff import BOOTSTRAPS, DEFAULT_METHOD, METHODS, TOO_FEW
from schedlab.runs.report import out_dir_error

PROG = "schedlab compare"


def main(argv: list[str] | None = None) -> int:
    """Entry point of `schedlab compare`. Returns the exit status (0 ok, 2 error)."""
    parser = argparse.ArgumentParser(
        prog=PROG, description="Compare the values of one swept parameter, paired by seed: "
        "per metric the paired difference and ratio with a confidence interval and a verdict.")
    parser.add_argument("dir", type=Path, help="a multirun (sweep) directory of results.json")
    parser.add_argument("--by", required=True, help="the swept config key to compare, e.g. "
                        "scheduler.name")
    parser.add_argument("--baseline", default=None, help="the value of --by to compare "
                        "against (default: the first: none, then numbers, then names)")
    parser.add_argument("--metrics", nargs="+", default=None, help="results.json keys or "
                        "group metrics (per_client.<id>.<metric>, per_slo_class.<name>."
                        "<metric>; the id may be a glob: per_client.light*.mean_ttft_ms is "
                        "the mean over the light clients), space or comma separated "
                        "(default: the report's columns, then each client group's mean TTFT)")
    parser.add_argument("--confidence", type=float, default=0.95, help="default 0.95")
    parser.add_argument("--method", choices=METHODS, default=DEFAULT_METHOD,
                        help="t: paired t interval of the mean (default; assumes roughly "
                        "normal differences; works from 2 seeds), wilcoxon: exact signed-rank "
                        "(from 6 seeds at 95%%), sign: exact sign test (from 6), percentile / "
                        "bca: bootstrap (many seeds)")
    parser.add_argument("--statistic", choices=("mean", "median"), default="mean",
                        help="of a bootstrap method (default mean)")
    parser.add_argument("--resamples", type=int, default=10_000,
                        help="bootstrap resamples (default 10000)")
    parser.add_argument("--seed", type=int, default=0, help="the bootstrap's seed (default 0)")
    parser.add_argument("--min-pairs", type=int, default=None, help="pairs needed for a "
                        "verdict (default: the fewest at which the method can reach the "
                        "confidence: 2 for t, 6 at 0.95 for the others)")
    parser.add_argument("--out", type=Path, default=None,
                        help="where to write compare_<by>.md and .csv (default: DIR)")
    args = parser.parse_args(argv)
    if args.min_pairs is not None and args.min_pairs < 1:
        print(f"{PROG}: error: --min-pairs {args.min_pairs}: a verdict needs at least 1 pair",
              file=sys.stderr)
        return 2
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
    md_path, csv_path = out / f"compare_{args.by}.md", out / f"compare_{args.by}.csv"
    try:
        out.mkdir(parents=True, exist_ok=True)
        md_path.write_text(md)
        with csv_path.open("w", newline="") as f:
            csv.writer(f).writerows(to_rows(report))
    except OSError as e:
        print(f"{PROG}: error: {out_dir_error(out, e, args.out is not None)}", file=sys.stderr)
        return 2
    print(md)
    print(f"wrote {md_path}\nwrote {csv_path}")
    return 0


#: how each method's interval is described under the table
_HOW = {
    "t": "paired t interval of the mean difference (n - 1 degrees of freedom; assumes the "
         "differences roughly normal and the seeds independent) and the t test's p-value",
    "wilcoxon": "Hodges-Lehmann estimate with the exact Wilcoxon signed-rank interval and "
                "p-value (assumes the differences symmetric)",
    "sign": "median difference with its exact sign-test interval and p-value",
    "percentile": "percentile bootstrap interval",
    "bca": "BCa bootstrap interval",
}


def to_markdown(report: CompareReport, source: str = "") -> str:
    """The report as a markdown document: how it was computed, then one row per metric."""
    r = report
    ctx = list(r.comparisons[0].context) if r.comparisons else []
    pct = f"{100 * r.confidence:g}%"
    stat = r.statistic
    rstat = "geometric mean" if stat == "mean" else stat
    side = "mean" if stat == "mean" else "median"
    head = [f"# schedlab compare: {r.by} (baseline {_text(r.baseline)})", ""]
    if source:
        head += [f"{source}; paired by seed"
                 + (f" within each setting of {', '.join(ctx)}." if ctx else "."), ""]
    if r.implied:
        head += [f"Also changes with {r.by}: {', '.join(r.implied)}.", ""]
    how = _HOW[r.method] + (f" ({r.resamples} resamples, seed {r.seed})"
                            if r.method in BOOTSTRAPS else "")
    head += [f"Each row, over the n seeds both sides ran: the {side} of the baseline, the "
             f"{side} of the candidate, the {stat} of the paired differences (candidate - "
             f"baseline) with its {pct} interval, and the {rstat} of the paired ratios "
             f"(candidate / baseline) with its interval. Intervals: {how}. "
             f"\"significant\": the test rejects no difference at {pct}; \"too few seeds\": "
             f"under {r.min_pairs} pairs, too few for this method to reach {pct}.", ""]
    header = [*ctx, r.by, "metric", "n", f"baseline ({side})", f"candidate ({side})",
              f"difference ({stat}) [{pct} CI]", f"ratio ({rstat}) [{pct} CI]", "p", "verdict"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for c in r.comparisons:
        for m in c.metrics:
            cells = [*(_text(c.context[k]) for k in ctx), _text(c.candidate), m.metric,
                     str(m.n), _num(m.baseline), _num(m.candidate),
                     _signed(m.diff) + (f" [{_signed(m.ci.lo)}, {_signed(m.ci.hi)}]"
                                        if m.ci else ""),
                     _ratio(m), _p(m.p_value), m.verdict]
            lines.append("| " + " | ".join(cells) + " |")
    tail = [""]
    if r.num_tests:
        tail.append(f"{r.num_tests} tests at {pct}: if nothing differed, about "
                    f"{r.num_tests * (1 - r.confidence):.1f} of them would reject by chance "
                    "alone.")
    if any(m.verdict == TOO_FEW and m.n >= 2 for c in r.comparisons for m in c.metrics):
        tail.append(f"\"too few seeds\" with {r.method}: --method t gives a verdict from 2 "
                    "pairs, or run more seeds.")
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
    rows: list[list[Any]] = [[*ctx, report.by, "baseline", "metric", "n", "method",
                              "statistic", "baseline_value", "candidate_value", "diff",
                              "ci_lo", "ci_hi", "ratio", "ratio_lo", "ratio_hi", "p_value",
                              "verdict", "seeds"]]
    for c in report.comparisons:
        for m in c.metrics:
            rows.append([*(c.context[k] for k in ctx), c.candidate, report.baseline, m.metric,
                         m.n, report.method, report.statistic, m.baseline, m.candidate,
                         m.diff, *((m.ci.lo, m.ci.hi) if m.ci else ("", "")), m.ratio,
                         *((m.ratio_ci.lo, m.ratio_ci.hi) if m.ratio_ci else ("", "")),
                         m.p_value, m.verdict, " ".join(map(str, c.seeds))])
    return [["" if v is None else v for v in row] for row in rows]


def _p(p: float | None) -> str:
    if p is None:
        return "-"
    return "<0.001" if p < 0.001 else f"{p:.3f}"


def _signed(v: float | None) -> str:
    return "-" if v is None else ("+" if v > 0 else "") + _num(v)


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
