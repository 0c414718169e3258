"""Running the app: uvicorn, with SIGINT / SIGTERM draining the server before it exits.

A first signal stops new requests (HTTP 503), lets in-flight ones finish for up to
`drain_timeout` seconds, aborts what is left, then shuts uvicorn down; the process exits 0. A
second signal ends the process at once by that signal (a shell shows 128 + its number),
dropping what is in flight.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass

import uvicorn

from schedlab import __version__
from schedlab.config import EngineConfig
from schedlab.runs.stall import PLUGIN_TIMEOUT_S
from schedlab.serve.app import ServeState, build_app
from schedlab.serve.loop import EngineLoop, build_engine
from schedlab.serve.prepare import ModelInfo
from schedlab.serve.prom import ServerMetrics
from schedlab.tokenizer import has_tokenizer, load_tokenizer

log = logging.getLogger("schedlab.serve")

#: how long aborted requests get to send their last event before uvicorn shuts down (s)
_ABORT_GRACE_S = 5.0


@dataclass(frozen=True, slots=True)
class ServerOptions:
    """How to serve (the command line's `--host`, `--port`, ...).

    Args:
        host: the address to bind (127.0.0.1: this machine only).
        port: the TCP port; 0 picks a free one (see `Server.port`).
        model_names: the names clients may send as `model` (answers carry the first);
            empty: the tokenizer's directory (clients load the tokenizer from it, as vLLM's
            model path), else the engine's model.
        max_waiting: answer 503 while this many requests wait in the engine's queue (None: no
            limit).
        drain_timeout: seconds in-flight requests get to finish after SIGINT / SIGTERM.
        log_level: uvicorn's log level.
        max_request_bytes: the largest request body taken (413 beyond); None:
            `default_max_request_bytes` of the engine.
        api_key: required as `Authorization: Bearer <key>` on every path but /health,
            /metrics and /version; None: no key.
        plugin_timeout_s: a plugin call running longer fails the requests in flight, naming
            it (`driver.plugin_timeout_s`); None: wait.
    """

    host: str = "127.0.0.1"
    port: int = 8000
    model_names: tuple[str, ...] = ()
    max_waiting: int | None = None
    drain_timeout: float = 30.0
    log_level: str = "info"
    max_request_bytes: int | None = None
    api_key: str | None = None
    plugin_timeout_s: float | None = PLUGIN_TIMEOUT_S


#: hosts that only this machine reaches
LOOPBACK = ("127.0.0.1", "localhost", "::1")


def default_max_request_bytes(max_model_len: int, vocab_size: int) -> int:
    """Room for the longest prompt the engine takes, written as generously as a client may
    (token ids of the vocabulary's widest, or text at 16 bytes a token), and 1 MiB at least."""
    per_token = max(16, len(str(vocab_size - 1)) + 2)
    return max(1 << 20, 4 * max_model_len * per_token)


class _Uvicorn(uvicorn.Server):
    """uvicorn, with the first signal turned into a drain instead of an immediate shutdown."""

    def __init__(self, config: uvicorn.Config, owner: Server) -> None:
        super().__init__(config)
        self.owner = owner
        self.aloop: asyncio.AbstractEventLoop | None = None

    async def startup(self, sockets=None) -> None:
        self.aloop = asyncio.get_running_loop()
        await super().startup(sockets)

    def handle_exit(self, sig: int, frame) -> None:  # noqa: ARG002 - uvicorn's signature
        # NOTE: nothing is appended to _captured_signals, so uvicorn does not re-raise the
        # signal after shutting down and the process exits 0.
        if self.owner.drain_started:
            n = self.owner.loop.num_active
            print(f"schedlab serve: second signal: exiting now, {n} requests in flight "
                  "dropped", file=sys.stderr, flush=True)
            sys.stdout.flush()
            signal.signal(sig, signal.SIG_DFL)  # NOTE: ended by the signal itself, at once
            os.kill(os.getpid(), sig)
            return
        self.owner.drain()


class Server:
    """An engine, its loop, the app and uvicorn, ready to `run()`.

    Args:
        config: the engine config (built here; `executor=sim` runs paced in real time).
        options: host, port, limits.
    """

    def __init__(self, config: EngineConfig, options: ServerOptions) -> None:
        self.options = options
        self.engine = engine = build_engine(config)
        path = getattr(engine.executor, "tokenizer_path", None) or config.model
        self.tokenizer = load_tokenizer(path)
        names = options.model_names or (path if has_tokenizer(path) else config.model,)
        self.model_names: tuple[str, ...] = tuple(names)
        vocab = engine.model_spec.vocab_size
        self.max_request_bytes = options.max_request_bytes or default_max_request_bytes(
            engine.max_model_len, vocab)
        self.metrics = ServerMetrics(self.model_names[0])
        self.loop = EngineLoop(engine, self.tokenizer, options.max_waiting,
                               on_finished=self.metrics.observe,
                               plugin_timeout_s=options.plugin_timeout_s)
        self.metrics.watch(self.loop)
        info = ModelInfo(self.model_names, engine.max_model_len, vocab, self.tokenizer)
        self.app = build_app(ServeState(self.loop, info, self.metrics, self.max_request_bytes,
                                        options.api_key, __version__))
        if options.host not in LOOPBACK and options.api_key is None:
            log.warning("serving on %s without an API key: anyone who reaches this address can "
                        "use the model (set --api-key or SCHEDLAB_API_KEY)", options.host)
        uv = uvicorn.Config(self.app, host=options.host, port=options.port,
                            log_level=options.log_level, timeout_graceful_shutdown=10,
                            lifespan="off")
        self.uvicorn = _Uvicorn(uv, self)
        self.drain_started = False
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        """The bound port (once started)."""
        for server in self.uvicorn.servers:
            for sock in server.sockets:
                return sock.getsockname()[1]
        return self.options.port

    @property
    def base_url(self) -> str:
        return f"http://{self.options.host}:{self.port}"

    def run(self) -> None:
        """Serve until drained (a signal, or `drain()`); blocks. Changes state."""
        self.loop.start()
        try:
            self.uvicorn.run()
        finally:
            self.loop.stop()

    def drain(self) -> None:
        """Stop taking requests, let in-flight ones finish (up to `drain_timeout`), abort the
        rest, shut down. Returns at once; safe from a signal handler or another thread."""
        if self.drain_started:
            return
        self.drain_started = True
        self.loop.start_draining()
        aloop = self.uvicorn.aloop
        if aloop is None:
            self.uvicorn.should_exit = True
            return
        aloop.call_soon_threadsafe(lambda: aloop.create_task(self._drain()))

    async def _drain(self) -> None:
        loop = self.loop
        n = loop.num_active
        log.info("draining: %d requests in flight, up to %.0f s", n, self.options.drain_timeout)
        deadline = time.monotonic() + self.options.drain_timeout
        while loop.num_active and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if loop.num_active:
            log.warning("drain timeout: aborting %d requests", loop.num_active)
            loop.abort_all()
            deadline = time.monotonic() + _ABORT_GRACE_S
            while loop.num_active and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
        self.uvicorn.should_exit = True

    # ---- in a background thread (tests, notebooks) ---------------------------------------
    def start_in_thread(self, timeout: float = 30.0) -> Server:
        """Run in a daemon thread and wait until it accepts connections."""
        self._thread = threading.Thread(target=self.run, name="schedlab-serve", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self.uvicorn.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the server did not start")
            time.sleep(0.01)
        return self

    def stop(self, timeout: float = 30.0) -> None:
        """Drain and wait for the background thread to end."""
        self.drain()
        if self._thread is not None:
            self._thread.join(timeout)

    def __enter__(self) -> Server:
        return self.start_in_thread()

    def __exit__(self, *exc) -> None:
        self.stop()
