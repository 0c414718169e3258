"""Prompts drawn when read: a synthetic workload keeps where each prompt's draw starts on its
seeded generator instead of the prompt's tokens."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, overload

import numpy as np

from schedlab.runs.distributions import FIRST_TOKEN_ID, random_tokens


class LazyTokens(Sequence[int]):
    """A prompt of random token ids drawn when read: where its generator stood before the
    draw and its length (~0.15 KB, instead of 8 bytes a token held for the whole run); every
    read gives the list `random_tokens` drew then. `lazy_prompts` makes them.

    It reads like the list (`len`, iteration, indexing, `in`, `index`, `count`, `reversed`,
    `+` with a list, equality with a list) but is not one: `list(...)` it for anything else
    (JSON, a tensor). NOTE: each read draws the whole list again; take `list(...)` once to
    read it often.
    """

    __slots__ = ("_replay", "_at", "_n", "_vocab")

    def __init__(self, replay: _Replay, at: int, n: int, vocab_size: int) -> None:
        self._replay, self._at, self._n, self._vocab = replay, at, n, vocab_size

    def __len__(self) -> int:
        return self._n

    def _ids(self) -> list[int]:
        return self._replay.draw(self._at, self._n, self._vocab, shared=True)

    def own_ids(self) -> list[int]:
        """The list, its ints its own rather than the shared ones a read refers to: 32 bytes
        more a token, but nothing far away to touch in making or freeing it (for a prompt
        forgotten soon after, as a streaming run's)."""
        return self._replay.draw(self._at, self._n, self._vocab, shared=False)

    def __iter__(self) -> Iterator[int]:
        return iter(self._ids())

    @overload
    def __getitem__(self, i: int) -> int: ...
    @overload
    def __getitem__(self, i: slice) -> list[int]: ...

    def __getitem__(self, i: int | slice) -> int | list[int]:
        return self._ids()[i]

    def __contains__(self, token: object) -> bool:
        return token in self._ids()

    def __reversed__(self) -> Iterator[int]:
        return reversed(self._ids())

    def index(self, token: Any, start: int = 0, stop: int | None = None) -> int:
        ids = self._ids()
        return ids.index(token, start, len(ids) if stop is None else stop)

    def count(self, token: Any) -> int:
        return self._ids().count(token)

    def __add__(self, other: list[int]) -> list[int]:
        return self._ids() + other

    def __radd__(self, other: list[int]) -> list[int]:
        return other + self._ids()

    def __eq__(self, other: object) -> bool:
        if isinstance(other, LazyTokens | list):
            return self._ids() == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # equal to a list: not hashable either

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        return np.array(self._ids(), dtype=dtype)

    def __repr__(self) -> str:
        return repr(self._ids())


_MASK128 = (1 << 128) - 1


class _Replay:
    """Draws of one PCG64 stream again, from positions saved along it: each position one int
    (the 128-bit state, the buffered 32 bits above it, the buffer's flag above those)."""

    def __init__(self, bits: np.random.PCG64) -> None:
        self._stream = bits
        #: one draw at a time: the replay generator is shared by every prompt of the workload
        self._lock = threading.Lock()
        self._inc = bits.state["state"]["inc"]
        self._bits = np.random.PCG64(0)
        self._rng = np.random.Generator(self._bits)

    def position(self) -> int:
        """Where the stream stands now. No state change."""
        st = self._stream.state
        return st["state"]["state"] | st["uinteger"] << 128 | st["has_uint32"] << 160

    def draw(self, at: int, n: int, vocab_size: int, shared: bool) -> list[int]:
        """`random_tokens` of `n` ids from position `at` (`shared`: referring to the shared
        ints, as it does; else ints of their own). The stream itself does not move."""
        with self._lock:
            self._bits.state = {"bit_generator": "PCG64",
                                "state": {"state": at & _MASK128, "inc": self._inc},
                                "has_uint32": at >> 160, "uinteger": at >> 128 & 0xFFFFFFFF}
            if shared:
                return random_tokens(self._rng, n, vocab_size)
            return self._rng.integers(FIRST_TOKEN_ID, vocab_size, size=n).tolist()


def lazy_prompts(rng: np.random.Generator, lengths: Iterable[Any],
                 vocab_size: int) -> list[Sequence[int]]:
    """`[random_tokens(rng, k, vocab_size) for k in lengths]`, each prompt a `LazyTokens`
    that draws its list when read (plain lists for a generator other than PCG64); `rng` moves
    on as those draws move it."""
    if type(rng.bit_generator) is not np.random.PCG64:
        return [random_tokens(rng, int(k), vocab_size) for k in lengths]
    replay = _Replay(rng.bit_generator)
    out: list[Sequence[int]] = []
    for k in lengths:
        out.append(LazyTokens(replay, replay.position(), int(k), vocab_size))
        rng.integers(FIRST_TOKEN_ID, vocab_size, size=int(k))  # the draw `random_tokens` makes
    return out
