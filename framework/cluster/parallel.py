"""A simulated cluster's instances run in worker processes (`run_workload(..., workers=N)`,
`schedlab run driver.workers=N`): the same run, every number equal, in less wall time on a
machine with the cores.

A run splits when nothing couples its instances but the timeline: every instance simulates
(a virtual clock each), the router's choices depend on the requests' order alone
(`Router.static_routes`: round robin), the run streams (`save_detailed=False`: workers hand
over each request's stats, not the request), with no cap on the requests in flight (a seat
freed on one instance releases a request to another), no sessions (a turn's end releases the
next) and no prefill/decode split (requests move between instances). `split_refusal` says
which of these a run breaks.

Instance `i` goes to worker `i % N`. Each worker is forked from the run's process with the
cluster and the workload as built, and runs the one run loop (`schedlab.cluster.loop`) over
its instances and the releases routed to them; every `DRAIN_STEPS` of its steps it hands
the run's process its step records, its instances' clocks and its ended requests' stats.
The run's process merges the records into the run's step order with the run's own
`StepStream` (by time, ties by the lower instance: steps.csv, the cluster-wide series and
the engine metrics as one process makes them) and files the stats by workload position.

NOTE: an instance sees in a worker what it sees in one process. A request released at `t`
reaches its instance before the first of that instance's steps to start at or after `t` (one
process: once every busy instance has reached `t`, that one among them), an idle instance's
clock jumps to an arrival, and the request ids are the cluster's counter in routing order:
nothing an instance sees depends on the others.
"""

from __future__ import annotations

import gc
import os
import pickle
import signal
from array import array
from collections.abc import Sequence
from multiprocessing.connection import Connection, Pipe, wait
from typing import TYPE_CHECKING, cast

from schedlab.clock import VirtualClock
from schedlab.cluster.instance import Instance, InstanceSummary, Role
from schedlab.cluster.record import DRAIN_STEPS
from schedlab.cluster.router import InstanceLoad, Router
from schedlab.request import Request
from schedlab.runs.interrupt import sigint_deferred
from schedlab.runs.request_stats import FiledChunk, RequestStats
from schedlab.stats import EngineCounters, StepStats, StepTotals

if TYPE_CHECKING:
    from schedlab.cluster.loop import RunLoop

#: step records the run's process holds, taken and not yet handed on, above which it reads
#: only from the worker furthest behind (the others wait on their pipes): a bound on the
#: records held while one worker runs ahead of another
HOLD_STEPS = 16 * DRAIN_STEPS

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
    if not loop.stream:
        return ("it keeps every request (driver.save_detailed=true); a split run streams "
                "(driver.save_detailed=false): workers hand over each request's stats")
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
        base = next(cluster._ids)
        ids = range(base, base + len(routes))
    conns: list[Connection] = []
    pids: list[int] = []
    try:
        for w in range(workers):
            recv, send = Pipe(duplex=False)
            pid = os.fork()
            if pid == 0:  # pragma: no cover (the worker; its coverage is not collected)
                code = 1
                try:
                    recv.close()
                    for c in conns:
                        c.close()
                    code = _work(loop, w, workers, routes, ids, send)
                finally:
                    os._exit(code)
            send.close()
            conns.append(recv)
            pids.append(pid)
        _merge(loop, conns, pids, bar)
    finally:
        for pid in pids:
            _reap(pid)
        for c in conns:
            c.close()


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
        self.role: Role = inst.role
        self.engine = self  # NOTE: the parts of an engine the run's books read
        self.step_stats: list[StepStats] = []
        self.drained_kv_peak = 0
        self.in_flight: dict[str, Request] = {}
        self.pending: list[object] = []
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
        raise RuntimeError(f"instance {self.index} ran in a worker process; the cluster runs "
                           "nothing more after a split run")


