"""Requests, sampling parameters and the outputs handed back to users (vLLM-shaped)."""

from __future__ import annotations

import enum
import math
import numbers
from collections.abc import Iterable
from dataclasses import dataclass, field

#: the smallest non-zero temperature (vLLM samples below it greedily; here it is refused)
MIN_TEMPERATURE = 1e-5


def _integer(name: str, v: object) -> int:
    """`v` as an int, or ValueError naming `name` (bools refused)."""
    if type(v) is int:  # NOTE: the common case first: the ABC check costs ~10x more
        return v
    if isinstance(v, bool) or not isinstance(v, numbers.Integral):
        raise ValueError(f"{name} must be an integer, got {v!r}")
    return int(v)


def _real(name: str, v: object) -> float:
    """`v` as a finite float, or ValueError naming `name` (bools refused)."""
    if type(v) is float and math.isfinite(v):
        return v
    if type(v) is int:
        return float(v)
    if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v):
        raise ValueError(f"{name} must be a finite number, got {v!r}")
    return float(v)


def _penalty(name: str, v: object) -> float:
    x = _real(name, v)
    if not -2.0 <= x <= 2.0:
        raise ValueError(f"{name} must be in [-2, 2], got {x!r}")
    return x


@dataclass(slots=True)
class SamplingParams:
    """How to sample one request's output (vLLM's names and defaults).

    Args:
        temperature: 0 means greedy; higher flattens the distribution.
        top_p: nucleus sampling mass in (0, 1].
        top_k: keep the k most likely tokens; 0 or -1 disables it.
        max_tokens: the most output tokens to generate (>= 1).
        seed: per-request seed; `None` draws from the engine's generator.
        ignore_eos: keep generating past EOS (exact output lengths for benchmarks).
        stop_token_ids: further token ids that end the request.
        min_tokens: no EOS or stop token id before this many output tokens (vLLM's).
        presence_penalty: subtracted from the logit of each token already in the output.
        frequency_penalty: subtracted once per occurrence in the output.
        repetition_penalty: divides positive (multiplies negative) logits of tokens in the
            prompt or the output; 1 disables it.
        logit_bias: token id -> a bias added to its logit, clamped to [-100, 100].

    Raises:
        ValueError: a field is out of range; the message names it.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_tokens: int = 16
    seed: int | None = None
    ignore_eos: bool = False
    stop_token_ids: list[int] = field(default_factory=list)
    min_tokens: int = 0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] | None = None

    def __post_init__(self) -> None:
        self.max_tokens = _integer("max_tokens", self.max_tokens)
        if self.max_tokens <= 0:
            raise ValueError(f"max_tokens must be a positive integer, got {self.max_tokens!r}")
        self.temperature = t = _real("temperature", self.temperature)
        if t < 0:
            raise ValueError(f"temperature must be >= 0, got {t!r}")
        if 0 < t < MIN_TEMPERATURE:
            raise ValueError(f"temperature must be 0 (greedy) or at least {MIN_TEMPERATURE:g} "
                             f"(smaller ones overflow the logits), got {t!r}")
        self.top_p = _real("top_p", self.top_p)
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        self.top_k = _integer("top_k", self.top_k)
        if self.top_k < -1:
            raise ValueError(f"top_k must be -1, 0 (disabled) or positive, got {self.top_k!r}")
        if self.seed is not None:
            self.seed = _integer("seed", self.seed)
            if not -(2**63) <= self.seed < 2**64:
                raise ValueError(f"seed must be a 64-bit integer, got {self.seed!r}")
        self.min_tokens = _integer("min_tokens", self.min_tokens)
        if not 0 <= self.min_tokens <= self.max_tokens:
            raise ValueError(f"min_tokens must be in [0, max_tokens={self.max_tokens}], got "
                             f"{self.min_tokens!r}")
        self.presence_penalty = _penalty("presence_penalty", self.presence_penalty)
        self.frequency_penalty = _penalty("frequency_penalty", self.frequency_penalty)
        self.repetition_penalty = _real("repetition_penalty", self.repetition_penalty)
        if self.repetition_penalty <= 0:
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty!r}")
        if self.logit_bias is not None:
            if not isinstance(self.logit_bias, dict):
                raise ValueError(f"logit_bias must map token ids to numbers, got "
                                 f"{self.logit_bias!r}")
            self.logit_bias = {_integer("logit_bias token id", t):
                               min(100.0, max(-100.0, _real("logit_bias[]", b)))
                               for t, b in self.logit_bias.items()} or None
        stop = self.stop_token_ids
        if type(stop) is list and not stop:
            self.stop_token_ids = []
            return
        if isinstance(stop, str | bytes) or not isinstance(stop, Iterable):
            raise ValueError(f"stop_token_ids must be a list of token ids, got {stop!r}")
        self.stop_token_ids = [_integer("stop_token_ids[]", t) for t in stop]

    def with_max_tokens(self, max_tokens: int) -> SamplingParams:
        """A new `SamplingParams` equal to these with `max_tokens` (what the constructor
        gives for these fields and it, error included): these were checked when made, so a
        plain int in range is only copied in (a workload's requests, one each, at ~1/10 of
        the checks' cost); any other value goes through the constructor's checks. No state
        change."""
        if type(max_tokens) is not int or max_tokens < 1 or max_tokens < self.min_tokens:
            return SamplingParams(self.temperature, self.top_p, self.top_k, max_tokens,
                                  self.seed, self.ignore_eos, self.stop_token_ids,
                                  self.min_tokens, self.presence_penalty,
                                  self.frequency_penalty, self.repetition_penalty,
                                  self.logit_bias)
        sp = _new_params(SamplingParams)
        sp.temperature = self.temperature
        sp.top_p = self.top_p
        sp.top_k = self.top_k
        sp.max_tokens = max_tokens
        sp.seed = self.seed
        sp.ignore_eos = self.ignore_eos
        sp.stop_token_ids = self.stop_token_ids.copy()  # NOTE: lists and dicts their own
        sp.min_tokens = self.min_tokens
        sp.presence_penalty = self.presence_penalty
        sp.frequency_penalty = self.frequency_penalty
        sp.repetition_penalty = self.repetition_penalty
        sp.logit_bias = None if self.logit_bias is None else dict(self.logit_bias)
        return sp

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def shapes_logits(self) -> bool:
        """Whether the logits change before sampling (penalties, bias, min_tokens)."""
        return bool(self.min_tokens or self.presence_penalty or self.frequency_penalty
                    or self.repetition_penalty != 1.0 or self.logit_bias)


_new_params = object.__new__


class RequestFailure(RuntimeError):
    """A step could not go on because of some requests alone (raised by an executor before it
    changed anything the step's other requests depend on); a server fails those and steps on.

    Args:
        reasons: request id -> why it failed (one clause).
    """

    def __init__(self, reasons: dict[str, str]) -> None:
        super().__init__("; ".join(f"request {k!r}: {v}" for k, v in reasons.items()))
        self.reasons = reasons


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED_STOPPED = "stop"
    FINISHED_LENGTH = "length"
    FINISHED_ABORTED = "abort"
    REJECTED = "rejected"

    @property
    def finished(self) -> bool:
        return self._value_ in _FINISHED  # NOTE: a str lookup; hashing a member is Python code


_RUNNING, _WAITING, _PREEMPTED = (
    RequestStatus.RUNNING, RequestStatus.WAITING, RequestStatus.PREEMPTED)
_FINISHED = frozenset({
    RequestStatus.FINISHED_STOPPED.value,
    RequestStatus.FINISHED_LENGTH.value,
    RequestStatus.FINISHED_ABORTED.value,
    RequestStatus.REJECTED.value,
})


@dataclass(slots=True)
class RequestMetrics:
    """Timestamps of one request, in seconds on the engine's clock.

    `token_times[i]` is when output token i was produced; `first_token_time` equals
    `token_times[0]`. Latencies follow vLLM: TTFT = first_token_time - arrival_time.
    """

    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    token_times: list[float] = field(default_factory=list)
    finished_time: float | None = None
    num_preemptions: int = 0
    num_cached_tokens: int = 0


@dataclass(slots=True, eq=False)
class Request:
    """One request inside the engine.

    Who changes it: the engine (a rejection at `add_request`), the scheduler (status, output
    tokens, timestamps, preemption), the KV manager (`num_computed_tokens` when a cached prefix
    is shared) and the sampler (a seeded request's `generator`). Policies and executors read it.

    `num_computed_tokens` counts tokens whose K/V has been computed (on the device, or on the
    host while the request is swapped out); the tokens still to run are
    `all_token_ids[num_computed_tokens:]`.
    """

    request_id: str
    #: the prompt; once a run's request of a synthetic workload ended, its workload's prompt
    #: (`schedlab.runs.prompts.LazyTokens`: reads like the list; `list(...)` it for JSON)
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    arrival_time: float = 0.0
    #: lower runs first under a priority queue (vLLM's convention)
    priority: int = 0
    #: the output length a length-aware policy may use (an oracle); None: unknown
    expected_output_len: int | None = None
    #: who sent it (a tenant / user): fairness policies and per-client metrics group by it
    client_id: str | None = None
    #: the latency objective, in ms after arrival, that deadline-aware policies order by
    deadline_ms: float | None = None
    #: a named SLO tier ("interactive", "batch", ...): per-class metrics group by it
    slo_class: str | None = None
    #: token ids that end the request unless `ignore_eos` (a checkpoint may have several)
    eos_token_ids: frozenset[int] = frozenset()
    output_token_ids: list[int] = field(default_factory=list)
    status: RequestStatus = RequestStatus.WAITING
    num_computed_tokens: int = 0
    finish_reason: str | None = None
    reject_reason: str | None = None
    metrics: RequestMetrics = field(init=False)
    #: the per-request sampling generator (seeded requests), created by the sampler
    generator: object | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.metrics = RequestMetrics(arrival_time=self.arrival_time)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    def token_slice(self, start: int, stop: int) -> list[int]:
        """Token ids in [start, stop) of prompt + output, without building the whole list."""
        p = len(self.prompt_token_ids)
        if stop <= p:
            return self.prompt_token_ids[start:stop]
        if start >= p:
            return self.output_token_ids[start - p : stop - p]
        return self.prompt_token_ids[start:] + self.output_token_ids[: stop - p]

    @property
    def is_finished(self) -> bool:
        s = self.status  # NOTE: identity tests; hashing a member is Python code
        return not (s is _RUNNING or s is _WAITING or s is _PREEMPTED)

    def end(self, status: RequestStatus, now: float, reject_reason: str | None = None) -> None:
        """Mark the request ended with a finished `status` at `now` (and why, when rejected or
        aborted). Changes the request only; whoever holds its KV frees it."""
        self.status = status
        self.finish_reason = status.value
        if reject_reason is not None:
            self.reject_reason = reject_reason
        self.metrics.finished_time = now

    @property
    def max_total_tokens(self) -> int:
        """Prompt plus the most output tokens this request may produce."""
        return self.num_prompt_tokens + self.sampling_params.max_tokens


@dataclass(slots=True)
class CompletionOutput:
    """One generated sequence (vLLM's `CompletionOutput`)."""

    index: int
    token_ids: list[int]
    text: str | None
    finish_reason: str | None


@dataclass(slots=True)
class RequestOutput:
    """What a user gets back for one prompt (vLLM's `RequestOutput`).

    `finish_reason` is "stop", "length", "abort" or "rejected"; a rejected request carries
    its reason in `reject_reason` and no tokens.
    """

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    metrics: RequestMetrics
    reject_reason: str | None = None

    @property
    def num_cached_tokens(self) -> int:
        """Prompt tokens found in the prefix cache when the request was first scheduled
        (vLLM's `RequestOutput.num_cached_tokens`; the same as `metrics.num_cached_tokens`)."""
        return self.metrics.num_cached_tokens


@dataclass(slots=True)
class MigratedRequest:
    """A request on its way between engines (`Engine.migrate_out` -> `Engine.migrate_in`).

    Args:
        request: the request, unfinished, with its output and timestamps so far.
        num_tokens: how many of its tokens have K/V that moves with it (0: recomputed there).
        data: the K/V itself from `Executor.export_kv` (None in simulation).
    """

    request: Request
    num_tokens: int
    data: object | None = None
