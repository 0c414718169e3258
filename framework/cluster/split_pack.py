"""What crosses a split run's pipes (`schedlab.cluster.parallel`), packed: step records as
tuples, a request's token ids and times as arrays.

NOTE: a pickled slots dataclass is rebuilt by a Python-level `__setstate__` and a list of ints
item by item; a record as a tuple and a list of ints or floats as an `array` cross ~10x
cheaper (a long detailed run hands over ~100 M such items).
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from itertools import starmap
from operator import attrgetter

import numpy as np

from schedlab.request import Request, RequestMetrics
from schedlab.runs.prompts import LazyTokens
from schedlab.stats import StepStats

_STEP_FIELDS = attrgetter(*StepStats.__slots__)
_REQUEST_SLOTS: tuple[str, ...] = Request.__slots__
_METRICS_SLOTS: tuple[str, ...] = RequestMetrics.__slots__
_ID_LISTS = ("prompt_token_ids", "output_token_ids")


def pack_steps(steps: list[StepStats]) -> list[tuple]:
    return list(map(_STEP_FIELDS, steps))


def unpack_steps(rows: list[tuple]) -> list[StepStats]:
    return list(starmap(StepStats, rows))


def _packed(values: list, typecode: str) -> object:
    """`values` as an array of `typecode` when every entry fits one (a list otherwise)."""
    if not isinstance(values, list):
        return values
    try:
        return array(typecode, values)
    except (TypeError, OverflowError):
        return values


def _unpacked(values: object) -> object:
    return values.tolist() if type(values) is array else values


def _unpacked_ids(values: object, shared: np.ndarray) -> object:
    """Token ids packed by `_packed`, as a list of the `shared` int objects where they lie
    in its range (as a workload's prompts hold them: 8 bytes a token), else of their own."""
    if type(values) is not array:
        return values
    ids = np.frombuffer(values, np.int64)
    if len(ids) and 0 <= int(ids.min()) and int(ids.max()) < len(shared):
        return shared[ids].tolist()
    return values.tolist()


def pack_request(r: Request) -> tuple:
    out = []
    for name in _REQUEST_SLOTS:
        v = getattr(r, name)
        if name in _ID_LISTS:
            # NOTE: a workload's prompt (a request that ended refers to it): None, the run's
            # process has it
            v = None if type(v) is LazyTokens else _packed(v, "q")
        elif name == "metrics":
            v = tuple(_packed(getattr(v, m), "d") if m == "token_times" else getattr(v, m)
                      for m in _METRICS_SLOTS)
        out.append(v)
    return tuple(out)


def unpack_request(values: tuple, shared: np.ndarray, prompt: Sequence[int]) -> Request:
    """The request `pack_request` packed, its token ids `shared` int objects where it can,
    its prompt `prompt` (its workload's) where it referred to its workload's."""
    r = Request.__new__(Request)
    for name, v in zip(_REQUEST_SLOTS, values, strict=True):
        if name in _ID_LISTS:
            v = prompt if v is None and name == "prompt_token_ids" else _unpacked_ids(v, shared)
        elif name == "metrics":
            m = RequestMetrics.__new__(RequestMetrics)
            for field, x in zip(_METRICS_SLOTS, v, strict=True):
                setattr(m, field, _unpacked(x) if field == "token_times" else x)
            v = m
        setattr(r, name, v)
    return r
