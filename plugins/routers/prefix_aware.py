"""Prefix aware: the instance that holds the longest cached prefix, unless it is overloaded."""

from __future__ import annotations

from collections.abc import Sequence

from schedlab.cluster.router import InstanceLoad, Router
from schedlab.request import Request


class PrefixAwareRouter(Router):
    """Cache-aware routing (SGLang's router): send a request where the longest prefix of its
    prompt is already cached, so its prefill is shorter; fall back to the least loaded
    instance when no instance has a useful match.

    NOTE: the load cap keeps a popular prefix from piling every request onto one instance:
    only instances whose outstanding tokens are within `max_load_ratio` x the least loaded
    one's plus `load_slack_tokens` compete on prefix length.

    Args:
        max_load_ratio: the cap relative to the least loaded instance (>= 1).
        load_slack_tokens: the cap's absolute slack, in tokens (>= 0), so that lightly loaded
            instances still compete on prefix.
        min_match_tokens: a shorter match counts as none (>= 0).

    Raises:
        ValueError: an option is out of range.
    """

    uses_prefix = True

    def __init__(self, max_load_ratio: float = 1.5, load_slack_tokens: int = 2048,
                 min_match_tokens: int = 1, **options: object) -> None:
        super().__init__(**options)
        if not max_load_ratio >= 1.0:
            raise ValueError(f"max_load_ratio={max_load_ratio!r} must be >= 1")
        if load_slack_tokens < 0 or min_match_tokens < 0:
            raise ValueError("load_slack_tokens and min_match_tokens must be >= 0")
        self.max_load_ratio = float(max_load_ratio)
        self.load_slack_tokens = int(load_slack_tokens)
        self.min_match_tokens = int(min_match_tokens)

    def select(self, request: Request, loads: Sequence[InstanceLoad]) -> int:
        lightest = min(x.outstanding_tokens for x in loads)
        cap = lightest * self.max_load_ratio + self.load_slack_tokens
        eligible = [x for x in loads if x.outstanding_tokens <= cap
                    and x.cached_prefix_tokens >= max(self.min_match_tokens, 1)]
        if not eligible:
            return self.least_loaded(loads)
        best = max(eligible, key=lambda x: (x.cached_prefix_tokens, -x.outstanding_tokens,
                                            -x.index))
        return best.index
