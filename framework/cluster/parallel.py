"""A simulated cluster's instances run in worker processes (`run_workload(..., workers=N)`,
`schedlab run driver.workers=N`): the same run, every number equal, in less wall time on a
machine with the cores.

A run splits when nothing couples its instances but the timeline: every instance simulates
(a virtual clock each), the router's choices depend on the requests' order alone
(`Router.static_routes`: round robin), with no cap on the requests in flight (a seat freed
on one instance releases a request to another), no sessions (a turn's end releases the next)
and no prefill/decode split (requests move between instances). `split_refusal` says which of
these a run breaks.

Instance `i` goes to worker `i % N`. Each worker is forked from the run's process with the
cluster and the workload as built, and runs the one run loop (`schedlab.cluster.loop`) over
its instances and the releases routed to them. Streaming (`save_detailed=False`), every
`DRAIN_STEPS` of its steps it hands the run's process its step records, its instances'
clocks and its ended requests' stats; the run's process merges the records into the run's
step order with the run's own `StepStream` (by time, ties by the lower instance: steps.csv,
the cluster-wide series and the engine metrics as one process makes them) and files the
stats by workload position. A detailed run's worker hands over its requests and each
instance's step records at the end (the run's process then holds them as after a run in one
process, and `RunRecord.result` merges the steps as it does there).

NOTE: an instance sees in a worker what it sees in one process. A request released at `t`
reaches its instance before the first of that instance's steps to start at or after `t` (one
process: once every busy instance has reached `t`, that one among them), an idle instance's
clock jumps to an arrival, and the request ids are the cluster's counter in routing order:
nothing an instance sees depends on the others.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
from collections.abc import Sequence
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import TYPE_CHECKING, cast

import numpy as np

from schedlab.clock import VirtualClock
from schedlab.cluster.instance import Instance, InstanceSummary
from schedlab.cluster.record import DRAIN_STEPS
from schedlab.cluster.router import InstanceLoad
from schedlab.cluster.split_pack import unpack_request, unpack_steps
from schedlab.cluster.split_worker import Noted, worker_main
from schedlab.request import Request
from schedlab.runs.distributions import token_ints
from schedlab.stats import EngineCounters, StepStats

if TYPE_CHECKING:
    from schedlab.cluster.loop import RunLoop

#: step records the run's process holds, taken and not yet handed on, above which it reads
#: only from the worker furthest behind (the others wait on their pipes): a bound on the
#: records held while one worker runs ahead of another
HOLD_STEPS = 16 * DRAIN_STEPS

#: seconds the run's process waits for a worker that should be ending to end
REAP_S = 5.0
#: seconds the run's process waits for a message before it looks for a Ctrl-C again
POLL_S = 0.1

_INF = float("inf")


def split_refusal(loop: RunLoop, workers: int) -> str | None:
    """Why the run of `loop` cannot be split over `workers` processes (None: it can). No
    state change."""
    cluster = loop.cluster
    pool = cluster.entry
    if not hasattr(os, "fork"):
        return "this platform cannot fork processes"
    if cluster.config.disaggregated:
        return "prefill/decode disaggregation moves requests between instances"
    if len(pool) < workers:
        return (f"the cluster has {len(pool)} instance{'s' * (len(pool) != 1)}, fewer than "
                f"{workers} workers (cluster.num_instances)")
    if not all(isinstance(i.engine.clock, VirtualClock) for i in cluster.instances):
        return ("its instances do not simulate (executor=sim): a real model's steps run on "
                "this process's device and clock")
    if loop.seats is not None:
        return ("max_concurrency couples the instances (a seat freed on one releases a request "
                "to another)")
    if loop.nxt:
        return "the workload has sessions (a turn's end releases the next turn)"
    if cluster.router.static_routes(0) is None:
        return (f"router {cluster.router_name} chooses by the requests or the instances' load; "
                "a split run needs one whose choices depend on the order alone "
                "(router=round_robin)")
    return None


def run_split(loop: RunLoop, workers: int, bar) -> None:
    """Run `loop` (see `RunLoop.run`) over `workers` forked processes; `split_refusal` must
    have found nothing. Afterwards the cluster's instances are `WorkerInstance`s (the
    workers' final clocks, counters and summaries): its run's result is read as after
    `RunLoop.run`, and the cluster runs nothing more. Changes state.

    Raises:
        KeyboardInterrupt: Ctrl-C, after every worker ended its requests in flight and handed
            over what it had (the cluster's `interrupt()` then gives the partial run).
        RuntimeError: a worker died without handing over its results.
        Exception: what a worker's run raised (a plugin's error), raised here.
    """
    cluster = loop.cluster
    routes = cluster.router.static_routes(len(loop.arrival_times))
    assert routes is not None, "split_refusal() first"
    ids: Sequence[int] | None = None
    if loop.ids is None:  # NOTE: the ids the cluster's counter would give, in routing order
        ids = cluster.take_ids(len(routes))
    conns: list[Connection] = []
    procs: list[BaseProcess] = []
    fork = multiprocessing.get_context("fork")
    # NOTE: a Ctrl-C is noted, not raised, from before the first fork to the end: the
    # workers stop between two events (their loop checks the note), and this process goes on
    # taking what they hand over; a KeyboardInterrupt raised half way through either would
    # leave a request or a message half done
    noted = Noted()
    old = signal.getsignal(signal.SIGINT)
    watch = (threading.current_thread() is threading.main_thread()
             and old not in (signal.SIG_IGN, None))
    old_wakeup = -1
    if watch:
        signal.signal(signal.SIGINT, noted.handle)
        # NOTE: a signal also writes a byte here, which wakes the wait for messages at once
        noted.wakeup, wakeup = os.pipe()
        os.set_blocking(noted.wakeup, False)
        os.set_blocking(wakeup, False)
        old_wakeup = signal.set_wakeup_fd(wakeup)
    try:
        for w in range(workers):
            recv, send = fork.Pipe(duplex=False)
            proc = fork.Process(target=worker_main, name=f"schedlab-worker-{w}", daemon=True,
                                args=(loop, w, workers, routes, ids, send, noted,
                                      [*conns, recv]))
            proc.start()
            send.close()
            conns.append(recv)
            procs.append(proc)
        _merge(loop, conns, procs, bar, noted)
    finally:
        if watch:
            signal.set_wakeup_fd(old_wakeup)
            signal.signal(signal.SIGINT, old)
            os.close(noted.wakeup)
            os.close(wakeup)
        for worker in procs:
            _reap(worker)
        for c in conns:
            c.close()
    if noted.seen:
        raise KeyboardInterrupt


class WorkerInstance:
    """An instance that ran in a worker process, as the run's process holds it: the step
    records its worker handed over (not yet merged), its clock, and once it ended its
    counters and summary (what `RunRecord.result`, `StepStream` and the cluster's summary
    read of an instance).

    Args:
        inst: the instance, as it was when the worker was forked.
    """

    def __init__(self, inst: Instance) -> None:
        self.index = inst.index
        self.engine = self  # NOTE: the parts of an engine the run's books read
        self.step_stats: list[StepStats] = []
        self.drained_kv_peak = 0
        self.pending: list[object] = []  # NOTE: no transfer waits here (`has_pending`)
        self._clock = inst.now()
        self._got: list[StepStats] = []
        self._counters = inst.engine.counters()
        self._summary = inst.summary()
        self._final_clock: float | None = None

    def now(self) -> float:
        return self._clock

    def is_busy(self) -> bool:
        return False

    def counters(self) -> EngineCounters:
        return self._counters

    def summary(self) -> InstanceSummary:
        return self._summary

    def drain_step_stats(self) -> list[StepStats]:
        got, self._got = self._got, []
        return got

    def abort_all(self) -> None:
        """Nothing is in flight here: its worker ended the requests (a run cut short)."""

    def handed(self, steps: list[StepStats], clock: float) -> None:
        """The worker handed over `steps` and the instance's clock now. Changes state."""
        if steps:
            self._got.extend(steps)
        self._clock = clock

    def ended(self, counters: EngineCounters, summary: InstanceSummary, clock: float) -> None:
        """The worker's run ended: the instance steps no more (its clock holds no step
        record back until `settle`). Changes state."""
        self._counters, self._summary, self._final_clock = counters, summary, clock
        self._clock = _INF

    def settle(self) -> None:
        """Every worker ended: the clock is the instance's last. Changes state."""
        if self._final_clock is not None:
            self._clock = self._final_clock

    def load(self, cached_prefix_tokens: int = 0) -> InstanceLoad:
        del cached_prefix_tokens
        raise self._spent()

    def add(self, *args: object) -> Request:
        del args
        raise self._spent()

    def step(self) -> None:
        raise self._spent()

    def _spent(self) -> RuntimeError:
        return RuntimeError(f"instance {self.index} ran in a worker process of a split run "
                            "(workers > 1); that cluster runs nothing more: build a new one")


