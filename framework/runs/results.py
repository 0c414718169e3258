"""Run results on disk: results.json (vLLM's metric keys at the top level), the environment,
and the console summary table."""

from __future__ import annotations

import json
import math
import platform
import subprocess
import sys
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any, TextIO

import numpy as np

try:
    import orjson as _orjson
except ImportError:  # pragma: no cover - the json path writes the same values
    _orjson = None  # type: ignore[assignment]

from schedlab.stats import STEP_PHASES

RESULTS_FILE = "results.json"
#: top-level keys of results.json that are not metrics
META_KEYS = ("date", "config", "environment")
_PACKAGES = ("schedlab", "torch", "transformers", "triton", "numpy")


def write_results(run_dir: Path, metrics: dict, config: dict | None = None,
                  env: dict | None = None) -> Path:
    """Write `run_dir/results.json`: the metrics (flat, vLLM's keys), `date`, the resolved
    `config` and the `environment`.

    Returns:
        The file's path.
    """
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    doc = {"date": datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S"),
           **metrics, "config": config or {}, "environment": env or {}}
    path = run_dir / RESULTS_FILE
    tmp = path.with_suffix(".json.tmp")
    with open(tmp, "w") as f:
        dump_results(doc, f)
    tmp.replace(path)
    return path


def dump_results(doc: dict[str, Any], f: TextIO) -> None:
    """Write results.json's text to `f`: one top-level key per line, dicts indented, every
    list (the per-request arrays: millions of numbers in a long run) on one line; non-finite
    floats as null, numpy scalars as numbers, paths as strings.

    NOTE: `json.dumps` with an `indent` runs json's pure-Python encoder; each list goes through
    its C encoder instead, the `_jsonable` walk runs only on a value the encoder refuses (a
    NaN, a numpy integer, a non-string key), and each value is written as it is encoded."""
    sep = "{\n"
    for k, v in doc.items():
        f.write(f"{sep}  {json.dumps(str(k))}: ")
        if isinstance(v, list | tuple):
            _write_list(v, f)
        else:
            f.write(_dumps(v, 2).replace("\n", "\n  "))
        sep = ",\n"
    f.write("\n}\n" if doc else "{}\n")


#: list items encoded at once: the encoder holds a chunk per number until it joins them
_CHUNK = 4096


def _write_list(v: list | tuple, f: TextIO) -> None:
    f.write("[")
    for i in range(0, len(v), _CHUNK):
        if i:
            f.write(", ")
        f.write(_dumps_items(v[i:i + _CHUNK]))
    f.write("]")


def _dumps_items(chunk: list | tuple) -> str:
    """The items of `chunk` as JSON, comma-separated (no brackets).

    NOTE: orjson (a dependency) encodes floats ~12x faster than json's C encoder: a detailed
    100k-request run's `itls` are ~7M floats, 4.6 s of the run with json, 0.4 s with it.
    Its numbers read back as the same floats and NaN / infinity as null, as `_jsonable`
    writes them; a chunk it refuses (numpy scalars, an int past 64 bits) or writes with
    non-ASCII text goes through `json`, as does every chunk where orjson is not installed
    (an image that took the project without its dependencies)."""
    if _orjson is not None:
        try:
            text = _orjson.dumps(chunk)
        except TypeError:
            pass
        else:
            if text.isascii():
                return text[1:-1].decode("ascii")
    return _dumps(chunk, None)[1:-1]


def _dumps(x: Any, indent: int | None) -> str:
    try:
        return json.dumps(x, indent=indent, allow_nan=False)
    except (ValueError, TypeError):
        return json.dumps(_jsonable(x), indent=indent, allow_nan=False)


def load_results(path: Path) -> tuple[dict, dict, dict]:
    """Read a results.json back as (metrics, config, environment).

    Raises:
        ValueError: the file is not a results.json object (the message names the file).
    """
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: cannot read results: {e}") from None
    if not isinstance(doc, dict):
        raise ValueError(f"{path}: results must be a JSON object")
    metrics = {k: v for k, v in doc.items() if k not in META_KEYS}
    return metrics, doc.get("config") or {}, doc.get("environment") or {}


