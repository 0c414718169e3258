"""Prompts drawn when read: a synthetic workload keeps where each block of prompts starts on its
seeded generator instead of the prompts' tokens."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, overload

import numpy as np

from schedlab.intake import InRangeIds
from schedlab.runs.distributions import FIRST_TOKEN_ID, random_tokens, token_ints

#: a block of consecutive prompts, drawn in one call, holds about this many tokens: reading
#: the prompts in order draws each block once, a prompt read out of order its block up to it
BLOCK_TOKENS = 1024
#: reading the prompts in order draws this many tokens or so at a time (whole blocks)
READ_AHEAD_TOKENS = 16384


class LazyTokens(Sequence[int]):
    """A prompt of random token ids drawn when read: its block of prompts on the seeded
    generator, where in the block it starts and its length (~0.15 KB, instead of 8 bytes a
    token held for the whole run); every read gives the list `random_tokens` drew then.
    `lazy_prompts` makes them.

    It reads like the list (`len`, iteration, indexing, `in`, `index`, `count`, `reversed`,
    `+` with a list, equality with a list) but is not one: `list(...)` it for anything else
    (JSON, a tensor). NOTE: each read draws the whole list again; take `list(...)` once to
    read it often.
    """

    __slots__ = ("_replay", "_block", "_offset", "_n")

    def __init__(self, replay: _Replay, block: int, offset: int, n: int) -> None:
        self._replay, self._block, self._offset, self._n = replay, block, offset, n

    def __len__(self) -> int:
        return self._n

    def _ids(self) -> list[int]:
        return self._replay.draw(self._block, self._offset, self._n, shared=True)

    def read(self, own: bool) -> InRangeIds:
        """The list, as an `InRangeIds` (every id a plain int in [2, the vocabulary), which
        the engine's intake takes without reading each). `own`: its ints its own rather than
        the shared ones a read refers to: 32 bytes more a token, but nothing far away to touch
        in making or freeing it (for a prompt forgotten soon after, as a streaming run's)."""
        r = self._replay
        return InRangeIds(r.draw(self._block, self._offset, self._n, shared=not own),
                          r.vocab_size)

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
    """Draws of one PCG64 stream again, block by block, from the positions saved at each
    block's start: each position one int (the 128-bit state, the buffered 32 bits above it,
    the buffer's flag above those). What was drawn last is kept, so that reading the prompts
    in order draws each block once: a read that goes on where the last draw of whole blocks
    ended draws the next `READ_AHEAD_TOKENS` or so in one call, from where the replay
    generator stands (no state to set); a prompt read out of order draws its block only up
    to its end. (A numpy call costs ~5 us hot, 50-100 us cold in cache, as between engine
    steps: per prompt, the one slice and `tolist` left.)

    NOTE: `integers(size=a + b)` draws what `integers(size=a)` then `integers(size=b)` do
    (one 32-bit draw after the other, rejections included), so a block's draw is its prompts'
    draws one after the other, and a draw of several blocks theirs."""

    def __init__(self, bits: np.random.PCG64, vocab_size: int) -> None:
        self._stream = bits
        self.vocab_size = vocab_size
        #: one draw at a time: the replay generator is shared by every prompt of the workload
        self._lock = threading.Lock()
        self._inc = bits.state["state"]["inc"]
        self._bits = np.random.PCG64(0)
        self._rng = np.random.Generator(self._bits)
        #: each block's start on the stream, its number of tokens and its first token's
        #: position among all the blocks' tokens
        self._starts: list[int] = []
        self._sizes: list[int] = []
        self._firsts: list[int] = []
        self._total = 0
        #: the tokens kept: positions [_lo, _hi) of all the blocks' tokens, as drawn
        self._lo = self._hi = 0
        self._kept = np.zeros(0, np.int64)
        self._drawn = False
        #: the block whose start the replay generator stands at (-1: none known)
        self._at_block = -1

    def position(self) -> int:
        """Where the stream stands now. No state change."""
        st = self._stream.state
        return st["state"]["state"] | st["uinteger"] << 128 | st["has_uint32"] << 160

    def add_block(self, num_tokens: int) -> int:
        """Note a block of `num_tokens` starting where the stream stands now (its caller
        then draws them from the stream). Returns the block's index. Changes state."""
        self._starts.append(self.position())
        self._sizes.append(num_tokens)
        self._firsts.append(self._total)
        self._total += num_tokens
        return len(self._sizes) - 1

    def _draw_from(self, block: int, size: int) -> None:
        """Keep the `size` tokens drawn from `block`'s start. Changes state."""
        if self._at_block != block:
            at = self._starts[block]
            self._bits.state = {"bit_generator": "PCG64",
                                "state": {"state": at & _MASK128, "inc": self._inc},
                                "has_uint32": at >> 160,
                                "uinteger": at >> 128 & 0xFFFFFFFF}
        self._kept = self._rng.integers(FIRST_TOKEN_ID, self.vocab_size, size=size)
        self._lo = self._firsts[block]
        self._hi = self._lo + size
        self._drawn = True
        # NOTE: a draw that ends at a block's end leaves the generator at the next one's start
        end = block + 1
        firsts = self._firsts
        while end < len(firsts) and firsts[end] < self._hi:
            end += 1
        self._at_block = end if (end < len(firsts) and firsts[end] == self._hi) else -1

    def draw(self, block: int, offset: int, n: int, shared: bool) -> list[int]:
        """The `n` ids from `offset` in `block`, as `random_tokens` drew them (`shared`:
        referring to the shared ints, as it does; else ints of their own). The stream itself
        does not move."""
        with self._lock:
            g = self._firsts[block] + offset
            if not self._lo <= g <= g + n <= self._hi:
                if offset == 0 and (block == self._at_block or not self._drawn):
                    # NOTE: in order (or the first read): the blocks from here on, in one draw
                    sizes = self._sizes
                    end, size = block, 0
                    while end < len(sizes) and (size < READ_AHEAD_TOKENS or end == block):
                        size += sizes[end]
                        end += 1
                    self._draw_from(block, size)
                else:
                    # NOTE: a block's first prompt draws the whole block (a read in order goes
                    # on in it); one further in, read out of order, only up to its end
                    self._draw_from(block, self._sizes[block] if offset == 0 else offset + n)
            a = g - self._lo
            kept = self._kept[a:a + n]
        if shared:
            return token_ints(self.vocab_size)[kept].tolist()
        return kept.tolist()


def lazy_prompts(rng: np.random.Generator, lengths: Iterable[Any],
                 vocab_size: int) -> list[Sequence[int]]:
    """`[random_tokens(rng, k, vocab_size) for k in lengths]`, each prompt a `LazyTokens`
    that draws its list when read (plain lists for a generator other than PCG64); `rng` moves
    on as those draws move it (one draw per block of `BLOCK_TOKENS`)."""
    if type(rng.bit_generator) is not np.random.PCG64:
        return [random_tokens(rng, int(k), vocab_size) for k in lengths]
    replay = _Replay(rng.bit_generator, vocab_size)
    sizes = [int(k) for k in lengths]
    out: list[Sequence[int]] = []
    i = 0
    while i < len(sizes):
        j, total = i, 0
        while j < len(sizes) and total < BLOCK_TOKENS:
            total += sizes[j]
            j += 1
        b = replay.add_block(total)
        offset = 0
        for k in sizes[i:j]:
            out.append(LazyTokens(replay, b, offset, k))
            offset += k
        rng.integers(FIRST_TOKEN_ID, vocab_size, size=total)  # the draws `random_tokens` make
        i = j
    return out
