"""The building blocks of workloads: the request record, length distributions, arrival
processes and spec checks shared by synthetic workloads and trace files."""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

DISTRIBUTIONS = ("fixed", "uniform", "normal", "lognormal", "zipf")
PROCESSES = ("offline", "poisson", "gamma")
#: the keys of `workload.arrival` (`arrival_times` reads them)
ARRIVAL_KEYS = ("process", "rate", "burstiness")
#: length `dist` -> the keys `sample_lengths` reads for it. Every one takes the bounds `min` and
#: `max` (what conf/workload gives every spec, so switching `dist` keeps them); `uniform` reads
#: `mean` only with `range_ratio`; `fixed` reads `mean` for `value`, `lognormal` `std` for `sigma`
LENGTH_DIST_KEYS: dict[str, tuple[str, ...]] = {
    "fixed": ("dist", "min", "max", "value", "mean"),
    "uniform": ("dist", "min", "max", "mean", "range_ratio"),
    "normal": ("dist", "min", "max", "mean", "std"),
    "lognormal": ("dist", "min", "max", "mean", "sigma", "std"),
    "zipf": ("dist", "min", "max", "alpha"),
}
#: duration `dist` -> the keys `sample_seconds` reads for it
SECONDS_DIST_KEYS: dict[str, tuple[str, ...]] = {
    "fixed": ("dist", "value", "mean"),
    "uniform": ("dist", "min", "max"),
    "exponential": ("dist", "mean"),
}
#: the keys of a length spec and of a duration spec, whatever its `dist`
LENGTH_KEYS = tuple(dict.fromkeys(k for ks in LENGTH_DIST_KEYS.values() for k in ks))
SECONDS_KEYS = tuple(dict.fromkeys(k for ks in SECONDS_DIST_KEYS.values() for k in ks))
#: the longest a workload may span (s), its latest arrival after its earliest (a trace's after
#: `time_scale`): about 32 years; beyond it a timestamp is corrupt (or in the wrong unit), or
#: a synthetic rate far too low
MAX_TRACE_SECONDS = 1e9
#: token ids below this are reserved (the tiny tokenizer's <|endoftext|> and <pad>)
FIRST_TOKEN_ID = 2


class WorkloadError(ValueError):
    """A bad workload spec or trace file. The message names the key (or file and line)."""


@dataclass(slots=True)
class WorkloadRequest:
    """One request of a workload.

    Args:
        prompt_token_ids: the prompt (a list; a synthetic workload's is a
            `schedlab.runs.prompts.LazyTokens`, which draws its list when read).
        max_tokens: output tokens to generate (exact when EOS is ignored).
        arrival_s: seconds after the start of the run at which the request arrives.
        priority: lower runs first under a priority queue (vLLM's convention).
        expected_output_len: the output length a length-aware policy may use (an oracle).
        client_id: the tenant that sent it (fairness policies, per-client metrics).
        deadline_ms: latency objective after arrival (deadline-aware policies).
        slo_class: a named SLO tier (per-class metrics).
        session_id: the conversation this request is a turn of (None: a single request).
        turn: its turn in the conversation, from 0. A turn > 0 holds only its new message in
            `prompt_token_ids`; the driver releases it `think_time_s` after the previous
            turn finished, with the previous prompt and answer prepended (its `arrival_s` is
            the session's start, used only to keep the list ordered).
        think_time_s: the user's pause between the previous answer and this turn.
    """

    prompt_token_ids: Sequence[int]
    max_tokens: int
    arrival_s: float = 0.0
    priority: int = 0
    expected_output_len: int | None = None
    client_id: str | None = None
    deadline_ms: float | None = None
    slo_class: str | None = None
    session_id: str | None = None
    turn: int = 0
    think_time_s: float = 0.0

def random_tokens(rng: np.random.Generator, n: int, vocab_size: int) -> list[int]:
    """`n` token ids drawn uniformly from [2, vocab_size)."""
    ids = rng.integers(FIRST_TOKEN_ID, vocab_size, size=n)
    return token_ints(vocab_size)[ids].tolist()


@functools.lru_cache(maxsize=4)
def token_ints(vocab_size: int) -> np.ndarray:
    """Every token id as one shared int object (an object array): a prompt's list refers to
    them, 8 bytes a token instead of an int of its own (a million prompts' worth)."""
    return np.arange(vocab_size).astype(object)

