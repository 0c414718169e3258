"""Whether two run directories hold the same simulated run: results.json's values (all but
those that name the run or time the host) and steps.csv's rows (all but the host-time columns).

    .venv/bin/python experiments/same_run.py outputs/<one> outputs/<other>

e.g. a cluster run with `driver.workers=1` and the same with `driver.workers=2`. Prints the
keys and the number of rows that differ; exits 1 if anything does.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path
from typing import Any

#: results.json keys that name the run or the machine rather than what it simulated
RUN_KEYS = ("date", "output_dir", "git_commit", "workers", "environment")
#: host seconds (each process measures its own): steps.csv's columns, results.json's means
HOST = ("framework_time", "schedule_time", "prepare_time", "forward_time", "device_wait_time",
        "sample_time", "update_time")


def flat(d: Any, prefix: str = "") -> dict[str, Any]:
    """results.json as dotted keys (a list of dicts indexed, other lists as values)."""
    out: dict[str, Any] = {}
    if isinstance(d, dict):
        for k, v in d.items():
            out.update(flat(v, f"{prefix}.{k}" if prefix else k))
    elif isinstance(d, list) and d and isinstance(d[0], dict):
        for i, v in enumerate(d):
            out.update(flat(v, f"{prefix}[{i}]"))
    else:
        out[prefix] = d
    return out


def differences(a: Path, b: Path) -> tuple[list[str], int, int]:
    """The results.json keys that differ, the steps.csv rows that differ, the rows read."""
    fa, fb = (flat(json.loads((d / "results.json").read_text())) for d in (a, b))
    keys = [k for k in sorted(set(fa) | set(fb)) if fa.get(k) != fb.get(k)
            and not any(s in k for s in RUN_KEYS + HOST)]
    with open(a / "steps.csv", newline="") as x, open(b / "steps.csv", newline="") as y:
        ra, rb = csv.reader(x), csv.reader(y)
        header = next(ra)
        if next(rb) != header:
            return [*keys, "steps.csv header"], 1, 1
        keep = [i for i, c in enumerate(header) if c not in HOST]
        rows = bad = 0
        for ya, yb in zip(ra, rb, strict=False):
            rows += 1
            bad += [ya[i] for i in keep] != [yb[i] for i in keep]
        extra = sum(1 for _ in ra) + sum(1 for _ in rb)
    return keys, bad + extra, rows + extra


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("one", type=Path)
    ap.add_argument("other", type=Path)
    args = ap.parse_args(argv)
    keys, bad, rows = differences(args.one, args.other)
    for k in keys:
        print(f"results.json {k}: differs")
    print(f"results.json: {len(keys)} keys differ; steps.csv: {bad} of {rows} rows differ "
          "(host-time columns aside)")
    return 1 if keys or bad else 0


if __name__ == "__main__":
    sys.exit(main())
