"""Workloads: the requests a run submits, with arrival times, prompts and output limits.

`build_workload(spec, vocab_size, seed)` turns a plain dict (the CLI converts its config to one)
into a list of `WorkloadRequest`s. Three kinds:

- `synthetic`: random-token prompts (like vLLM's `random` dataset) with lengths drawn from
  `input_len` / `output_len`;
- `shared_prefix`: `num_groups` system prompts of `prefix_len` tokens, each request one of them
  followed by its own suffix of `input_len` tokens;
- `trace`: a file (ShareGPT, Azure LLM inference trace, BurstGPT, JSONL), see `schedlab.traces`.

Arrival times come from `arrival` (`offline`, `poisson`, `gamma`) or, for timestamped traces,
from the file. The same spec and seed always give the same workload.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

TYPES = ("synthetic", "shared_prefix", "trace")
DISTRIBUTIONS = ("fixed", "uniform", "normal", "lognormal", "zipf")
PROCESSES = ("offline", "poisson", "gamma")
#: token ids below this are reserved (the tiny tokenizer's <|endoftext|> and <pad>)
FIRST_TOKEN_ID = 2


class WorkloadError(ValueError):
    """A bad workload spec or trace file. The message names the key (or file and line)."""


@dataclass(slots=True)
class WorkloadRequest:
    """One request of a workload.

    Args:
        prompt_token_ids: the prompt.
        max_tokens: output tokens to generate (exact when EOS is ignored).
        arrival_s: seconds after the start of the run at which the request arrives.
        priority: lower runs first under a priority queue (vLLM's convention).
        expected_output_len: the output length a length-aware policy may use (an oracle).
    """

    prompt_token_ids: list[int]
    max_tokens: int
    arrival_s: float = 0.0
    priority: int = 0
    expected_output_len: int | None = None


def build_workload(
    spec: Mapping[str, Any], vocab_size: int, seed: int = 0
) -> list[WorkloadRequest]:
    """Build the requests a spec describes, sorted by arrival time.

    Args:
        spec: `type` ("synthetic" | "shared_prefix" | "trace"), `num_requests`, `input_len`,
            `output_len`, `arrival`, and per type `num_groups`, `prefix_len` or `path`,
            `format`, `time_scale`, `max_rows`. `oracle_output_len` (default true) sets each
            request's `expected_output_len` to its true output length; `priority_levels` K
            gives each request a uniform random priority in [0, K) (trace files may carry
            their own `priority`).
        vocab_size: the model's vocabulary; random token ids lie in [2, vocab_size).
        seed: seeds every random draw.

    Returns:
        The requests, ordered by `arrival_s` (ties keep their generation order).

    Raises:
        WorkloadError: a spec value is missing or out of range (the message names the key and
            the accepted values), or a trace file is malformed (file name and line).
    """
    if not isinstance(spec, Mapping):
        raise WorkloadError(f"workload spec must be a mapping, got {type(spec).__name__}")
    if not isinstance(vocab_size, int) or vocab_size <= FIRST_TOKEN_ID:
        raise WorkloadError(f"vocab_size={vocab_size!r} must be an integer > {FIRST_TOKEN_ID}")
    kind = spec.get("type", "synthetic")
    if kind not in TYPES:
        raise WorkloadError(f"workload.type={kind!r}; accepted: {', '.join(TYPES)}")
    rng = np.random.default_rng(seed)
    if kind == "trace":
        from schedlab.traces import load_trace

        reqs = load_trace(spec, vocab_size, rng)
        arrival = spec.get("arrival")
        if arrival is not None and _get(arrival, "process", "arrival", "offline") != "trace":
            _set_arrivals(reqs, arrival, rng)
    else:
        n = _int(spec, "num_requests", minimum=1)
        inputs = sample_lengths(spec.get("input_len"), n, rng, "input_len")
        outputs = sample_lengths(spec.get("output_len"), n, rng, "output_len")
        if kind == "synthetic":
            prompts = [random_tokens(rng, int(k), vocab_size) for k in inputs]
        else:
            prompts = _shared_prefix_prompts(spec, inputs, vocab_size, rng)
        reqs = [WorkloadRequest(p, int(o)) for p, o in zip(prompts, outputs, strict=True)]
        _set_arrivals(reqs, spec.get("arrival"), rng)
    oracle = spec.get("oracle_output_len", True)
    for r in reqs:
        r.expected_output_len = r.max_tokens if oracle else None
    levels = spec.get("priority_levels")
    if levels is not None:
        levels = _int(spec, "priority_levels", minimum=1)
        for r, p in zip(reqs, rng.integers(0, levels, size=len(reqs)), strict=True):
            r.priority = int(p)
    order = sorted(range(len(reqs)), key=lambda i: (reqs[i].arrival_s, i))
    return [reqs[i] for i in order]


def random_tokens(rng: np.random.Generator, n: int, vocab_size: int) -> list[int]:
    """`n` token ids drawn uniformly from [2, vocab_size)."""
    return rng.integers(FIRST_TOKEN_ID, vocab_size, size=n).tolist()


def _shared_prefix_prompts(spec: Mapping[str, Any], suffix_lens: np.ndarray, vocab_size: int,
                           rng: np.random.Generator) -> list[list[int]]:
    groups = _int(spec, "num_groups", minimum=1)
    prefix_len = _int(spec, "prefix_len", minimum=0)
    prefixes = [random_tokens(rng, prefix_len, vocab_size) for _ in range(groups)]
    # round-robin over groups, so every group gets requests and arrivals interleave
    return [prefixes[i % groups] + random_tokens(rng, int(k), vocab_size)
            for i, k in enumerate(suffix_lens)]


# ---- lengths ---------------------------------------------------------------------------
def sample_lengths(dist: Any, n: int, rng: np.random.Generator, key: str) -> np.ndarray:
    """Draw `n` integer lengths from a length spec, clipped to its [min, max].

    A spec is an integer (fixed) or a mapping with `dist` and its parameters:
    `fixed` (`value` or `mean`), `uniform` (`min`, `max`; or `mean` with `range_ratio` as in
    vLLM's random dataset), `normal` (`mean`, `std`), `lognormal` (`mean` of the distribution
    and `sigma` of the underlying normal), `zipf` (`alpha` > 0 over [min, max]: P(k) is
    proportional to (k - min + 1) ** -alpha).

    Raises:
        WorkloadError: naming `key` and what is wrong.
    """
    if dist is None:
        raise WorkloadError(f"workload.{key} is required (an integer or a mapping with 'dist')")
    if isinstance(dist, int) and not isinstance(dist, bool):
        dist = {"dist": "fixed", "value": dist}
    if not isinstance(dist, Mapping):
        raise WorkloadError(f"workload.{key}={dist!r} must be an integer or a mapping with 'dist'")
    name = dist.get("dist", "fixed")
    if name not in DISTRIBUTIONS:
        raise WorkloadError(f"workload.{key}.dist={name!r}; accepted: {', '.join(DISTRIBUTIONS)}")
    lo = _num(dist, "min", key, 1)
    hi = _num(dist, "max", key, math.inf)
    if lo < 1 or lo > hi:
        raise WorkloadError(f"workload.{key}: need 1 <= min <= max, got min={lo}, max={hi}")
    if name == "fixed":
        v = _num(dist, "value", key, dist.get("mean"))
        if not lo <= v <= hi:
            raise WorkloadError(f"workload.{key}={v:g} must be within [{lo:g}, {hi:g}] (a length "
                                "is at least 1 token)")
        out = np.full(n, v, dtype=float)
    elif name == "uniform":
        if "range_ratio" in dist:
            mean, r = _num(dist, "mean", key), _num(dist, "range_ratio", key)
            if not 0 <= r < 1:
                raise WorkloadError(f"workload.{key}.range_ratio={r} must be in [0, 1)")
            lo, hi = max(lo, math.floor(mean * (1 - r))), min(hi, math.ceil(mean * (1 + r)))
        if math.isinf(hi):
            raise WorkloadError(f"workload.{key}: dist=uniform needs 'max' (or mean+range_ratio)")
        out = rng.integers(int(lo), int(hi) + 1, size=n).astype(float)
    elif name == "normal":
        out = rng.normal(_num(dist, "mean", key), _pos(dist, "std", key), size=n)
    elif name == "lognormal":
        mean = _pos(dist, "mean", key)
        sigma = _pos(dist, "sigma", key, dist.get("std"))
        out = rng.lognormal(math.log(mean) - sigma * sigma / 2, sigma, size=n)
    else:
        alpha = _pos(dist, "alpha", key)
        if math.isinf(hi) or hi - lo > 10_000_000:
            raise WorkloadError(f"workload.{key}: dist=zipf needs a 'max' within 1e7 of 'min'")
        k = np.arange(int(lo), int(hi) + 1)
        p = (k - lo + 1.0) ** -alpha
        out = rng.choice(k, size=n, p=p / p.sum()).astype(float)
    return np.clip(np.rint(out), lo, hi).astype(np.int64)


# ---- arrivals --------------------------------------------------------------------------
def arrival_times(spec: Mapping[str, Any] | None, n: int, rng: np.random.Generator) -> np.ndarray:
    """Arrival times (s) of `n` requests; the first arrives at 0.

    `offline` (or a rate of inf): all at 0. `poisson`: exponential gaps at `rate` req/s.
    `gamma`: gamma gaps with shape `burstiness` and mean 1/rate (burstiness 1 is Poisson,
    below 1 burstier), as vLLM's benchmark draws them.
    """
    spec = spec or {}
    process = _get(spec, "process", "arrival", "offline")
    if process not in PROCESSES:
        raise WorkloadError(
            f"workload.arrival.process={process!r}; accepted: {', '.join(PROCESSES)}"
            + (" (and 'trace' for a timestamped trace file)" if process == "trace" else "")
        )
    if process == "offline" or n == 0:
        return np.zeros(n)
    rate = _pos(spec, "rate", "arrival")
    if math.isinf(rate):
        return np.zeros(n)
    shape = 1.0 if process == "poisson" else _pos(spec, "burstiness", "arrival", 1.0)
    gaps = rng.gamma(shape, 1.0 / (rate * shape), size=n - 1)
    return np.concatenate([[0.0], np.cumsum(gaps)])


def _set_arrivals(reqs: list[WorkloadRequest], spec: Any, rng: np.random.Generator) -> None:
    if spec is not None and not isinstance(spec, Mapping):
        raise WorkloadError(f"workload.arrival={spec!r} must be a mapping with 'process'")
    for r, t in zip(reqs, arrival_times(spec, len(reqs), rng), strict=True):
        r.arrival_s = float(t)


# ---- spec helpers ----------------------------------------------------------------------
def _get(spec: Mapping[str, Any], name: str, key: str, default: Any = None) -> Any:
    if not isinstance(spec, Mapping):
        raise WorkloadError(f"workload.{key}={spec!r} must be a mapping")
    v = spec.get(name, default)
    return default if v is None else v


def _num(spec: Mapping[str, Any], name: str, key: str, default: Any = None) -> float:
    v = _get(spec, name, key, default)
    if v is None:
        raise WorkloadError(f"workload.{key}.{name} is required")
    if isinstance(v, str) and v.strip().lower() in ("inf", "infinity"):
        return math.inf
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise WorkloadError(f"workload.{key}.{name}={v!r} must be a number")
    return float(v)


def _pos(spec: Mapping[str, Any], name: str, key: str, default: Any = None) -> float:
    v = _num(spec, name, key, default)
    if not v > 0:
        raise WorkloadError(f"workload.{key}.{name}={v} must be positive")
    return v


def _int(spec: Mapping[str, Any], name: str, minimum: int) -> int:
    v = spec.get(name)
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise WorkloadError(f"workload.{name}={v!r} must be an integer >= {minimum}")
    return v
