"""Incremental detokenization with stop sequences, for streaming.

Text is released only once it is final: not while the last token ends inside a multi-byte
character, and not while the tail could still turn into a stop sequence.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence


class Detokenizer:
    def __init__(self, decode: Callable[[Sequence[int]], str], stops: Sequence[str]) -> None:
        self._decode = decode
        self._stops = tuple(stops)
        self._ids: list[int] = []
        self._sent = 0  # characters of the decoded text already released
        self.stopped = False
        self.text = ""  # the final text so far, without any stop sequence

    def push(self, token_id: int) -> str:
        """Add one token; return the text it makes final. Sets ``stopped`` on a stop sequence."""
        self._ids.append(token_id)
        text = self._decode(self._ids)
        cut = min((i for i in (text.find(s) for s in self._stops) if i >= 0), default=-1)
        if cut >= 0:
            self.stopped = True
            return self._release(text[:cut], len(text[:cut]))
        end = len(text)
        if text.endswith("\ufffd"):  # a character still being spelled out byte by byte
            end = len(text.rstrip("\ufffd"))
        end -= self._pending_stop(text[:end])
        return self._release(text, end)

    def flush(self) -> str:
        """Release whatever is held back; call when generation ends without a stop sequence."""
        if self.stopped:
            return ""
        text = self._decode(self._ids)
        return self._release(text, len(text))

    def _pending_stop(self, text: str) -> int:
        """Length of the longest tail of ``text`` that begins some stop sequence."""
        best = 0
        for s in self._stops:
            for n in range(min(len(s) - 1, len(text)), best, -1):
                if text.endswith(s[:n]):
                    best = n
                    break
        return best

    def _release(self, text: str, end: int) -> str:
        end = max(end, self._sent)
        delta = text[self._sent : end]
        self._sent = end
        self.text = text[:end]
        return delta
