"""Faults of running plugins, blamed on the plugin that broke: the errors the engine raises
when a plugin call raises or breaks a rule of its interface, and how it finds the culprit.

The mechanism that notices a broken rule (the KV manager checking a prefix match, the
admission helpers checking what the queue hands back) raises `PluginFault` with the kind of
plugin and the rule; the engine, which knows what each plugin is called in the config, turns it
into a `PluginContractError` naming the plugin. Any other exception raised inside a plugin
call becomes a `PluginRuntimeError` naming the plugin whose code raised it, the interface
method, the step and the line.
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Iterable
from dataclasses import dataclass
from types import CodeType, FrameType
from typing import TYPE_CHECKING

from schedlab.registry import PluginError
from schedlab.request import Request, RequestStatus

if TYPE_CHECKING:
    from schedlab.queue import RequestQueue

_FRAMEWORK_DIR = os.path.dirname(os.path.abspath(__file__))


class PluginContractError(PluginError):
    """A plugin broke a rule of its interface while running: a bug in the plugin, not in the
    configuration. The message names the plugin and the rule."""


class PluginFault(PluginContractError):
    """A rule broken by a plugin of `kind`, raised where the mechanism notices it; the engine
    re-raises it as a `PluginContractError` that names the plugin as configured.

    Args:
        kind: the plugin kind (`"queue"`, `"prefix_cache"`, ...).
        rule: the rest of the sentence, starting with the method that broke the rule.
    """

    def __init__(self, kind: str, rule: str) -> None:
        super().__init__(f"{kind} {rule}")
        self.kind = kind
        self.rule = rule


class PluginRuntimeError(PluginContractError):
    """A plugin raised while the engine ran it. `__cause__` is the original exception (its
    traceback is the full story); the message is one sentence naming the plugin, the method,
    the step and the line."""


@dataclass(frozen=True, slots=True)
class PluginSlot:
    """One plugin the engine runs: its kind, the object and its name as messages spell it."""

    kind: str
    plugin: object
    name: str

    def files(self) -> set[str]:
        """The source files of the plugin's class and its bases outside the framework."""
        out = set()
        for klass in type(self.plugin).__mro__:
            module = sys.modules.get(klass.__module__)
            path = getattr(module, "__file__", None)
            if path and not _in_framework(path):
                out.add(os.path.abspath(path))
        return out


def _in_framework(path: str) -> bool:
    return os.path.abspath(path).startswith(_FRAMEWORK_DIR + os.sep)


def _where(path: str, line: int) -> str:
    path = os.path.abspath(path)
    cwd = os.getcwd()
    if path.startswith(cwd + os.sep):
        path = os.path.relpath(path, cwd)
    return f"{path}:{line}"


def blame(exc: BaseException, slots: Iterable[PluginSlot], called: PluginSlot, method: str,
          step: int | None) -> PluginContractError:
    """The error to raise for `exc`, raised while the engine called `called`'s `method`.

    A `PluginFault` gets the configured name of the plugin of its kind; another
    `PluginContractError` is returned unchanged; anything else is blamed on the plugin whose
    code raised it (the innermost frame in a plugin's source, or whose `self` is a plugin),
    naming the interface method the framework called on it and the line that raised.
    """
    slots = list(slots)
    if isinstance(exc, PluginFault):
        slot = next((s for s in slots if s.kind == exc.kind), None)
        name = f" {slot.name}" if slot is not None else ""
        return PluginContractError(f"{exc.kind}{name} {exc.rule}")
    if isinstance(exc, PluginContractError):
        return exc
    frames = list(traceback.walk_tb(exc.__traceback__))
    owner = _owners(frames, slots)
    culprit, fn, loc = called, method, None
    for i in range(len(frames) - 1, -1, -1):
        found = owner[i]
        if found is not None:
            culprit = found
            frame, line = frames[i]
            loc = _where(frame.f_code.co_filename, line)
            j = i
            while j > 0 and owner[j - 1] is culprit:
                j -= 1
            fn = frames[j][0].f_code.co_name
            break
    if loc is None and frames:
        frame, line = frames[-1]
        loc = _where(frame.f_code.co_filename, line)
    at = f" at step {step}" if step is not None else ""
    what = repr(exc) if len(repr(exc)) <= 300 else repr(exc)[:297] + "..."
    return PluginRuntimeError(f"{culprit.kind} {culprit.name} raised {what} in {fn}(){at}"
                              + (f" ({loc})" if loc else ""))


