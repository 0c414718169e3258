"""Output text as it is produced: incremental detokenization and OpenAI's `stop` strings."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

#: what an unfinished UTF-8 sequence decodes to; such text is held back until it completes
_PARTIAL = "\ufffd"


@dataclass(slots=True)
class TextDelta:
    """What one step adds to a request's text.

    Args:
        text: new text to send (may be empty: held back, or a special token).
        stopped: a stop string appeared; the text ends before it and the request must end.
    """

    text: str
    stopped: bool = False


class TextStream:
    """Turns one request's output token ids into text deltas.

    Decodes a window of recent tokens (vLLM's prefix/read offsets) so each step costs the same
    however long the output is, holds back an unfinished UTF-8 character, and, with stop
    strings, holds back the last `len(longest stop) - 1` characters until it knows they do not
    start a stop string. The stop string itself is never sent (as OpenAI).

    Args:
        tokenizer: a Hugging Face tokenizer, or None: each token becomes `<id>` (a model
            without one, e.g. a simulated preset).
        stop: the stop strings (empty ones are ignored).
    """

    def __init__(self, tokenizer, stop: Sequence[str] = ()) -> None:
        self.tokenizer = tokenizer
        self.stop = [s for s in stop if s]
        self._hold = max((len(s) for s in self.stop), default=1) - 1
        self._ids: list[int] = []
        self._prefix = 0  # decode from here (context for the tokens after read)
        self._read = 0  # tokens already turned into text
        self.text = ""  # all text decoded so far
        self._sent = 0  # characters of `text` already sent

    @property
    def num_tokens(self) -> int:
        """Tokens fed so far."""
        return len(self._ids)

    def add(self, token_ids: Sequence[int], final: bool = False) -> TextDelta:
        """Feed new tokens; `final` flushes whatever is held back. Changes state.

        Returns:
            The text to send now; `stopped` when a stop string appeared (the text before it is
            included, nothing after it ever will be).
        """
        self._ids.extend(token_ids)
        self.text += self._decode_new(final)
        if self.stop:
            start = max(0, self._sent - self._hold)
            hits = [i for i in (self.text.find(s, start) for s in self.stop) if i >= 0]
            if hits:
                end = min(hits)
                out, self._sent = self.text[self._sent:end], end
                self.text = self.text[:end]
                return TextDelta(out, stopped=True)
        safe = len(self.text) if final else len(self.text) - self._hold
        if safe <= self._sent:
            return TextDelta("")
        out, self._sent = self.text[self._sent:safe], safe
        return TextDelta(out)

    def _decode_new(self, final: bool) -> str:
        ids = self._ids
        if self.tokenizer is None:
            new = "".join(f"<{t}>" for t in ids[self._read:])
            self._prefix = self._read = len(ids)
            return new
        decode = self.tokenizer.decode
        before = decode(ids[self._prefix:self._read], skip_special_tokens=True)
        after = decode(ids[self._prefix:], skip_special_tokens=True)
        if len(after) <= len(before) or (after.endswith(_PARTIAL) and not final):
            return ""  # nothing new yet, or half a character: wait for the next token
        self._prefix, self._read = self._read, len(ids)
        return after[len(before):]
