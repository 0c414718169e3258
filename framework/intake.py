"""Request intake: a caller's prompt made into plain token ids, and the checks that find a
request that can never run (the engine rejects it with the reason instead of queueing it)."""

from __future__ import annotations

import numbers
from collections.abc import Iterable
from typing import Any, NamedTuple

from schedlab.kv_allocator import KVAllocator
from schedlab.request import Request

#: the largest |priority| a request may carry: an integer a float holds exactly, as a priority
#: queue's aging adds seconds to it as a float
MAX_PRIORITY = 2**53


def why_bad_metadata(priority: object = 0, expected_output_len: object = None,
                     client_id: object = None, deadline_ms: object = None,
                     slo_class: object = None) -> str | None:
    """Why a request's metadata is not what the policies and metrics read (None: it is), as
    the server refuses it with a 400 and a trace file names its line: `priority` an integer
    within +-2**53, `expected_output_len` an integer >= 0, `deadline_ms` a number > 0 (inf: none),
    `client_id` and `slo_class` strings (each but `priority` may be None). No state change."""
    if (type(priority) is int and -MAX_PRIORITY <= priority <= MAX_PRIORITY
            and (expected_output_len is None
                 or type(expected_output_len) is int and expected_output_len >= 0)
            and (deadline_ms is None or type(deadline_ms) is float and deadline_ms > 0)
            and (client_id is None or type(client_id) is str)
            and (slo_class is None or type(slo_class) is str)):
        return None  # NOTE: the common request, without an ABC's isinstance (Python code)
    if isinstance(priority, bool) or not isinstance(priority, numbers.Integral) or not (
            -MAX_PRIORITY <= int(priority) <= MAX_PRIORITY):
        return f"priority={priority!r} must be an integer within +-2**53"
    if expected_output_len is not None and (
            isinstance(expected_output_len, bool)
            or not isinstance(expected_output_len, numbers.Integral)
            or int(expected_output_len) < 0):
        return f"expected_output_len={expected_output_len!r} must be an integer >= 0 or None"
    if deadline_ms is not None and (
            isinstance(deadline_ms, bool) or not isinstance(deadline_ms, numbers.Real)
            or not float(deadline_ms) > 0):  # NOTE: NaN too; inf (an SLO class's) is none
        return f"deadline_ms={deadline_ms!r} must be a number of milliseconds > 0 or None"
    for name, value in (("client_id", client_id), ("slo_class", slo_class)):
        if value is not None and not isinstance(value, str):
            return f"{name}={value!r} must be a str or None"
    return None


def is_token_id(t: object) -> bool:
    """Whether `t` is an integer (numpy and torch integers too), and not a bool."""
    # NOTE: a plain int first: the ABC check costs ~10x more and runs once per prompt token
    return type(t) is int or (isinstance(t, numbers.Integral) and not isinstance(t, bool))


class InRangeIds(list[int]):
    """A prompt whose maker vouches that every id is a plain int in [0, `bound`): a synthetic
    workload's own seeded draw (`schedlab.runs.prompts`), which `read_prompt` takes as it is,
    without reading each id, where `bound` is within the vocabulary. Any in-place change
    (append, `+=`, item assignment, ...) voids the promise (`bound` becomes None) and the list
    is checked as any other; a user's list always gets every check.

    Args:
        ids: the token ids.
        bound: every id is below it.
    """

    __slots__ = ("bound",)

    def __init__(self, ids: Iterable[int], bound: int) -> None:
        super().__init__(ids)
        self.bound: int | None = bound


def _voiding(name: str) -> Any:
    """`list.<name>`, setting the `InRangeIds`' bound to None first."""
    base = getattr(list, name)

    def method(self: InRangeIds, *args: Any) -> Any:
        self.bound = None
        return base(self, *args)

    method.__name__ = name
    return method


for _name in ("__setitem__", "__delitem__", "__iadd__", "__imul__", "append", "extend",
              "insert", "pop", "remove", "clear", "sort", "reverse"):
    setattr(InRangeIds, _name, _voiding(_name))


class Prompt(NamedTuple):
    """A caller's prompt as plain token ids, and why it can never run (None: it can)."""

    ids: list
    reason: str | None


def read_prompt(prompt_token_ids: Iterable[object], vocab_size: int) -> Prompt:
    """The prompt as a list (plain ints when every entry is an integer token id; the entries
    as given otherwise) and what is wrong with it: empty, an entry that is not an integer
    token id, or one outside [0, vocab_size). An unchanged `InRangeIds` within the vocabulary
    is the list itself (not a copy: the request keeps the maker's list), its ids not read.
    No state change."""
    if (type(prompt_token_ids) is InRangeIds and prompt_token_ids
            and prompt_token_ids.bound is not None and prompt_token_ids.bound <= vocab_size):
        return Prompt(prompt_token_ids, None)
    ids: list[Any] = list(prompt_token_ids)
    if not ids:
        return Prompt(ids, "empty prompt: a request needs at least one prompt token")
    if not set(map(type, ids)) <= {int}:  # NOTE: the common case, checked at C speed
        odd = next((t for t in ids if not is_token_id(t)), None)
        if odd is not None:
            return Prompt(ids, f"prompt token {odd!r} is not an integer token id")
        ids = [int(t) for t in ids]  # numpy / torch ints
    if min(ids) < 0 or max(ids) >= vocab_size:
        bad = next(t for t in ids if not 0 <= t < vocab_size)
        return Prompt(ids, f"prompt token id {bad} is outside the vocabulary [0, {vocab_size})")
    return Prompt(ids, None)


def why_invalid(req: Request, max_model_len: int, alloc: KVAllocator) -> str | None:
    """Why `req`, whose prompt `read_prompt` found fine, can never run on this engine: too
    long, or more KV than the whole pool (None: it can). No state change."""
    n = len(req.prompt_token_ids)  # NOTE: `num_prompt_tokens`, `max_total_tokens` inline
    if n > max_model_len:
        return f"prompt has {n} tokens, more than max_model_len={max_model_len}"
    total = n + req.sampling_params.max_tokens
    if total > max_model_len:
        return (f"prompt ({n} tokens) + max_tokens ({req.sampling_params.max_tokens}) = "
                f"{total} exceeds max_model_len={max_model_len}")
    need = alloc.blocks_needed(req, total)
    if need > alloc.num_blocks:
        return (f"needs {need} KV blocks of {alloc.block_size} tokens but the whole pool has "
                f"{alloc.num_blocks}")
    return None
