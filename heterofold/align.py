"""Alignment between a sender and a receiver: tokens by character offsets, layers by relative depth.

Tokens. Both prompts are rendered from the same messages with different templates (ChatML, the
plain template, BOS or not), so alignment goes section by section: a ``Section`` is one piece of
text (a paragraph of a message, ``shared_sections``) that appears verbatim in both prompts. Receiver token j takes the
sender token whose character span covers j's last character, mapped through its section.
Receiver tokens outside every section (BOS, role markers, template newlines) have no sender
token (-1); the transfer recomputes them natively, which is cheap (a few per message) and exact.

Layers. Receiver layer l sits at relative depth (l + 0.5) / L_r; it reads a window of the
``width`` sender layers nearest that depth, among the sender layers that hold every token (a
sender's sliding-window layers keep only their last window, so they are not eligible).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from heterofold.errors import AdapterError

MIN_PIECE_CHARS = 24  # shorter pieces (a word, a label) are not worth aligning


@dataclass(frozen=True)
class Section:
    sender_start: int  # character offset in the sender's prompt text
    receiver_start: int  # character offset in the receiver's prompt text
    length: int


def shared_sections(
    sender_text: str, receiver_text: str, contents: Sequence[str], *, min_chars: int = MIN_PIECE_CHARS
) -> list[Section]:
    """The pieces of ``contents`` (the receiver's messages, in order) that appear verbatim in both
    prompt texts, in order in both. A message is cut into paragraphs (at blank lines, each trimmed),
    so a message that quotes the sender's context plus something new still shares the context;
    pieces shorter than ``min_chars`` (a word, a label) are not worth aligning. The one sections
    function: the gateway's hop, ``heterofold eval``, the benches and distillation all use it."""
    sections: list[Section] = []
    s_at = r_at = 0
    for content in contents:
        for piece in content.split("\n\n"):
            piece = piece.strip()
            if len(piece) < min_chars:
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


def _char_owner(offsets: Sequence[tuple[int, int]], n_chars: int) -> torch.Tensor:
    """``(n_chars,)``: index of the token whose span covers each character, -1 where none."""
    owner = torch.full((n_chars + 1,), -1, dtype=torch.int64)
    if not offsets:
        return owner
    spans = torch.tensor(offsets, dtype=torch.int64).reshape(-1, 2)  # (T, 2)
    lengths = (spans[:, 1] - spans[:, 0]).clamp(min=0)  # (T,)
    token = torch.repeat_interleave(torch.arange(len(spans)), lengths)  # (chars,)
    first = torch.cumsum(lengths, 0) - lengths  # index in ``token`` where each span begins
    chars = spans[token, 0] + torch.arange(token.numel()) - first[token]
    owner[chars] = token  # overlapping spans: the later token wins, as in a left-to-right scan
    return owner


def align_tokens(
    sender_offsets: Sequence[tuple[int, int]],
    receiver_offsets: Sequence[tuple[int, int]],
    sections: Sequence[Section],
) -> torch.Tensor:
    """``(T_r,)`` int64: the sender token index for each receiver token, or -1."""
    n_chars = max([b for _, b in sender_offsets] + [s.sender_start + s.length for s in sections] + [0])
    owner = _char_owner(sender_offsets, n_chars)
    ends = torch.tensor([b for _, b in receiver_offsets], dtype=torch.int64) - 1  # last character
    empty = torch.tensor([b <= a for a, b in receiver_offsets], dtype=torch.bool)
    out = torch.full((len(receiver_offsets),), -1, dtype=torch.int64)
    for sec in sections:
        inside = (ends >= sec.receiver_start) & (ends < sec.receiver_start + sec.length) & ~empty
        sender_chars = ends[inside] - sec.receiver_start + sec.sender_start
        out[inside] = owner[sender_chars]
    return out


def align_layers(
    receiver_layers: int, sender_layers: int, eligible: Sequence[int] | None = None, width: int = 3
) -> list[list[int]]:
    """For each receiver layer, the ``width`` eligible sender layers nearest its relative depth,
    in ascending order."""
    pool = list(range(sender_layers)) if eligible is None else sorted(eligible)
    if not pool:
        raise AdapterError("no sender layer holds every token")
    width = min(width, len(pool))
    out = []
    for layer in range(receiver_layers):
        depth = (layer + 0.5) / receiver_layers * sender_layers - 0.5  # in sender layer units
        nearest = sorted(pool, key=lambda s: (abs(s - depth), s))[:width]
        out.append(sorted(nearest))
    return out
