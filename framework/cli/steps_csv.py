"""steps.csv: one row per engine step, one column per `StepStats` field, written as a run hands
its steps over (`run_workload`'s `steps_out`), and read back (W&B's replay, the plots).

The rows are `csv.writer`'s text (`repr` of a float, `str` of an int, no quoting, rows ending
in \\r\\n), formatted by one %-format per row where every value is a plain number. Formatting is
most of the cost (`repr` of ~8 floats a row, ~5-15 us), so `StepsCsv` hands the rows, pickled,
to a child process that formats and writes them on another core; the file is the same bytes.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import pickle
import subprocess
import sys
from collections.abc import Iterator, Sequence
from itertools import chain
from operator import attrgetter
from pathlib import Path
from typing import Any

from schedlab.runs.interrupt import sigint_deferred
from schedlab.stats import StepStats

#: steps.csv rows formatted (or sent to the writer process) at a time
ROWS_PER_WRITE = 1 << 12
#: the value types whose %-format is `csv.writer`'s text (`repr` of a float, `str` of an int)
_PLAIN = frozenset((float, int, bool))
_FIELDS = dataclasses.fields(StepStats)
_NAMES = [f.name for f in _FIELDS]
HEADER = ",".join(_NAMES) + "\r\n"
#: one row's %-format (`%r` for a float field, `%s` for an int one)
ROW = ",".join("%r" if f.type in ("float", float) else "%s" for f in _FIELDS) + "\r\n"
_ROW_OF = attrgetter(*_NAMES)
#: the pipe's buffer asked for (Linux), so that a chunk's pickle rarely waits for the child
_PIPE_BYTES = 1 << 20

# NOTE: the writer process runs this with the standard library only (no schedlab import): it
# appends the rows of each pickled list of row tuples (a str: text to write as it is) to the
# file, until its input ends; Ctrl-C is the parent's to handle (it hands on what is left)
_WRITER = r"""
import csv, pickle, signal, sys
from itertools import chain
signal.signal(signal.SIGINT, signal.SIG_IGN)
plain, row, src = {float, int, bool}, sys.argv[2], sys.stdin.buffer
with open(sys.argv[1], "a", newline="") as f:
    slow = csv.writer(f)
    while True:
        try:
            rows = pickle.load(src)
        except EOFError:
            break
        if isinstance(rows, str):
            f.write(rows)
        elif set(map(type, chain.from_iterable(rows))) <= plain:
            f.writelines([row % r for r in rows])
        else:
            slow.writerows(rows)
