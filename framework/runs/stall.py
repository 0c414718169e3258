"""A watch over a run whose plugin does not return: a scheduler, queue, KV allocator, prefix
cache or router that loops or waits forever would hold the run without a word. A thread looks
at the run every so often; when no instance has stepped for `STALL_WARNING_S` seconds and the
run's thread stands in a plugin's code, it prints one line naming the plugin, the method the
framework called and the line it stands at (once each time the run stalls). When the same call
has not returned after the run's plugin timeout (`PLUGIN_TIMEOUT_S`; `driver.plugin_timeout_s`),
the run is stopped with a `PluginRuntimeError` naming it, as a plugin that raised would be
(vLLM's engine fails an iteration that takes over `VLLM_ENGINE_ITERATION_TIMEOUT_S`); with no
timeout it waits, and Ctrl-C stops it and keeps what ran. An executor's long step (a big model
on a CPU) and an idle wait for the next arrival are not plugin code, so they are never named.

NOTE: the stop is an exception set for the run's thread (`PyThreadState_SetAsyncExc`, the C
API's documented way), raised at its next bytecode: it ends a plugin that loops in Python; one
blocked inside a C call (a sleep, a lock) is named but ends only when that call returns."""

from __future__ import annotations

import ctypes
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import CodeType
from typing import TYPE_CHECKING, Any, NamedTuple

from schedlab.faults import PluginRuntimeError, PluginSlot, plugin_at

if TYPE_CHECKING:
    from schedlab.cluster.cluster import Cluster
    from schedlab.engine import Engine

#: seconds without a step before a plugin the run's thread stands in is named (vLLM's
#: `VLLM_ENGINE_ITERATION_TIMEOUT_S` is 60 s too)
STALL_WARNING_S = 60.0

#: seconds one plugin call may run before the run is stopped with an error naming it (the
#: default of `run_workload`'s `plugin_timeout_s` and of `driver.plugin_timeout_s`)
PLUGIN_TIMEOUT_S = 300.0


class PluginTimeout(BaseException):
    """Raised in a run's thread by its watch when a plugin call outlived the plugin timeout;
    `stall_watch` turns it into the `PluginRuntimeError`. A BaseException, as
    KeyboardInterrupt is, so that a plugin's own `except Exception` does not swallow it."""


class _Stop:
    """Why the watch stopped a plugin call: the sentence naming it (None: it has not)."""

    def __init__(self) -> None:
        self.message: str | None = None


class _Words(NamedTuple):
    """How a watch's lines end, for a run or a server."""

    #: no timeout: what happens while the call does not return
    waits: str
    #: with a timeout, after "at N s": what happens then
    stops: str
    #: the stop sentence's end
    stopped: str
    #: after the warning's last clause
    tail: str


_RUN = _Words("the run waits for it", "the run is stopped", "the run was stopped",
              " (Ctrl-C stops it and keeps what ran)")
_SERVER = _Words("the server waits for it", "the requests in flight fail",
                 "the requests in flight failed", "")


@contextmanager
def stall_watch(cluster: Cluster, seconds: float | None = None,
                timeout: float | None = None) -> Iterator[None]:
    """Watch `cluster`'s run in the calling thread while the block runs (see the module
    docstring); `seconds`: `STALL_WARNING_S` when None; `timeout`: the seconds after which a
    plugin call that has not returned stops the run (None: the run waits for it).

    Raises:
        PluginRuntimeError: a plugin call outlived `timeout`; one sentence naming it.
    """
    from schedlab.cluster.loop import RunLoop

    # NOTE: a cluster that ran split holds stand-ins for its engines (no plugins, no steps)
    engines = [inst.engine for inst in cluster.instances]
    slots: list[PluginSlot] = []
    for e in engines:
        slots += getattr(e, "plugin_slots", [])
    for router in (cluster.router, cluster.decode_router):
        if router is not None:
            slots.append(PluginSlot("router", router, cluster.router_label))
    with _watching(engines, slots, RunLoop.run.__code__, seconds, timeout, _RUN) as stopped:
        try:
            yield
        except PluginTimeout:
            raise PluginRuntimeError(stopped.message or "a plugin call outlived the run's "
                                     "plugin timeout") from None


