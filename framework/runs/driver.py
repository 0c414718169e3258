"""`run_workload`: a workload through an engine or a cluster, on the one run loop
(`schedlab.cluster.loop`, whose docstring describes the events)."""

from __future__ import annotations

import gc
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from schedlab.config import ConfigError
from schedlab.request import SamplingParams
from schedlab.runs.distributions import WorkloadRequest
from schedlab.runs.run_result import RunResult
from schedlab.runs.stall import PLUGIN_TIMEOUT_S, stall_watch

if TYPE_CHECKING:
    from schedlab.cluster.cluster import Cluster
    from schedlab.cluster.record import StepsOut
    from schedlab.engine import Engine
    from schedlab.runs.interrupt import InterruptLatch


def run_workload(
    target: Engine | Cluster,
    workload: Sequence[WorkloadRequest],
    *,
    temperature: float = 0.0,
    ignore_eos: bool = True,
    max_concurrency: int | None = None,
    progress: bool = False,
    params: Sequence[SamplingParams] | None = None,
    request_ids: Sequence[str] | None = None,
    check: bool = False,
    save_detailed: bool = True,
    interrupt: InterruptLatch | None = None,
    steps_out: StepsOut | None = None,
    workers: int = 1,
    plugin_timeout_s: float | None = PLUGIN_TIMEOUT_S,
) -> RunResult:
    """Release the workload at its arrival times and step the instances until every request
    has ended.

    Args:
        target: an engine (a cluster of one; requests it already holds are run along but not
            reported) or a cluster.
        workload: the requests, with `arrival_s` relative to the start of the run.
        temperature: sampling temperature for every request (0: greedy).
        ignore_eos: generate exactly `max_tokens` per request (benchmark lengths).
        max_concurrency: at most this many requests in flight in the whole cluster (vLLM
            bench's `--max-concurrency`); a held-back request's clock starts at a free seat.
        progress: show a tqdm bar of requests done.
        params: each request's sampling parameters (instead of `temperature`, `ignore_eos`
            and the workload's `max_tokens`), aligned with `workload`.
        request_ids: each request's id, aligned with `workload` (None: counted).
        check: run `check_integrity()` after every step (tests).
        save_detailed: keep every request (`RunResult.requests`); False streams: each
            request is reduced to the numbers the summary metrics need (`RunResult.stats`:
            its timestamps, token counts, token times, client, SLO class and deadline) when
            it ends and forgotten, so a run keeps 8 bytes per token and a few numbers per
            request instead of the requests (the same summary, per-client, per-SLO-class
            and fairness figures included; no per-request lists in the metrics).
        interrupt: a Ctrl-C watched by the caller (`schedlab run`), raised again at the next
            event should its KeyboardInterrupt have been swallowed.
        steps_out: called with the run's step records, a list at a time in the run's step
            order (by time, ties by the lower instance), all of them once the run returns
            (`schedlab run` writes steps.csv's rows). Streaming, it gets them as the run goes
            and they are not kept: `RunResult.step_totals` has what the engine metrics read
            (a cluster's `interrupt()` hands on the rest).
        workers: simulate the cluster's instances in this many processes forked from this
            one (`schedlab.cluster.parallel`): the same run, every number equal, for
            simulated instances behind a router whose choices depend on the order alone
            (round robin), without `max_concurrency` or sessions; the cluster runs nothing
            more afterwards.
        plugin_timeout_s: a plugin call (scheduler, queue, KV allocator, prefix cache,
            router) that has not returned after this many seconds stops the run with a
            `PluginRuntimeError` naming it (`schedlab.runs.stall`); None: the run waits.

    Returns:
        The run: every request finished or rejected, in workload order, with its timestamps
        (streaming: their stats).

    Raises:
        ValueError: `max_concurrency` below 1, `params` or `request_ids` of the wrong length,
            or a session's turns out of order.
        ConfigError: `workers` above 1 for a run that cannot be split (the sentence says why),
            or `plugin_timeout_s` not a positive number.
        PluginRuntimeError: a plugin raised, or did not return within `plugin_timeout_s`.
        RuntimeError: requests are outstanding and no instance can make progress (a plugin
            lost or stalls them), within `schedlab.cluster.loop.MAX_STALLED_STEPS` steps.
    """
    from schedlab.cluster.cluster import Cluster
    from schedlab.cluster.loop import RunLoop, WorkloadParams

    for name, xs in (("params", params), ("request_ids", request_ids)):
        if xs is not None and len(xs) != len(workload):
            raise ValueError(f"{len(workload)} requests but {len(xs)} {name}")
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ConfigError(f"workers={workers!r} must be an integer >= 1")
    if plugin_timeout_s is not None and (
            isinstance(plugin_timeout_s, bool) or not isinstance(plugin_timeout_s, int | float)
            or not plugin_timeout_s > 0 or plugin_timeout_s == float("inf")):
        raise ConfigError(f"plugin_timeout_s={plugin_timeout_s!r} must be a number of seconds "
                          "> 0, or None to wait for a plugin call however long it takes")
    if params is None:
        params = WorkloadParams(workload, temperature, ignore_eos)
    cluster = target if isinstance(target, Cluster) else Cluster.around(target)
    loop = RunLoop(cluster, list(workload), params, request_ids, max_concurrency, check,
                   stream=not save_detailed)
    loop.interrupt = interrupt
    if workers > 1:
        from schedlab.cluster.parallel import split_refusal

        why = split_refusal(loop, workers)
        if why is not None:
            raise ConfigError(f"workers={workers} (driver.workers): this run cannot be split "
                              f"over processes: {why}; use workers=1")
    if steps_out is not None:
        if not save_detailed:
            cluster.stream_steps(steps_out)
        elif workers == 1:  # NOTE: steps.csv's writer formats them as the run goes
            cluster.tap_steps(steps_out)
    bar = progress_bar(len(workload), progress)
    try:
        with fewer_collections(), frozen_survivors(), stall_watch(cluster,
                                                                  timeout=plugin_timeout_s):
            if workers > 1:
                from schedlab.cluster.parallel import run_split

                run_split(loop, workers, bar)
            else:
                loop.run(bar)
    finally:
        bar.close()
    run = cluster.result(max_concurrency)
    if steps_out is not None and save_detailed and not cluster.finish_tap(run):
        steps_out(run.step_stats)
    return run


