"""A split run's worker process (`schedlab.cluster.parallel`): the run loop over its share
of the instances, and what it hands the run's process as it goes."""

from __future__ import annotations

import gc
import os
import pickle
import signal
from array import array
from collections.abc import Sequence
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING

from schedlab.cluster.instance import Instance
from schedlab.cluster.record import DRAIN_STEPS, drain_records
from schedlab.cluster.router import InstanceLoad, Router
from schedlab.cluster.split_pack import pack_request, pack_steps
from schedlab.request import Request
from schedlab.runs.interrupt import sigint_deferred
from schedlab.runs.request_stats import FiledChunk, RequestStats
from schedlab.stats import StepTotals

if TYPE_CHECKING:
    from schedlab.cluster.loop import RunLoop

#: a detailed run's requests per message from a worker (the pickle of one message is held
#: whole on both sides)
HAND_REQUESTS = 2048
#: a detailed run's worker tells the run's process every this many ended requests (the bar)
PROGRESS_REQUESTS = 256


class Noted:
    """A Ctrl-C noted, not raised (`handle` is the SIGINT handler): the run loop's interrupt
    latch in a worker (`RunLoop.interrupt`: `check` raises at the loop's next event)."""

    def __init__(self) -> None:
        self.hit = False
        #: whether one came at all (`hit` is reset by `check`)
        self.seen = False
        #: the run's process: the read end of its signal wake-up pipe (-1: none)
        self.wakeup = -1

    def handle(self, signum: int, frame: object) -> None:  # noqa: ARG002
        self.hit = self.seen = True

    def watched(self, conns: list[Connection]) -> list:
        """`conns` and the wake-up pipe, for `wait` (emptied first). No state change but the
        pipe's."""
        if self.wakeup < 0:
            return list(conns)
        try:
            while os.read(self.wakeup, 4096):
                pass
        except BlockingIOError:
            pass
        return [*conns, self.wakeup]

    def check(self) -> None:
        if self.hit:
            self.hit = False
            raise KeyboardInterrupt


def worker_main(loop: RunLoop, w: int, workers: int, routes: Sequence[int],
                ids: Sequence[int] | None, conn: Connection, noted: Noted,
                inherited: list[Connection]) -> None:  # pragma: no cover
    """A worker process's target: the other workers' pipes closed, then `_work`."""
    for c in inherited:
        c.close()
    code = _work(loop, w, workers, routes, ids, conn, noted)
    if code:
        raise SystemExit(code)


def _work(loop: RunLoop, w: int, workers: int, routes: Sequence[int],
          ids: Sequence[int] | None, conn: Connection,
          noted: Noted) -> int:  # pragma: no cover
    """Worker `w`'s run: the instances `i % workers == w` and the releases routed there; a
    Ctrl-C passed on (`noted`) ends it at the loop's next event. Returns the exit status."""
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
            cluster.use_ids([ids[p] for p in mine])
        noted.hit = noted.seen = False
        if noted.wakeup >= 0:  # NOTE: the run's process's pipe: its signals only
            signal.set_wakeup_fd(-1)
        loop.interrupt = noted  # type: ignore[assignment]
        record = cluster.run_record
        counted = _Counted(conn, record.steps is None)
        steps = sink = None
        if record.steps is not None:  # streaming: hand over as the run goes
            stats = _WorkerStats(record.start)
            record.stats = stats
            steps = _WorkerSteps(loop, owned, record.first_step, conn, stats, counted)
            record.steps = steps  # type: ignore[assignment]
        else:  # NOTE: detailed: each request handed over once it ended, as streaming files it
            sink = _RequestSink(conn)
            record.stats = sink  # type: ignore[assignment]
            loop.stream = True
        try:
            loop.run(counted)
        except KeyboardInterrupt:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            cluster.interrupt()  # NOTE: ends what is in flight (streaming: files it)
        else:
            if steps is not None:
                steps.take()  # NOTE: the last records
        if sink is not None:  # detailed: the last requests, then each instance's steps
            for k in sorted(record.routed):  # NOTE: what is left after a Ctrl-C
                sink.add(k, record.routed.pop(k))
            sink.flush()
            for inst in owned:
                skip = record.first_step[inst.index] if record.first_step else 0
                conn.send(("instance_steps", inst.index,
                           pack_steps(inst.engine.step_stats[skip:])))
        conn.send(("final", [(inst.index, inst.engine.counters(), inst.summary(), inst.now())
                             for inst in owned], counted.take()))
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


class _RequestSink:
    """A detailed run's worker: its requests, each packed once it ended for good (where a
    streaming run files its stats, `RunRecord.retire`) and handed over `HAND_REQUESTS` at a
    time, so that the run's process rebuilds them while the workers run."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self._packed: list[tuple[int, tuple]] = []

    def add(self, k: int, r: Request) -> None:
        self._packed.append((k, pack_request(r)))
        if len(self._packed) >= HAND_REQUESTS:
            self.flush()

    def flush(self) -> None:
        if self._packed:
            with sigint_deferred():
                self.conn.send(("requests", self._packed))
                self._packed = []


class _Counted:
    """A worker's progress bar: the requests ended since the last hand-over (`tell`: sent
    every `PROGRESS_REQUESTS` of them, where no step records carry the count)."""

    def __init__(self, conn: Connection, tell: bool) -> None:
        self.conn = conn
        self.tell = tell
        self.count = 0

    def update(self, n: int) -> None:
        self.count += n
        if self.tell and self.count >= PROGRESS_REQUESTS:
            with sigint_deferred():
                self.conn.send(("progress", self.take()))

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
        self._skip = list(skip) if skip else [0] * (max(i.index for i in owned) + 1)
        self._steps = 0

    def stepped(self) -> None:
        self._steps += 1
        if self._steps >= DRAIN_STEPS:
            self.take()

    def take(self, final: bool = False) -> None:
        """Hand over the records, the clocks and the stats filed since. Changes state."""
        del final  # NOTE: the run's process knows the end from the "final" message
        with sigint_deferred():
            self._steps = 0
            batch = []
            for inst in self.owned:
                got = drain_records(inst, self._skip, inst.index)
                batch.append((inst.index, pack_steps(got), inst.now()))
            busy = [inst.now() for inst in self.owned if inst.is_busy()]
            now = min(busy) if busy else self.loop.next_release()
            self.conn.send(("steps", batch, now, self.counted.take(), self.stats.take()))
