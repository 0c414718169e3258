"""A watch over a run whose plugin does not return: a scheduler, queue, KV allocator, prefix
cache or router that loops or waits forever would hold the run without a word. A thread looks
at the run every so often; when no instance has stepped for `STALL_WARNING_S` seconds and the
run's thread stands in a plugin's code, it prints one line naming the plugin, the method the
framework called and the line it stands at (once each time the run stalls). It never stops the
run: Ctrl-C does, and keeps what ran. An executor's long step (a big model on a CPU) and an
idle wait for the next arrival are not plugin code, so they are never named."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from schedlab.faults import PluginSlot, plugin_at

if TYPE_CHECKING:
    from schedlab.cluster.cluster import Cluster

#: seconds without a step before a plugin the run's thread stands in is named (vLLM's
#: `VLLM_ENGINE_ITERATION_TIMEOUT_S` is 60 s too)
STALL_WARNING_S = 60.0


@contextmanager
def stall_watch(cluster: Cluster, seconds: float | None = None) -> Iterator[None]:
    """Watch `cluster`'s run in the calling thread while the block runs (see the module
    docstring); `seconds`: `STALL_WARNING_S` when None."""
    limit = STALL_WARNING_S if seconds is None else seconds
    stop = threading.Event()
    watched = threading.get_ident()
    thread = threading.Thread(target=_watch, args=(cluster, limit, stop, watched),
                              name="schedlab-stall-watch", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def _watch(cluster: Cluster, limit: float, stop: threading.Event, watched: int) -> None:
    try:
        _look(cluster, limit, stop, watched)
    except Exception:  # noqa: BLE001 - a watch never disturbs the run it watches
        return


def _look(cluster: Cluster, limit: float, stop: threading.Event, watched: int) -> None:
    from schedlab.cluster.loop import RunLoop

    # NOTE: a cluster that ran split holds stand-ins for its engines (no plugins, no steps)
    engines = [inst.engine for inst in cluster.instances]
    slots: list[PluginSlot] = []
    for e in engines:
        slots += getattr(e, "plugin_slots", [])
    for router in (cluster.router, cluster.decode_router):
        if router is not None:
            slots.append(PluginSlot("router", router, cluster.router_label))
    last, since, warned = None, time.monotonic(), False
    while not stop.wait(min(limit / 4, 1.0)):
        steps = tuple(getattr(e, "num_steps", 0) for e in engines)
        now = time.monotonic()
        if steps != last:
            last, since, warned = steps, now, False
            continue
        if warned or now - since < limit:
            continue
        frame = sys._current_frames().get(watched)
        found = plugin_at(frame, slots, RunLoop.run.__code__) if frame is not None else None
        if found is not None:
            slot, method, where = found
            print(f"schedlab: warning: {slot.kind} {slot.name} has not returned from "
                  f"{method}() in {now - since:.3g} s ({where}); the run waits for it "
                  "(Ctrl-C stops it and keeps what ran)", file=sys.stderr, flush=True)
            warned = True