# ---- lengths ---------------------------------------------------------------------------
def sample_lengths(dist: Any, n: int, rng: np.random.Generator, key: str) -> np.ndarray:
    """Draw `n` integer lengths from a length spec, clipped to its [min, max] (except `fixed`,
    which is exactly its `value`).

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
    check_dist_keys(dist, key)
    lo = get_num(dist, "min", key, 1)
    hi = get_num(dist, "max", key, math.inf, allow_inf=True)
    if lo < 1 or lo > hi:
        raise WorkloadError(f"workload.{key}: need 1 <= min <= max, got min={lo}, max={hi}")
    if name == "fixed":  # NOTE: min and max bound drawn lengths; a fixed one is as given
        v = get_num(dist, "value", key, dist.get("mean"))
        if not 1 <= v < math.inf:
            raise WorkloadError(f"workload.{key}={v:g} must be at least 1 (a length in "
                                "tokens)")
        return np.full(n, round(v), dtype=np.int64)
    if name == "uniform":
        if "range_ratio" in dist:
            mean, r = get_num(dist, "mean", key), get_num(dist, "range_ratio", key)
            if not 0 <= r < 1:
                raise WorkloadError(f"workload.{key}.range_ratio={r} must be in [0, 1)")
            lo, hi = max(lo, math.floor(mean * (1 - r))), min(hi, math.ceil(mean * (1 + r)))
        if math.isinf(hi):
            raise WorkloadError(f"workload.{key}: dist=uniform needs 'max' (or mean+range_ratio)")
        out = rng.integers(int(lo), int(hi) + 1, size=n).astype(float)
    elif name == "normal":
        out = rng.normal(get_num(dist, "mean", key), get_pos(dist, "std", key), size=n)
    elif name == "lognormal":
        mean = get_pos(dist, "mean", key)
        sigma = get_pos(dist, "sigma", key, dist.get("std"))
        out = rng.lognormal(math.log(mean) - sigma * sigma / 2, sigma, size=n)
    else:
        alpha = get_pos(dist, "alpha", key)
        if math.isinf(hi) or hi - lo > 10_000_000:
            raise WorkloadError(f"workload.{key}: dist=zipf needs a 'max' within 1e7 of 'min'")
        k = np.arange(int(lo), int(hi) + 1)
        p = (k - lo + 1.0) ** -alpha
        out = rng.choice(k, size=n, p=p / p.sum()).astype(float)
    return np.clip(np.rint(out), lo, hi).astype(np.int64)


def sample_seconds(dist: Any, n: int, rng: np.random.Generator, key: str) -> np.ndarray:
    """Draw `n` durations (s) >= 0: a number (fixed) or a mapping with `dist` = `fixed`
    (`value`), `uniform` (`min`, `max`) or `exponential` (`mean`).

    Raises:
        WorkloadError: naming `key` and what is wrong.
    """
    if dist is None:
        return np.zeros(n)
    if isinstance(dist, int | float) and not isinstance(dist, bool):
        dist = {"dist": "fixed", "value": dist}
    if not isinstance(dist, Mapping):
        raise WorkloadError(f"workload.{key}={dist!r} must be a number of seconds or a mapping "
                            "with 'dist'")
    name = dist.get("dist", "fixed")
    check_dist_keys(dist, key, SECONDS_DIST_KEYS, "duration")
    if name == "fixed":
        out = np.full(n, get_num(dist, "value", key, dist.get("mean")))
    elif name == "uniform":
        lo, hi = get_num(dist, "min", key, 0.0), get_num(dist, "max", key)
        if lo > hi:
            raise WorkloadError(f"workload.{key}: need min <= max, got min={lo}, max={hi}")
        out = rng.uniform(lo, hi, size=n)
    elif name == "exponential":
        out = rng.exponential(get_pos(dist, "mean", key), size=n)
    else:
        raise WorkloadError(f"workload.{key}.dist={name!r}; accepted: fixed, uniform, exponential")
    if (out < 0).any() or not np.isfinite(out).all():
        raise WorkloadError(f"workload.{key}: durations must be finite and >= 0")
    return out


# ---- arrivals --------------------------------------------------------------------------
def arrival_times(spec: Mapping[str, Any] | None, n: int, rng: np.random.Generator) -> np.ndarray:
    """Arrival times (s) of `n` requests; the first arrives at 0.

    `offline` (or a rate of inf): all at 0. `poisson`: exponential gaps at `rate` req/s.
    `gamma`: gamma gaps with shape `burstiness` and mean 1/rate (burstiness 1 is Poisson,
    below 1 burstier), as vLLM's benchmark draws them.
    """
    spec = spec or {}
    process = get_key(spec, "process", "arrival", "offline")
    if process not in PROCESSES:
        raise WorkloadError(
            f"workload.arrival.process={process!r}; accepted: {', '.join(PROCESSES)}"
            + (" (and 'trace' for a timestamped trace file)" if process == "trace" else "")
        )
    if process == "offline" or n == 0:
        return np.zeros(n)
    rate = get_pos(spec, "rate", "arrival", allow_inf=True)
    if math.isinf(rate):
        return np.zeros(n)
    shape = 1.0 if process == "poisson" else get_pos(spec, "burstiness", "arrival", 1.0)
    with np.errstate(over="ignore"):
        scale = 1.0 / (rate * shape)
    if not math.isfinite(scale):
        raise WorkloadError(f"workload.arrival: rate={rate!r} x burstiness={shape!r} is too "
                            "small to draw gaps from (their mean 1 / (rate x burstiness) "
                            "overflows); raise either")
    times = np.concatenate([[0.0], np.cumsum(rng.gamma(shape, scale, size=n - 1))])
    if not times[-1] <= MAX_TRACE_SECONDS:  # NOTE: also inf and nan
        raise WorkloadError(f"workload.arrival.rate={rate!r} spreads {n} arrivals over "
                            f"{times[-1]:.3g} s; a workload spans at most "
                            f"{MAX_TRACE_SECONDS:.0e} s (~32 years), as a trace does")
    return times


def set_arrivals(reqs: list[WorkloadRequest], spec: Any, rng: np.random.Generator) -> None:
    if spec is not None and not isinstance(spec, Mapping):
        raise WorkloadError(f"workload.arrival={spec!r} must be a mapping with 'process'")
    for r, t in zip(reqs, arrival_times(spec, len(reqs), rng).tolist(), strict=True):
        r.arrival_s = t


# ---- spec helpers ----------------------------------------------------------------------
def get_key(spec: Mapping[str, Any], name: str, key: str, default: Any = None) -> Any:
    if not isinstance(spec, Mapping):
        raise WorkloadError(f"workload.{key}={spec!r} must be a mapping")
    v = spec.get(name, default)
    return default if v is None else v


def get_num(spec: Mapping[str, Any], name: str, key: str, default: Any = None,
            allow_inf: bool = False) -> float:
    """`spec[name]` as a finite float (or inf, where `allow_inf`: a bound or a rate).

    Raises:
        WorkloadError: missing, not a number, NaN, or infinite where that is not allowed.
    """
    v = get_key(spec, name, key, default)
    if v is None:
        raise WorkloadError(f"workload.{key}.{name} is required")
    if isinstance(v, str) and v.strip().lower() in ("inf", "infinity"):
        v = math.inf
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise WorkloadError(f"workload.{key}.{name}={v!r} must be a number")
    if math.isnan(v) or (math.isinf(v) and not (allow_inf and v > 0)):
        accepted = "a number (or inf)" if allow_inf else "a finite number"
        raise WorkloadError(f"workload.{key}.{name}={v!r} must be {accepted}"
                            + (", not NaN" if math.isnan(v) else ""))
    return float(v)


def get_pos(spec: Mapping[str, Any], name: str, key: str, default: Any = None,
            allow_inf: bool = False) -> float:
    v = get_num(spec, name, key, default, allow_inf)
    if not v > 0:
        raise WorkloadError(f"workload.{key}.{name}={v} must be positive")
    return v


def check_keys(node: Any, accepted: Sequence[str], key: str = "", what: str = "",
               entry: str = "") -> None:
    """Refuse a key of the mapping `node` (at `workload.{key}`) that is not in `accepted`.

    Args:
        what: what the node is, for the message (default: its path).
        entry: how a list entry is known, e.g. "client 'a'" (named after its path).

    Raises:
        WorkloadError: naming the first unknown key, what the node is, and the accepted keys.
    """
    if not isinstance(node, Mapping):
        return  # NOTE: not a mapping: its reader says what it must be
    unknown = sorted(str(k) for k in set(node) - set(accepted))
    if unknown:
        path = f"workload.{key}" if key else "workload"
        named = f" ({entry})" if entry else ""
        raise WorkloadError(f"{path}.{unknown[0]}{named} is not a key of {what or path}; "
                            f"accepted: {', '.join(accepted)}")


def dist_keys(node: Mapping[str, Any],
              table: Mapping[str, tuple[str, ...]] = LENGTH_DIST_KEYS) -> tuple[str, ...] | None:
    """The keys the spec `node` reads for its `dist` (default fixed), by `table`; None for an
    unknown `dist` (its reader names the accepted ones)."""
    name = node.get("dist", "fixed")
    keys = table.get(name) if isinstance(name, str) else None
    if keys is not None and table is LENGTH_DIST_KEYS and name == "uniform" and (
            "range_ratio" not in node):
        keys = tuple(k for k in keys if k != "mean")
    return keys


def check_dist_keys(node: Any, key: str, table: Mapping[str, tuple[str, ...]] = LENGTH_DIST_KEYS,
                    what: str = "length") -> None:
    """Refuse a key of the spec `node` (at `workload.{key}`) that its `dist` does not read.

    Raises:
        WorkloadError: naming the key, the distribution and the keys it reads.
    """
    if not isinstance(node, Mapping):
        return
    accepted = dist_keys(node, table)
    unknown = sorted(str(k) for k in set(node) - set(accepted or node))
    if accepted is not None and unknown:
        name, bad = node.get("dist", "fixed"), unknown[0]
        plain = " without range_ratio" if bad in table[name] else ""  # uniform's mean
        raise WorkloadError(f"workload.{key}.{bad} is not read by a dist={name} {what} spec"
                            f"{plain}; accepted: {', '.join(table[name])} (on the command line, "
                            f"~workload.{key}.{bad} drops it)")


def get_int(spec: Mapping[str, Any], name: str, minimum: int) -> int:
    v = spec.get(name)
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise WorkloadError(f"workload.{name}={v!r} must be an integer >= {minimum}")
    return v
