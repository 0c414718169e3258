"""What the metrics read from the filed requests' token times (`RequestStats.all_token_times`):
the times themselves, the gaps between them and the busiest second, read in chunks of whole
requests so that no index array of the run's size is made."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from schedlab.runs.request_stats import RequestStats

#: tokens per chunk of `token_chunks`
CHUNK_TOKENS = 1 << 20
#: the chunk `itls` reads (each chunk's gaps become a list of floats at once)
ITL_CHUNK_TOKENS = 1 << 16


def token_chunks(stats: RequestStats, positions: np.ndarray,
                 chunk_tokens: int | None = None) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """The token times of the requests at `positions`, request after request, in chunks of
    whole requests of about `chunk_tokens` tokens (default `CHUNK_TOKENS`): (times, each
    request's token count) per chunk."""
    times = stats.all_token_times()
    chunk = CHUNK_TOKENS if chunk_tokens is None else chunk_tokens
    counts = stats.num_tokens[positions]
    token_at = stats.token_at
    ends = np.cumsum(counts)
    lo = 0
    while lo < len(positions):
        limit = ends[lo] - counts[lo] + chunk
        hi = max(lo + 1, int(np.searchsorted(ends, limit, side="right")))
        c = counts[lo:hi]
        before = np.cumsum(c) - c
        idx = np.repeat(token_at[positions[lo:hi]] - before, c) + np.arange(int(c.sum()))
        yield times[idx], c
        lo = hi


def token_times(stats: RequestStats, positions: np.ndarray) -> np.ndarray:
    """The token times of the requests at `positions`, request after request."""
    out = np.empty(int(stats.num_tokens[positions].sum()))
    at = 0
    for times, _ in token_chunks(stats, positions):
        out[at:at + len(times)] = times
        at += len(times)
    return out


def pooled_itls(stats: RequestStats, done: np.ndarray) -> np.ndarray:
    """Every inter-token gap of the completed requests `done`, request after request."""
    out = np.empty(int(stats.num_tokens[done].sum()) - len(done))
    at = 0
    for times, counts in token_chunks(stats, done):
        gaps = np.diff(times)
        # NOTE: the difference across two requests' tokens is no gap: drop each one's last
        keep = np.ones(len(gaps), bool)
        keep[np.cumsum(counts)[:-1] - 1] = False
        n = len(gaps) - len(counts) + 1
        out[at:at + n] = gaps[keep]
        at += n
    return out


def itls(stats: RequestStats, done: np.ndarray) -> list[list[float]]:
    """Each completed request's gaps, as lists (the same floats as `np.diff` of each request's
    times).

    NOTE: one `diff` and one `tolist` per chunk of whole requests, each request's list a slice
    of the chunk's (a gap across two requests' tokens skipped), not one of each per request
    (200k numpy calls in a 100k-request run). Chunks of `ITL_CHUNK_TOKENS`: the chunk's arrays
    and list are all it holds beyond the lists it returns."""
    out: list[list[float]] = []
    add = out.append
    for times, counts in token_chunks(stats, done, ITL_CHUNK_TOKENS):
        gaps = np.diff(times).tolist()
        at = 0
        for c in counts.tolist():
            add(gaps[at:at + c - 1] if c > 1 else [])
            at += c
    return out


def peak_output_rate(stats: RequestStats) -> float:
    """The most output tokens of completed requests in one whole second of the run (vLLM's
    `max_output_tokens_per_s`).

    NOTE: counted over the seconds that have tokens (each chunk's distinct seconds, then
    summed once): a run whose tokens span 1e12 s (a near-zero arrival rate, a trace's far
    timestamps) costs what its tokens cost, not an array with one entry per second."""
    keys, counts = [], []
    for times, _ in token_chunks(stats, stats.completed):
        seconds, n = np.unique(np.floor(times - stats.start_time), return_counts=True)
        keys.append(seconds)
        counts.append(n)
    if not keys:
        return 0.0
    _, where = np.unique(np.concatenate(keys), return_inverse=True)
    return float(np.bincount(where, weights=np.concatenate(counts)).max())