# ---- the run's process -------------------------------------------------------------------
def _merge(loop: RunLoop, conns: list[Connection], pids: list[int], bar) -> None:
    """Take what the workers hand over until every one has ended (see `run_split`)."""
    cluster = loop.cluster
    record = cluster._record
    stream, stats = record.steps, record.stats
    assert stream is not None and stats is not None, "a split run streams"
    remote = [WorkerInstance(inst) for inst in cluster.instances]
    stream.rebind(remote)
    workers = len(conns)
    progress = [loop.start] * workers  # each worker's busy instances' earliest clock
    left = set(range(workers))
    interrupted = False
    while left:
        try:
            if stream.held() > HOLD_STEPS:  # NOTE: the others wait until this one catches up
                ready = [min(left, key=progress.__getitem__)]
            else:
                got = wait([conns[w] for w in left])
                ready = [w for w in left if conns[w] in got]
            with sigint_deferred():  # NOTE: a message is read and filed whole
                for w in ready:
                    try:
                        msg = conns[w].recv()
                    except EOFError:
                        raise RuntimeError(
                            f"simulation worker {w} (pid {pids[w]}) ended without handing over "
                            f"its results ({_status(pids[w])})") from None
                    if msg[0] == "error":
                        raise msg[1]
                    _, batch, now, ended, chunk, final = msg
                    for index, steps, clock in batch:
                        remote[index].handed(steps, clock)
                    progress[w] = now
                    stats.file_chunk(chunk)
                    if ended:
                        bar.update(ended)
                    if final is not None:
                        for index, counters, summary, clock in final:
                            remote[index].ended(counters, summary, clock)
                        left.discard(w)
                    stream.take()
        except KeyboardInterrupt:
            if interrupted:
                continue  # NOTE: once is enough: the workers are ending their runs
            interrupted = True
            for w in left:
                _signal(pids[w], signal.SIGINT)
    for r in remote:
        r.settle()
    cluster.instances = cast("list[Instance]", remote)
    cluster.entry = cluster.instances
    if interrupted:
        raise KeyboardInterrupt


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _reap(pid: int) -> None:
    """Wait for a worker, killing it if it has not ended (the run failed)."""
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == 0:
            _signal(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    except ChildProcessError:
        pass


def _status(pid: int) -> str:
    try:
        done, status = os.waitpid(pid, 0)
    except ChildProcessError:
        return "its exit status is unknown"
    if os.WIFSIGNALED(status):
        return f"killed by signal {os.WTERMSIG(status)}"
    return f"exit status {os.WEXITSTATUS(status)}"


# ---- a worker ------------------------------------------------------------------------------
def _work(loop: RunLoop, w: int, workers: int, routes: Sequence[int],
          ids: Sequence[int] | None, conn: Connection) -> int:  # pragma: no cover
    """Worker `w`'s run: the instances `i % workers == w` and the releases routed there.
    Returns the exit status."""
    try:
        os.setpgid(0, 0)  # NOTE: a Ctrl-C reaches the run's process alone, which passes it on
    except OSError:
        pass
    gc.freeze()  # NOTE: what was built before the fork is not the collector's to walk
    try:
        cluster = loop.cluster
        owned = [inst for inst in cluster.instances if inst.index % workers == w]
        mine = [p for p, j in enumerate(routes) if j % workers == w]
        loop.arrival_times = [loop.arrival_times[p] for p in mine]
        loop.arrival_index = array("q", [loop.arrival_index[p] for p in mine])
        cluster.router = _Pinned([routes[p] for p in mine], len(cluster.entry))
        if ids is not None:
            cluster._ids = iter([ids[p] for p in mine])
        record = cluster._record
        stats = _WorkerStats(record.start)
        record.stats = stats
        counted = _Counted()
        steps = _WorkerSteps(loop, owned, record.first_step, conn, stats, counted)
        record.steps = steps  # type: ignore[assignment]
        try:
            loop.run(counted)
        except KeyboardInterrupt:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            cluster.interrupt()  # NOTE: ends what is in flight, files it, takes the last steps
        else:
            cluster.result()  # NOTE: takes the last steps
        steps.send([(inst.index, inst.engine.counters(), inst.summary(), inst.now())
                    for inst in owned])
        return 0
    except BaseException as e:  # noqa: BLE001 (handed to the run's process, which raises it)
        try:
            conn.send(("error", _portable(e)))
        except BaseException:  # noqa: BLE001, S110 (the run's process reports the exit)
            pass
        return 1


def _portable(e: BaseException) -> BaseException:
    """`e` if it pickles (and unpickles), else a RuntimeError with its type and message."""
    try:
        back = pickle.loads(pickle.dumps(e))
    except Exception:  # noqa: BLE001
        back = None
    if isinstance(back, BaseException) and str(back) == str(e):
        return back
    return RuntimeError(f"{type(e).__name__}: {e}")


class _Pinned(Router):
    """A worker's router: the choices the cluster's router made up front, in order."""

    def __init__(self, routes: list[int], num_instances: int) -> None:
        super().__init__()
        self._routes = iter(routes)
        self.bind(num_instances)

    def select(self, request: Request, loads: Sequence[InstanceLoad]) -> int:
        return next(self._routes)


class _WorkerStats(RequestStats):
    """A worker's stats: what it files waits in `_rows` and `_pending` until `take` hands it
    over (nothing is stored in the arrays, which are empty)."""

    def __init__(self, start_time: float) -> None:
        super().__init__(0, start_time)

    def _store_rows(self) -> None:
        pass

    def _move_pending(self) -> None:
        pass

    def take(self) -> FiledChunk:
        """The requests filed since the last `take`, forgotten here. Changes state."""
        chunk = FiledChunk(self._rows, self._pending.tobytes(), self.errors,
                           list(self._client_codes), list(self._slo_class_codes))
        self._rows, self._pending, self.errors = [], array("d"), {}
        return chunk


class _Counted:
    """A worker's progress bar: the requests ended since the last hand-over."""

    def __init__(self) -> None:
        self.count = 0

    def update(self, n: int) -> None:
        self.count += n

    def take(self) -> int:
        n, self.count = self.count, 0
        return n


class _WorkerSteps:
    """A worker's `StepStream`: every `DRAIN_STEPS` of its steps (and at the end) it takes its
    instances' step records and hands them, with their clocks and the stats filed since, to
    the run's process."""

    def __init__(self, loop: RunLoop, owned: list[Instance], skip: Sequence[int],
                 conn: Connection, stats: _WorkerStats, counted: _Counted) -> None:
        self.loop = loop
        self.owned = owned
        self.conn = conn
        self.stats = stats
        self.counted = counted
        self.totals = StepTotals()  # NOTE: the run's process counts them
        self._skip = {inst.index: skip[inst.index] if skip else 0 for inst in owned}
        self._steps = 0

    def stepped(self) -> None:
        self._steps += 1
        if self._steps >= DRAIN_STEPS:
            self.take()

    def take(self, final: bool = False) -> None:
        del final  # NOTE: the last records go with `send`'s message
        self.send(None)

    def send(self, final: list | None) -> None:
        """Hand over the records, the clocks and the stats; `final`: each instance's counters,
        summary and clock once the run ended. Changes state."""
        with sigint_deferred():
            self._steps = 0
            batch = []
            for inst in self.owned:
                got = inst.engine.drain_step_stats()
                if got:
                    inst.drained_kv_peak = max(inst.drained_kv_peak,
                                               max(s.kv_used_blocks for s in got))
                    skip = self._skip[inst.index]
                    if skip:
                        del got[:skip]
                        self._skip[inst.index] = 0
                batch.append((inst.index, got, inst.now()))
            busy = [inst.now() for inst in self.owned if inst.is_busy()]
            now = min(busy) if busy else self.loop.next_release()
            self.conn.send(("steps", batch, now, self.counted.take(), self.stats.take(),
                            final))