# ---- the run's process -------------------------------------------------------------------
def _merge(loop: RunLoop, conns: list[Connection], procs: list[BaseProcess], bar,
           noted: Noted) -> None:
    """Take what the workers hand over until every one has ended (see `run_split`); pass a
    noted Ctrl-C on to them, once."""
    cluster = loop.cluster
    record = cluster.run_record
    stream, stats = record.steps, record.stats
    remote = [WorkerInstance(inst) for inst in cluster.instances]
    if stream is not None:
        stream.rebind(remote)
    else:  # NOTE: each instance's steps arrive as the run's own (`first_step` skipped there)
        record.first_step = [0] * len(remote)
    workers = len(conns)
    progress = [loop.start] * workers  # each worker's busy instances' earliest clock
    left = set(range(workers))
    passed_on = False
    shared: np.ndarray | None = None  # a detailed run's token ids, as the workload's
    while left:
        if noted.seen and not passed_on:
            passed_on = True
            for w in left:
                _signal(procs[w], signal.SIGINT)
        if stream is not None and stream.held() > HOLD_STEPS:
            late = min(left, key=progress.__getitem__)  # NOTE: the others wait on their pipes
            got = wait(noted.watched([conns[late]]), POLL_S)
            ready = [late] if conns[late] in got else []
        else:
            got = wait(noted.watched([conns[w] for w in left]), POLL_S)
            ready = [w for w in left if conns[w] in got]
        for w in ready:
            try:
                msg = conns[w].recv()
            except EOFError:
                raise RuntimeError(
                    f"simulation worker {w} (pid {procs[w].pid}) ended without handing over "
                    f"its results ({_status(procs[w])})") from None
            kind = msg[0]
            if kind == "steps":  # streaming: records, clocks, stats filed
                _, batch, now, ended, chunk = msg
                for index, steps, clock in batch:
                    remote[index].handed(unpack_steps(steps), clock)
                progress[w] = now
                assert stats is not None and stream is not None
                stats.file_chunk(chunk)
                stream.take()
            elif kind == "progress":
                ended = msg[1]
            elif kind == "requests":  # detailed: requests that ended
                if shared is None:
                    shared = token_ints(cluster.instances[0].engine.model_spec.vocab_size)
                workload = loop.workload
                record.routed.update((k, unpack_request(r, shared, workload[k].prompt_token_ids))
                                     for k, r in msg[1])
                ended = 0
            elif kind == "instance_steps":  # detailed: an instance's steps
                remote[msg[1]].step_stats = unpack_steps(msg[2])
                ended = 0
            elif kind == "final":
                for index, counters, summary, clock in msg[1]:
                    remote[index].ended(counters, summary, clock)
                ended = msg[2]
                left.discard(w)
                if stream is not None:
                    stream.take()
            else:  # "error"
                raise msg[1]
            if ended:
                bar.update(ended)
    for r in remote:
        r.settle()
    cluster.instances = cast("list[Instance]", remote)
    cluster.entry = cluster.instances


def _signal(proc: BaseProcess, sig: int) -> None:
    if proc.pid is not None and proc.exitcode is None:
        try:
            os.kill(proc.pid, sig)
        except ProcessLookupError:
            pass


def _reap(proc: BaseProcess) -> None:
    """Wait for a worker, killing it if it has not ended (the run failed)."""
    proc.join(REAP_S)
    if proc.exitcode is None:
        proc.kill()
        proc.join()


def _status(proc: BaseProcess) -> str:
    proc.join(REAP_S)
    code = proc.exitcode
    if code is None:
        return "it has not exited"
    if code < 0:
        return f"killed by signal {-code}"
    return f"exit status {code}"
