"""What a hop shares with the turn before it, in the terms of ``heterofold.align``.

``shared_sections`` finds the pieces of the receiver's messages (paragraphs, so a message that
quotes the sender's context plus something new still shares the context) that appear verbatim in
the sender's turn, in order in both texts. ``reply_offsets`` gives the character span of each
generated token, which the engine does not report.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from heterofold.align import Section

MIN_PIECE_CHARS = 24  # shorter pieces (a word, a label) are not worth aligning


def shared_sections(sender_text: str, receiver_text: str, contents: Sequence[str]) -> list[Section]:
    sections: list[Section] = []
    s_at = r_at = 0
    for content in contents:
        for piece in content.split("\n\n"):
            piece = piece.strip()
            if len(piece) < MIN_PIECE_CHARS:
                continue
            r = receiver_text.find(piece, r_at)
            if r < 0:
                continue
            s = sender_text.find(piece, s_at)
            if s < 0:
                continue
            sections.append(Section(s, r, len(piece)))
            s_at, r_at = s + len(piece), r + len(piece)
    return sections


def reply_offsets(
    decode: Callable[[Sequence[int]], str], start: int, reply_ids: Sequence[int]
) -> tuple[str, list[tuple[int, int]]]:
    """The decoded reply and each reply token's span, counted from ``start`` (the prompt's length).
    A token that completes a multi-byte character owns the whole character; special tokens
    decode to nothing and own an empty span."""
    offsets: list[tuple[int, int]] = []
    before, text = 0, ""
    for i in range(len(reply_ids)):
        text = decode(reply_ids[: i + 1])
        offsets.append((start + min(before, len(text)), start + len(text)))
        before = len(text)
    return text, offsets
