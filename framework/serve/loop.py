"""The engine's one background thread: requests in through a thread-safe queue, text out per step.

The engine is not thread-safe, so a single thread owns it: HTTP handlers (on the asyncio event
loop) hand in `GenerateRequest`s and aborts through `EngineLoop`'s inbox, and each step's new
tokens go back to each handler's `RequestStream` (an asyncio queue fed with
`call_soon_threadsafe`; the messages are in `schedlab.serve.events`). Nothing is dropped:
every submitted request gets exactly one final event (finished, aborted, rejected with its
reason, or refused while overloaded/draining).

On a virtual clock (`executor=sim`) the loop runs in real time (`build_engine`, a
`schedlab.clock.PacedClock`).
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from schedlab.clock import PacedClock, VirtualClock
from schedlab.config import EngineConfig
from schedlab.engine import Engine
from schedlab.request import Request, RequestFailure, RequestStatus
from schedlab.runs.stall import PLUGIN_TIMEOUT_S, PluginTimeout, engine_watch
from schedlab.serve.events import FinishedRequest, GenerateRequest, RequestStream, StreamEvent
from schedlab.serve.text import TextStream
from schedlab.stats import EngineCounters

log = logging.getLogger("schedlab.serve")

#: how long the idle loop blocks on its inbox before checking whether it should stop (s)
_IDLE_WAIT_S = 0.05


def build_engine(config: EngineConfig) -> Engine:
    """An engine for serving: as `Engine(config)`, but an executor on a virtual clock runs on a
    `PacedClock` (real-time pacing of the simulated step times)."""
    engine = Engine(config)
    if isinstance(engine.clock, VirtualClock):
        engine.set_clock(PacedClock())
    return engine


@dataclass(slots=True)
class _Active:
    request: Request
    stream: RequestStream
    text: TextStream
    num_sent_tokens: int = 0


class EngineLoop:
    """Owns the engine on a background thread.

    Args:
        engine: a built engine; nothing else may touch it once `start` is called.
        tokenizer: decodes output text (None: tokens become `<id>`).
        max_waiting: refuse new requests (HTTP 503) while this many wait in the engine's queue;
            None: no limit.
        on_finished: called on the engine thread with each finished request (metrics).
        plugin_timeout_s: a plugin call that has not returned after this many seconds is
            stopped and the requests in flight fail naming it (`schedlab.runs.stall`); None:
            the loop waits for it.
    """

    def __init__(self, engine: Engine, tokenizer=None, max_waiting: int | None = None,
                 on_finished: Callable[[FinishedRequest], None] | None = None,
                 plugin_timeout_s: float | None = PLUGIN_TIMEOUT_S) -> None:
        if max_waiting is not None and max_waiting < 0:
            raise ValueError(f"max_waiting={max_waiting} must be >= 0 or None")
        self.engine = engine
        self.tokenizer = tokenizer
        self.max_waiting = max_waiting
        self._on_finished = on_finished
        self.plugin_timeout_s = plugin_timeout_s
        self._inbox: queue.SimpleQueue[tuple] = queue.SimpleQueue()
        self._active: dict[str, _Active] = {}
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._draining = False
        self._paced = engine.clock if isinstance(engine.clock, PacedClock) else None
        #: the engine's counters after the last step (read by /metrics on another thread)
        self.counters: EngineCounters = engine.counters()
        # NOTE: each written by one thread only (submit: the event loop; done: the engine)
        self._num_submitted = 0
        self._num_done = 0
        #: the requests of the last step that ran (who a failing step is blamed on last)
        self._stepped_ok: set[str] = set()

    # ---- called from other threads -------------------------------------------------------
    def start(self) -> None:
        """Start the engine thread. Changes state."""
        self._thread = threading.Thread(target=self._run, name="schedlab-engine", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Abort what is in flight and stop the thread. Changes state."""
        self.abort_all()
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def submit(self, request: GenerateRequest) -> RequestStream:
        """Hand a request in; call from the asyncio loop that will read its events."""
        stream = RequestStream(request.request_id, asyncio.get_running_loop())
        self._num_submitted += 1  # counted at once: a drain never misses one in the inbox
        self._inbox.put(("submit", request, stream))
        return stream

    def abort(self, request_id: str) -> None:
        """Abort a request (a client went away); unknown or finished ids are ignored."""
        self._inbox.put(("abort", request_id))

    def abort_all(self) -> None:
        """Abort every request in flight (a drain that ran out of time)."""
        self._inbox.put(("abort_all",))

    def start_draining(self) -> None:
        """Refuse new requests from now on (HTTP 503); in-flight ones go on. Changes state."""
        self._draining = True

    @property
    def num_active(self) -> int:
        """Requests submitted whose final event has not been sent yet (any thread)."""
        return self._num_submitted - self._num_done

    @property
    def draining(self) -> bool:
        return self._draining

    def call(self, fn: Callable[[Engine], Any]) -> Future:
        """Run `fn(engine)` on the engine thread between steps (e.g. `check_integrity`)."""
        fut: Future = Future()
        self._inbox.put(("call", fn, fut))
        return fut

    # ---- the engine thread ---------------------------------------------------------------
    def _run(self) -> None:
        engine = self.engine
        # NOTE: a plugin call past the timeout is stopped in this thread (`engine_watch`):
        # the requests in flight fail with the sentence naming it, and the server goes on
        with engine_watch(engine, self._run.__code__, self.plugin_timeout_s) as stopped:
            while not self._stop.is_set():
                try:
                    self._turn()
                except PluginTimeout:
                    why = stopped.message or "a plugin call outlived the plugin timeout"
                    log.error("%s", why)
                    self._fail(list(self._active.values()), f"the engine failed: {why}")

    def _turn(self) -> None:
        """One turn of the engine thread: take the inbox, then step once if there is work."""
        engine = self.engine
        self._take_inbox(block=not engine.has_unfinished())
        if not engine.has_unfinished():
            return
        if self._paced is not None:
            self._paced.catch_up()
        try:
            engine.step()
        except RequestFailure as e:  # NOTE: the step changed nothing; the others go on
            log.warning("failing %d requests: %s", len(e.reasons), e)
            self._fail([a for rid, a in self._active.items() if rid in e.reasons],
                       {rid: f"the request failed: {why}" for rid, why in e.reasons.items()})
            return
        except Exception:  # noqa: BLE001 - a bug must not kill the server silently
            # NOTE: first blamed on the requests new to this step (the others stepped
            # fine before); if it fails again without them, on the rest of the step
            plan = engine.last_plan
            planned = {r.request_id for r in plan.requests()} if plan else set()
            hit = [a for rid, a in self._active.items()
                   if rid in planned and rid not in self._stepped_ok] or [
                a for rid, a in self._active.items() if rid in planned]
            log.exception("engine step failed; failing %d of its requests",
                          len(hit) or len(self._active))
            self._fail(hit or list(self._active.values()),
                       "the engine failed during a step; see the server log")
            return
        plan = engine.last_plan
        self._stepped_ok = {r.request_id for r in plan.requests()} if plan else set()
        self._dispatch()
        engine.drain_step_stats()  # NOTE: counters carry what the server reports
        self.counters = engine.counters()

    def _take_inbox(self, block: bool) -> None:
        try:
            item = self._inbox.get(timeout=_IDLE_WAIT_S) if block else self._inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            self._handle(item)
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                break
        self.counters = self.engine.counters()

    def _handle(self, item: tuple) -> None:
        kind = item[0]
        if kind == "submit":
            self._submit(item[1], item[2])
        elif kind == "abort":
            a = self._active.get(item[1])
            if a is not None:
                self._end(a, "abort")
        elif kind == "abort_all":
            for a in list(self._active.values()):
                self._end(a, "abort")
        elif kind == "call":
            fn, fut = item[1], item[2]
            try:
                fut.set_result(fn(self.engine))
            except BaseException as e:  # noqa: BLE001 - handed back to the caller
                fut.set_exception(e)

    def _submit(self, g: GenerateRequest, stream: RequestStream) -> None:
        engine = self.engine
        refusal = None
        if self._draining:
            refusal = "the server is shutting down and takes no new requests"
        elif self.max_waiting is not None and (
                waiting := engine.counters().num_waiting) >= self.max_waiting:
            refusal = (f"the server is overloaded: {waiting} requests are waiting "
                       f"(max_waiting={self.max_waiting}); retry later")
        if refusal is not None:
            self._num_done += 1
            stream.put(StreamEvent(error=refusal, status=503))
            return
        if self._paced is not None:
            self._paced.catch_up()
        try:
            req = engine.add_request(g.prompt_token_ids, g.sampling_params,
                                     request_id=g.request_id, priority=g.priority,
                                     client_id=g.client_id, deadline_ms=g.deadline_ms,
                                     slo_class=g.slo_class,
                                     expected_output_len=g.expected_output_len)
        except Exception:  # noqa: BLE001 - a plugin bug fails this request, not the server
            log.exception("adding request %s failed", g.request_id)
            self._drop(g.request_id)
            self._num_done += 1
            stream.put(StreamEvent(error="the engine failed to take the request; see the "
                                   "server log", status=500))
            return
        if req.reject_reason is not None:
            engine.forget(req.request_id)
            self._num_done += 1
            stream.put(StreamEvent(error=req.reject_reason, status=400,
                                   num_prompt_tokens=req.num_prompt_tokens))
            return
        self._active[req.request_id] = _Active(req, stream, TextStream(self.tokenizer, g.stop))
        stream.put(StreamEvent(num_prompt_tokens=req.num_prompt_tokens))

    def _dispatch(self) -> None:
        """After a step: send each active request's new text; end those that finished."""
        for a in list(self._active.values()):
            req = a.request
            n = req.num_output_tokens
            if n == a.num_sent_tokens and not req.is_finished:
                continue
            new = req.output_token_ids[a.num_sent_tokens:n]
            a.num_sent_tokens = n
            delta = a.text.add(new, final=req.is_finished)
            if req.status is RequestStatus.REJECTED:
                if new:  # NOTE: what it produced before it was dropped, then the reason
                    a.stream.put(StreamEvent(delta.text, req.num_prompt_tokens, n,
                                             token_ids=list(new)))
                self._reject(a)
            elif delta.stopped:
                self._end(a, "stop", delta.text, new)
            elif req.is_finished:
                reason = req.finish_reason if req.finish_reason in ("stop", "length") else "abort"
                self._end(a, reason, delta.text, new)
            else:  # NOTE: one event per token, even with no text yet: clients time tokens
                a.stream.put(StreamEvent(delta.text, req.num_prompt_tokens, n,
                                         token_ids=list(new)))

    def _end(self, a: _Active, reason: str, text: str = "",
             token_ids: list[int] | None = None) -> None:
        req = a.request
        del self._active[req.request_id]
        self._drop(req.request_id)  # NOTE: a server must not keep them all
        a.stream.put(StreamEvent(text, req.num_prompt_tokens, a.num_sent_tokens, reason,
                                 token_ids=list(token_ids or ())))
        if self._on_finished is not None:
            try:
                self._on_finished(FinishedRequest(req, reason, a.num_sent_tokens))
            except Exception:  # noqa: BLE001 - metrics must not break serving
                log.exception("recording a finished request failed")
        self._num_done += 1  # last: once num_active drops, the metrics have it

    def _reject(self, a: _Active) -> None:
        """End a request the engine rejected after accepting it (a policy dropped it, e.g.
        EDF's `on_miss: drop`) with its reason and status 400, as a rejection on arrival:
        an error response, or an error event on a stream that had begun."""
        req = a.request
        del self._active[req.request_id]
        self.engine.forget(req.request_id)
        self._num_done += 1
        a.stream.put(StreamEvent(error=req.reject_reason or "the engine rejected it", status=400,
                                 num_prompt_tokens=req.num_prompt_tokens,
                                 num_output_tokens=a.num_sent_tokens))

    def _drop(self, request_id: str) -> None:
        """Abort (if unfinished) and forget a request; a plugin that raises on the way is
        logged, not let out: the loop and the other requests go on."""
        engine = self.engine
        try:
            req = engine.requests.get(request_id)
            if req is not None:
                if not req.is_finished:
                    engine.abort(request_id)
                engine.forget(request_id)
        except Exception:  # noqa: BLE001
            log.exception("aborting request %s failed", request_id)

    def _fail(self, actives: list[_Active], message: str | dict[str, str]) -> None:
        """End these requests with an error event (the others go on); the gauges follow."""
        for a in actives:
            rid = a.request.request_id
            self._drop(rid)
            del self._active[rid]
            self._num_done += 1
            why = message if isinstance(message, str) else message[rid]
            a.stream.put(StreamEvent(error=why, status=500, finish_reason="abort",
                                     num_prompt_tokens=a.request.num_prompt_tokens,
                                     num_output_tokens=a.num_sent_tokens))
        self.counters = self.engine.counters()
