"""A Ctrl-C a run never loses.

Python raises KeyboardInterrupt wherever the main thread happens to be when the signal is
handled; where that is a finalizer (an abandoned generator being closed, a `__del__`), the
exception is printed as "Exception ignored" and dropped, and the run would go on to the end.
`InterruptLatch` remembers the signal as well, and the run loop raises it again at its next
event (`InterruptLatch.check`).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType, TracebackType


class InterruptLatch:
    """Within `with InterruptLatch() as latch:`, SIGINT raises KeyboardInterrupt as usual
    and sets `latch.hit`; `check()` raises it again if it was swallowed. Installed only in the
    main thread over Python's default handler (a caller's own handler, or SIGINT ignored by a
    parent shell, is left as it is)."""

    def __init__(self) -> None:
        self.hit = False
        self._old: object = None
        self._installed = False

    def __enter__(self) -> InterruptLatch:
        if (threading.current_thread() is threading.main_thread()
                and signal.getsignal(signal.SIGINT) is signal.default_int_handler):
            self._old = signal.signal(signal.SIGINT, self._handle)
            self._installed = True
        return self

    def _handle(self, signum: int, frame: FrameType | None) -> None:  # noqa: ARG002
        self.hit = True
        raise KeyboardInterrupt

    def check(self) -> None:
        """Raise KeyboardInterrupt if SIGINT came and its exception was swallowed."""
        if self.hit:
            self.hit = False
            raise KeyboardInterrupt

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._installed:
            signal.signal(signal.SIGINT, self._old)  # type: ignore[arg-type]
            self._installed = False


@contextmanager
def sigint_deferred() -> Iterator[None]:
    """A Ctrl-C held back until the block ends, then handled as it would have been: for a
    hand-off that must not stop half way (records taken from the engines and not yet written
    would be lost, half a pickle would break the reader).

    NOTE: the SIGINT handler is swapped for one that notes the signal, not the signal masked:
    a process-directed signal goes to any thread not masking it (numpy's BLAS threads), and
    Python runs its handler in the main thread regardless. Only the main thread runs
    handlers, so a block in another thread has nothing to hold back."""
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is None):  # NOTE: a handler set outside Python
        yield
        return
    hit: list[int] = []
    old = signal.signal(signal.SIGINT, lambda signum, frame: hit.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)
        if hit:
            if callable(old):
                old(signal.SIGINT, None)
            elif old == signal.SIG_DFL:
                signal.raise_signal(signal.SIGINT)