def collect_environment() -> dict[str, Any]:
    """Versions, git commit, device, CPU and GPU names: what a result needs to be reproduced."""
    env: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu": _cpu_name(),
        "num_cpus": _num_cpus(),
    }
    for pkg in _PACKAGES:
        try:
            env[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            env[pkg] = None
    env["git_commit"], env["git_dirty"] = _git_state()
    env["device"], env["gpu"] = "cpu", None
    torch = sys.modules.get("torch")  # a run that never imported torch used no GPU
    if torch is not None and torch.cuda.is_available():
        env["device"] = "cuda"
        env["gpu"] = torch.cuda.get_device_name(0)
        env["cuda"] = torch.version.cuda
    return env


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _num_cpus() -> int | None:
    import os

    return os.cpu_count()


def _git_state() -> tuple[str | None, bool | None]:
    here = Path(__file__).resolve().parent
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True,
                                text=True, timeout=5)
        if commit.returncode != 0:
            return None, None
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                                cwd=here, capture_output=True, text=True, timeout=5)
        return commit.stdout.strip(), bool(status.stdout.strip())
    except (OSError, subprocess.SubprocessError):
        return None, None


def _jsonable(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_jsonable(v) for v in x]
    if isinstance(x, np.generic):
        x = x.item()
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, Path):
        return str(x)
    return x


# ---- the console table -----------------------------------------------------------------
_LATENCY = (("ttft", "Time to First Token", "TTFT"),
            ("tpot", "Time per Output Token (excl. 1st token)", "TPOT"),
            ("itl", "Inter-token Latency", "ITL"),
            ("e2el", "End-to-end Latency", "E2EL"),
            ("queue", "Queueing Time", "Queue"))


def format_table(metrics: dict) -> str:
    """The run summary in the layout of vLLM's `bench serve` output, plus engine metrics."""
    lines = [f"{' Serving Benchmark Result ':=^50}"]

    def row(label: str, key: str, fmt: str = ".2f") -> None:
        v = metrics.get(key)
        if v is None:
            return
        text = f"{v:{fmt}}" if isinstance(v, int | float) and not isinstance(v, bool) else str(v)
        lines.append(f"{label:<40} {text:<10}")

    row("Successful requests:", "completed", "d")
    row("Rejected requests:", "num_rejected", "d")
    row("Maximum request concurrency:", "max_concurrency", "d")
    row("Benchmark duration (s):", "duration")
    row("Total input tokens:", "total_input_tokens", "d")
    row("Total generated tokens:", "total_output_tokens", "d")
    row("Request throughput (req/s):", "request_throughput")
    row("Request goodput (req/s):", "request_goodput")
    row("Output token throughput (tok/s):", "output_throughput")
    row("Peak output token throughput (tok/s):", "max_output_tokens_per_s")
    row("Peak concurrent requests:", "max_concurrent_requests", "d")
    row("Total Token throughput (tok/s):", "total_token_throughput")
    for key, title, short in _LATENCY:
        if f"mean_{key}_ms" not in metrics:
            continue
        lines.append(f"{' ' + title + ' ':-^50}")
        row(f"Mean {short} (ms):", f"mean_{key}_ms")
        row(f"Median {short} (ms):", f"median_{key}_ms")
        pcts = [k for k in metrics if k.startswith("p") and k.endswith(f"_{key}_ms")
                and k != f"p50_{key}_ms"]  # the median is shown already
        for k in sorted(pcts, key=lambda k: float(k[1:].split("_")[0])):
            row(f"P{k[1:].split('_')[0]} {short} (ms):", k)
    lines.append(f"{' Engine ':-^50}")
    row("Steps:", "num_steps", "d")
    row("Preemptions:", "num_preemptions", "d")
    row("  of which swapped to host:", "num_swaps", "d")
    row("Prefix cache hit rate (tokens):", "prefix_cache_hit_rate", ".3f")
    row("Peak KV cache usage (%):", "peak_kv_usage_pct", ".1f")
    row("KV reserved but unused (%):", "kv_waste_pct", ".1f")
    row("Mean batch size (seqs/step):", "mean_batch_size")
    row("Mean tokens per step:", "mean_tokens_per_step")
    if metrics.get("per_client") or metrics.get("deadline_attainment") is not None:
        lines.append(f"{' Clients and SLOs ':-^50}")
        row("Jain's fairness index (rate):", "jain_fairness_index", ".3f")
        row("Max service difference (tokens):", "max_service_difference", ".0f")
        row("Deadline attainment (TTFT):", "deadline_attainment", ".3f")
        for c, g in (metrics.get("per_client") or {}).items():
            lines.append(f"{'  ' + c + ': done / TTFT mean (ms):':<40} "
                         f"{g['completed']}/{g['num_requests']} {g['mean_ttft_ms']:.1f}")
    phases = [metrics.get(f"mean_{p}_time_ms") for p in STEP_PHASES]
    if all(isinstance(v, int | float) for v in phases):
        # one row: where a step's host time goes, in step order
        lines.append("Mean step (ms): " + " ".join(
            f"{p.replace('device_', '')} {v:.2f}" for p, v in zip(STEP_PHASES, phases,
                                                                   strict=True)))
    lines.append("=" * 50)
    return "\n".join(lines)