"""


class _PlainPickler(pickle.Pickler):
    """Notes (`plain` False) any value not of a built-in type in what it pickles: a plugin's
    numpy float, a class of its own, at any depth. NOTE: ints, floats, strs, None and exact
    tuples, lists and dicts never reach `reducer_override` (pickle's C fast path), so plain
    rows cost nothing more."""

    plain = True

    def reducer_override(self, obj: Any) -> Any:
        self.plain = False
        return NotImplemented


def _dumps(rows: list[tuple[Any, ...]]) -> bytes:
    """The rows pickled for the writer process; rows holding any value not of a built-in type
    (or one that does not pickle) go as their text (`format_rows`, what `csv.writer` writes
    of them): the writer process then needs to import nothing of a plugin's (a class in a
    script's `__main__` is not there)."""
    buf = io.BytesIO()
    pickler = _PlainPickler(buf, pickle.HIGHEST_PROTOCOL)
    try:
        pickler.dump(rows)
    except Exception:  # NOTE: a plugin's value that does not pickle
        pickler.plain = False
    if pickler.plain:
        return buf.getvalue()
    return pickle.dumps(format_rows(rows), pickle.HIGHEST_PROTOCOL)


def format_rows(rows: Sequence[tuple[Any, ...]]) -> str:
    """The text of steps.csv rows (`StepStats` field values in field order), as `csv.writer`
    writes them."""
    if set(map(type, chain.from_iterable(rows))) <= _PLAIN:
        return "".join([ROW % r for r in rows])
    buf = io.StringIO(newline="")
    csv.writer(buf).writerows(rows)
    return buf.getvalue()


class StepsCsv:
    """steps.csv, written a list of steps at a time by a writer process, in the order given;
    the header is written at once, the rest is on disk once `close` returns (a context
    manager). Without a process (`child=False`, or none could start) the rows are written
    here.

    Args:
        path: the file (created, or emptied).
        child: format and write the rows in a child process.

    Raises:
        OSError: the file cannot be written (on open).
    """

    def __init__(self, path: Path, child: bool = True) -> None:
        self.path = Path(path)
        #: the rows taken so far (written, or sent to the writer process)
        self.num_rows = 0
        self._file: io.TextIOBase | None = open(self.path, "w", newline="")
        self._file.write(HEADER)
        self._proc: subprocess.Popen | None = None
        if child and sys.executable:
            self._file.close()
            self._file = None
            try:
                self._proc = subprocess.Popen(
                    [sys.executable, "-c", _WRITER, str(self.path), ROW],
                    stdin=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
            except OSError:
                self._file = open(self.path, "a", newline="")
            else:
                _widen(self._proc)

    def __call__(self, steps: Sequence[StepStats]) -> None:
        """Write the rows of `steps`, after those given before (`num_rows` counts the rows
        taken; a Ctrl-C stops a call between two chunks of rows, not within one).

        Raises:
            RuntimeError: the writer process failed (its error in the message).
        """
        for at in range(0, len(steps), ROWS_PER_WRITE):
            rows = list(map(_ROW_OF, steps[at:at + ROWS_PER_WRITE]))
            if self._proc is None:
                assert self._file is not None, f"{self.path} was closed"
                text = format_rows(rows)
                with sigint_deferred():
                    self._file.write(text)
                    self.num_rows += len(rows)
                continue
            self._send(_dumps(rows), len(rows))

    def _send(self, data: bytes, num_rows: int) -> None:
        assert self._proc is not None and self._proc.stdin is not None
        stdin = self._proc.stdin
        # NOTE: a Ctrl-C waits for the end of the write (then raises as usual): half a
        # pickle would leave the writer unable to read what follows
        with sigint_deferred():
            try:
                stdin.write(data)
                stdin.flush()
            except BrokenPipeError:
                self.close()  # raises with the writer's error
                raise RuntimeError(f"{self.path}: its writer process ended early") from None
            self.num_rows += num_rows

    def close(self, check: bool = True) -> None:
        """Finish the file: wait for the writer process. `check`: raise if it failed.
        Idempotent.

        Raises:
            RuntimeError: the writer process failed (its last words in the message).
        """
        if self._file is not None:
            self._file.close()
            self._file = None
        proc, self._proc = self._proc, None
        if proc is None:
            return
        assert proc.stdin is not None and proc.stderr is not None
        try:
            proc.stdin.close()
        except BrokenPipeError:
            pass
        err = proc.stderr.read().decode(errors="replace").strip()
        proc.stderr.close()
        if proc.wait() and check:
            last = err.splitlines()[-1] if err else f"exit status {proc.returncode}"
            raise RuntimeError(f"{self.path} could not be written (its writer process "
                               f"failed: {last})")

    def __enter__(self) -> StepsCsv:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        self.close(check=exc_type is None)


def _widen(proc: subprocess.Popen) -> None:
    try:
        import fcntl

        fcntl.fcntl(proc.stdin.fileno(), fcntl.F_SETPIPE_SZ, _PIPE_BYTES)  # type: ignore
    except (ImportError, AttributeError, OSError):  # another OS, or a lower system limit
        pass


def write_steps_csv(path: Path, step_stats: Sequence[StepStats]) -> Path:
    """steps.csv of `step_stats`, written here (see `StepsCsv`). Returns the path."""
    with StepsCsv(path, child=False) as out:
        out(step_stats)
    return path


def read_steps_csv(path: Path) -> Iterator[StepStats]:
    """steps.csv's rows as `StepStats`, one at a time (the same numbers: `repr` of a float
    reads back as that float; an empty cell, a None written, reads as None)."""
    kinds = [float if f.type in ("float", float) else int for f in _FIELDS]
    with open(path, newline="") as f:
        rows = csv.reader(f)
        next(rows)
        for r in rows:
            values: list[Any] = [kind(v) if v else None for kind, v in zip(kinds, r, strict=True)]
            yield StepStats(*values)