def _owners(frames: list[tuple], slots: list[PluginSlot]) -> list[PluginSlot | None]:
    by_file: dict[str, PluginSlot] = {}
    for s in slots:
        for f in s.files():
            by_file.setdefault(f, s)
    out: list[PluginSlot | None] = []
    for frame, _ in frames:
        path = frame.f_code.co_filename
        if _in_framework(path):
            out.append(None)
            continue
        me = frame.f_locals.get("self")
        slot = next((s for s in slots if s.plugin is me), None) if me is not None else None
        out.append(slot or by_file.get(os.path.abspath(path)))
    return out


def named(value: object) -> str:
    """A plugin's return value as a message names it: a request by its id, else its type."""
    if isinstance(value, Request):
        return f"request {value.request_id!r}"
    if value is None:
        return "None"
    if type(value) is not tuple and isinstance(value, tuple) and len(value) == 2:
        return f"{type(value).__name__}({named(value[0])}, {named(value[1])})"  # a Dropped
    return f"{value!r:.40} ({type(value).__name__})"


def plugin_at(frame: object, slots: Iterable[PluginSlot],
              below: CodeType) -> tuple[PluginSlot, str, str, FrameType] | None:
    """The plugin whose code a thread runs now, from that thread's innermost `frame`
    (`sys._current_frames()`): its slot, the interface method the framework called, the line
    it stands at and that method's frame (the same object for as long as the call lasts);
    None when the thread is in no plugin's code inside a call of `below` (the run loop: a
    caller's own frames are never blamed, even in a plugin's file). No state change."""
    stack = list(traceback.walk_stack(frame))  # type: ignore[arg-type]
    stack.reverse()  # NOTE: outermost first, as a traceback's frames
    start = next((k for k, (f, _) in enumerate(stack) if f.f_code is below), None)
    if start is None:
        return None
    stack = stack[start + 1:]
    owner = _owners(stack, list(slots))
    for i in range(len(stack) - 1, -1, -1):
        found = owner[i]
        if found is not None:
            j = i
            while j > 0 and owner[j - 1] is found:
                j -= 1
            f, line = stack[i]
            outer = stack[j][0]
            return found, outer.f_code.co_name, _where(f.f_code.co_filename, line), outer
    return None


def full_traceback(exc: BaseException) -> str:
    """The traceback of what a plugin raised (`__cause__`), for `HYDRA_FULL_ERROR=1`."""
    cause = exc.__cause__ if isinstance(exc, PluginRuntimeError) and exc.__cause__ else exc
    return "".join(traceback.format_exception(type(cause), cause, cause.__traceback__))


def check_accounted(live: dict[str, Request], running: list[Request], queue: RequestQueue,
                    queue_name: str, scheduler_name: str) -> None:
    """Every request the engine handed to the scheduler and that has not ended is running or
    queued, once. Call it when `len(running) + len(queue) != len(live)` (the cheap test); it
    drops ended requests from `live` (changes it) and scans the rest.

    Raises:
        PluginContractError: the queue lost or duplicated requests, or the scheduler dropped
            running ones, in one sentence naming the plugin and the method at fault.
    """
    for rid in [rid for rid, r in live.items() if r.is_finished]:
        del live[rid]
    if len(running) + len(queue) == len(live):
        return
    queued: dict[int, int] = {}  # id(request) -> times iteration yields it
    for r in queue:
        queued[id(r)] = queued.get(id(r), 0) + 1
    twice = [r for r in live.values() if queued.get(id(r), 0) > 1]
    if twice:
        raise PluginContractError(
            f"queue {queue_name} holds request {twice[0].request_id!r} "
            f"{queued[id(twice[0])]} times: add() and prepend() must queue a request once")
    on_seat = {id(r) for r in running}
    lost = [r for r in live.values() if id(r) not in on_seat and id(r) not in queued]
    dropped = [r for r in lost if r.status is RequestStatus.RUNNING]
    if dropped:
        raise PluginContractError(
            f"scheduler {scheduler_name} dropped {len(dropped)} running request"
            f"{'s' if len(dropped) > 1 else ''} ({_ids(dropped)}) from self.running without "
            "finishing or preempting them")
    if lost:
        them = "them" if len(lost) > 1 else "it"
        raise PluginContractError(
            f"queue {queue_name} lost {len(lost)} request{'s' if len(lost) > 1 else ''}: add() "
            f"accepted {them} but pop()/iteration never returned {them} ({_ids(lost)})")
    if len(queue) != len(queued):
        raise PluginContractError(
            f"queue {queue_name}: len() is {len(queue)} but iteration yields {len(queued)} "
            "requests; __len__ must count the queued requests")


def _ids(reqs: list[Request]) -> str:
    shown = ", ".join(repr(r.request_id) for r in reqs[:5])
    return f"request id{'s' if len(reqs) > 1 else ''} {shown}" + (", ..." if len(reqs) > 5 else "")