@contextmanager
def engine_watch(engine: Engine, below: CodeType, timeout: float | None,
                 seconds: float | None = None) -> Iterator[_Stop]:
    """The watch of a server's engine thread (the calling thread, inside calls of `below`):
    as `stall_watch`, but a call past `timeout` raises `PluginTimeout` in the thread for it to
    catch (the server goes on); the stop sentence is then the yielded object's `message`."""
    with _watching([engine], engine.plugin_slots, below, seconds, timeout, _SERVER) as stopped:
        yield stopped


@contextmanager
def _watching(engines: list, slots: list[PluginSlot], below: CodeType, seconds: float | None,
              timeout: float | None, words: _Words) -> Iterator[_Stop]:
    limit = STALL_WARNING_S if seconds is None else seconds
    stop = threading.Event()
    stopped = _Stop()
    args = (engines, slots, below, limit, timeout, words, stop, threading.get_ident(), stopped)
    thread = threading.Thread(target=_watch, args=args, name="schedlab-stall-watch",
                              daemon=True)
    thread.start()
    try:
        yield stopped
    finally:
        stop.set()
        thread.join()


def _watch(*args: Any) -> None:
    try:
        _look(*args)
    except Exception:  # noqa: BLE001 - a watch never disturbs the run it watches
        return


def _look(engines: list, slots: list[PluginSlot], below: CodeType, limit: float,
          timeout: float | None, words: _Words, stop: threading.Event, watched: int,
          stopped: _Stop) -> None:
    """Poll the engines' step counts; while they stand still, the watched thread's frame: a
    plugin call seen in the same frame poll after poll is timed from the first poll that saw
    it (an idle wait before it is not counted)."""
    first = limit if timeout is None else min(limit, timeout)
    last: tuple[int, ...] | None = None
    call: object = None  # the frame of the plugin call being timed
    since, warned = 0.0, False
    while not stop.wait(min(first / 4, 1.0)):
        steps = tuple(getattr(e, "num_steps", 0) for e in engines)
        if steps != last:
            last, call = steps, None
            continue
        frame = sys._current_frames().get(watched)
        found = plugin_at(frame, slots, below) if frame is not None else None
        now = time.monotonic()
        if found is None:
            call = None
            continue
        slot, method, where, outer = found
        if outer is not call:
            call, since, warned = outer, now, False
            continue
        waited = now - since
        if timeout is not None and waited >= timeout:
            stopped.message = (f"{slot.kind} {slot.name} did not return from {method}() in "
                               f"{waited:.3g} s ({where}); {words.stopped} "
                               f"(driver.plugin_timeout_s={timeout:g}; null waits)")
            _raise_in(watched)
            call = None
            continue
        if warned or waited < limit:
            continue
        then = (words.waits if timeout is None else
                f"{words.stops} at {timeout:g} s (driver.plugin_timeout_s)")
        print(f"schedlab: warning: {slot.kind} {slot.name} has not returned from "
              f"{method}() in {waited:.3g} s ({where}); {then}{words.tail}", file=sys.stderr,
              flush=True)
        warned = True


def _raise_in(thread_id: int) -> None:
    """Raise `PluginTimeout` in thread `thread_id` at its next bytecode."""
    set_exc = ctypes.pythonapi.PyThreadState_SetAsyncExc
    n = set_exc(ctypes.c_ulong(thread_id), ctypes.py_object(PluginTimeout))
    if n > 1:  # NOTE: the C API's rule: more than one thread state hit, undo it
        set_exc(ctypes.c_ulong(thread_id), None)