#: objects allocated (net) between two young-generation collections while a run loop runs
GC_YOUNG_THRESHOLD = 100_000


@contextmanager
def fewer_collections() -> Iterator[None]:
    """Python's cyclic collector run less often inside the block (its young generation's
    threshold raised to `GC_YOUNG_THRESHOLD`, then put back when the outermost block ends,
    whichever thread ran it; a collector switched off stays off).

    NOTE: a run allocates a few objects per token and step that die young, and keeps the
    requests and step records, so that at the default 700 the collector ran ~1,000 times in
    a 100k-request run and walked every object kept several times (1.6 s of 24 s); nothing
    a run makes needs the collector to be freed (its cycles wait for the next collection)."""
    with _outermost(_GC_SAVED, _raise_threshold, _put_back_threshold):
        yield


def _raise_threshold() -> tuple[int, ...]:
    old = gc.get_threshold()
    if old[0]:
        gc.set_threshold(max(old[0], GC_YOUNG_THRESHOLD), *old[1:])
    return old


def _put_back_threshold(old: tuple[int, ...]) -> None:
    gc.set_threshold(*old)


@contextmanager
def frozen_survivors() -> Iterator[None]:
    """Inside the block (a run loop), what each collection leaves alive is frozen
    (`gc.freeze`, from a `gc.callbacks` entry), so no later collection walks it again; when
    the outermost block ends, whichever thread ran it, the callback goes and everything
    frozen since goes back to the oldest generation (`gc.unfreeze`). Not where something was
    frozen already when the outermost block began (a caller's own freeze, e.g. before
    forking, is left as it is, and nothing more is frozen).

    NOTE: with the young threshold raised (`fewer_collections`), a detailed run's older
    generation still walked each kept request again (~0.6 s of a 100k-request run); frozen,
    nothing walks it. A cycle that dies young is collected as before; one that outlives a
    collection inside the block is freed after it (the run loop makes none). While the block
    is open `gc.get_objects()` does not list what is frozen."""
    with _outermost(_FREEZE_DEPTH, _start_freezing, _stop_freezing):
        yield


def _start_freezing() -> bool:
    freezing = not gc.get_freeze_count()
    if freezing:
        gc.callbacks.append(_freeze_survivors)
    return freezing


def _stop_freezing(freezing: bool) -> None:
    if freezing:
        if _freeze_survivors in gc.callbacks:
            gc.callbacks.remove(_freeze_survivors)
        gc.unfreeze()  # NOTE: back in the oldest generation, collected as ever


@contextmanager
def _outermost(stack: list[Any], begin: Callable[[], Any],
               end: Callable[[Any], None]) -> Iterator[None]:
    """A block of which the outermost open one (of those sharing `stack`, in any thread)
    runs `begin` when it opens and `end(what begin returned)` when it closes: overlapping
    blocks of two threads leave the state as the first found it."""
    with _GC_LOCK:
        stack.append(stack[0] if stack else begin())
    try:
        yield
    finally:
        with _GC_LOCK:
            value = stack.pop()
            if not stack:
                end(value)


def _freeze_survivors(phase: str, info: dict[str, int]) -> None:
    """`gc.callbacks` entry of `frozen_survivors`: what a collection left alive goes to the
    permanent generation."""
    if phase == "stop":
        gc.freeze()


#: the thresholds saved by the outermost `fewer_collections` block, once per open block
_GC_SAVED: list[tuple[int, ...]] = []
_GC_LOCK = threading.Lock()
#: one entry per open `frozen_survivors` block: whether the outermost one freezes
_FREEZE_DEPTH: list[bool] = []


class _NoBar:
    def update(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass


def progress_bar(total: int, enabled: bool):
    """A tqdm bar over `total` requests, or one that does nothing."""
    if not enabled:
        return _NoBar()
    from tqdm.auto import tqdm

    return tqdm(total=total, desc="requests", unit="req")
