"""Selectors: which of the receiver's context tokens it must read natively (recompute) or as text (quote).

Every selector answers the same question through one interface, ``Selector.ranker``: given a hop
(``HopText``: both tokenizations, the shared sections, the new message) it returns a
``heterofold.select.Ranker`` over the context's sentences, and ``heterofold.select.choose`` turns a
ranking and a budget into token positions (whole sentences, best first). Names, as a role's
``policy.selector`` and ``--selector`` take them:

- ``lexical``: BM25 of each sentence for the question's words (``heterofold.select.lexical``);
- ``lexical-hop``: lexical, then the rest ranked again with the first sentence's words added
  (``heterofold.select.lexical_hop``): reads the second fact of a chain;
- ``meaning``: lexical matching by meaning (``heterofold.select.meaning``): a question word meets
  its closest word in each sentence by the cosine of their static embeddings (``engines.lexicon``,
  gemma3-270m's table read in place), so "safe" finds "strongbox"; no model runs;
- ``sender-attention``: the question, in the sender's tokens (``Question: ...`` then ``Answer:``),
  run by the sender over its own native cache; the last token's attention over the context,
  averaged over heads and over the sender's full-attention layers from a third of the depth up
  (each layer's weights renormalised over the context tokens), carried to receiver tokens by
  character offsets (a receiver token takes its best sender token), pooled over 7 tokens;
- ``receiver-attention``: the receiver's own prompt suffix (the question and the generation
  prompt) run by the receiver over the mapped cache with no recompute, the same read-out of its
  last token: needs the adapter (a first, map-only pass);
- ``scout``: a small embedded model (``SCOUT``, any zoo model) reads the shared text and the
  question natively and points by the same read-out: works where neither side exposes attention
  (SGLang), at the price of one prefill of the context by the scout;
- ``A+B``: the union of selectors A and B (their rankings interleaved, one sentence at a time),
  e.g. ``sender-attention+lexical``; a part the hop's engines cannot run
  is left out;
- ``A/B``: the gated union (``heterofold.select.gated``): A's sentences lead the interleaving when
  A is confident of its first one (lexical: the question's content words, IDF-weighted, covered
  at least ``GATE``), B's lead otherwise, e.g. ``lexical/sender-attention``;
- ``A|B``: A alone when it is confident, else B's sentences first and then A's: B reads only
  when A is unsure (a look-up costs lexical's time), e.g. ``lexical-hop|meaning`` (the
  gateway's default).

Candidates are the receiver's prompt tokens inside the shared sections that have a sender token and
a non-empty span, before the end of the transferable prefix; the text the rankers read is the
receiver's prompt from the first section's start to the last one's end.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, Literal, Protocol

import torch

from engines.base import Engine
from engines.lexicon import LexiconUnavailable, lexicon, use_zoo
from engines.request_kind import request_kind
from engines.zoo import Zoo
from heterofold.align import Section, align_tokens
from heterofold.errors import HeteroFoldError
from heterofold.kv import KVCache
from heterofold.select import GATE, Ranker, choose, gated, lexical, lexical_hop, meaning, scored, spans_of, union

SCOUT = "qwen2.5-coder-0.5b-instruct"
QUESTION_PROMPT = "\n\nQuestion: {question}\nAnswer:"  # what the sender reads after its own cache


class SelectorUnavailable(HeteroFoldError):
    """The selector needs attention (or a scout) that the engines of this hop do not expose."""


def transferable_prefix(receiver_offsets: Sequence[tuple[int, int]], sections: Sequence[Section]) -> int:
    """Receiver tokens before the first token that ends after the last shared section."""
    if not sections:
        return 0
    end = sections[-1].receiver_start + sections[-1].length
    for j, (_, b) in enumerate(receiver_offsets):
        if b > end:
            return j
    return len(receiver_offsets)


@dataclass(frozen=True)
class HopText:
    """One hop as the transfer and the selectors see it."""

    sender_kv: KVCache
    sender_text: str
    sender_offsets: Sequence[tuple[int, int]]  # at least the tokens of sender_kv
    receiver_text: str
    receiver_ids: Sequence[int]
    receiver_offsets: Sequence[tuple[int, int]]
    sections: Sequence[Section]  # shared text, sender_start / receiver_start in the two texts
    question: str  # the hop's new message

    def transferable_prefix(self) -> int:
        return transferable_prefix(self.receiver_offsets, self.sections)

    def source(self, prefix: int) -> torch.Tensor:
        """``(prefix,)``: the sender token of each receiver token, -1 where none (or past the sender's KV)."""
        src = align_tokens(self.sender_offsets, self.receiver_offsets[:prefix], self.sections)
        src[src >= self.sender_kv.num_tokens] = -1
        return src

    def window(self) -> tuple[int, int]:
        """Receiver characters from the first section's start to the last one's end."""
        last = self.sections[-1]
        return self.sections[0].receiver_start, last.receiver_start + last.length


@dataclass(frozen=True)
class Evidence:
    """What a selector may read besides the text: the engines, and the mapped cache when built."""

    hop: HopText
    candidates: list[int]  # receiver positions that may be chosen
    sender: Engine | None = None
    receiver: Engine | None = None
    mapped: KVCache | None = None  # the receiver's map-only KV over the prefix
    scout: Engine | None = None


class Selector(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def needs_map(self) -> bool:  # reads the mapped cache (the transfer builds it first)
        ...

    async def ranker(self, ev: Evidence) -> Ranker: ...


@dataclass(frozen=True)
class Lexical:
    name: str = "lexical"
    needs_map: bool = False

    async def ranker(self, ev: Evidence) -> Ranker:
        return lexical(ev.hop.question)


@dataclass(frozen=True)
class LexicalHop:
    name: str = "lexical-hop"
    needs_map: bool = False

    async def ranker(self, ev: Evidence) -> Ranker:
        return lexical_hop(ev.hop.question)


@dataclass(frozen=True)
class Meaning:
    name: str = "meaning"
    needs_map: bool = False

    async def ranker(self, ev: Evidence) -> Ranker:
        try:
            vectors = lexicon()
        except LexiconUnavailable as exc:
            raise SelectorUnavailable(str(exc)) from exc
        return meaning(ev.hop.question, vectors)


@dataclass(frozen=True)
class SenderAttention:
    name: str = "sender-attention"
    needs_map: bool = False

    async def ranker(self, ev: Evidence) -> Ranker:
        return scored(await self.token_scores(ev))

    async def token_scores(self, ev: Evidence) -> list[float]:
        """One attention weight per candidate, in order (the module docstring's read-out)."""
        sender, hop = ev.sender, ev.hop
        if sender is None or not hasattr(sender, "attention"):
            raise SelectorUnavailable("sender-attention needs a sender engine that exposes attention (embedded)")
        past = hop.sender_kv
        asked = sender.encode(QUESTION_PROMPT.format(question=hop.question), add_special_tokens=False).ids
        weights = await sender.attention([*past.token_ids.tolist(), *asked], past=past)  # (L, 1, S)
        n = past.num_tokens
        shift = [(s.sender_start, s.receiver_start, s.length) for s in hop.sections]
        reader = [_shifted(hop.sender_offsets[t], shift) for t in range(n)]
        per_reader = _layer_mean(weights[:, -1, :n], [t for t, span in enumerate(reader) if span])
        return _to_receiver(reader, per_reader.tolist(), hop.receiver_offsets, ev.candidates)


@dataclass(frozen=True)
class ReceiverAttention:
    name: str = "receiver-attention"
    needs_map: bool = True

    async def ranker(self, ev: Evidence) -> Ranker:
        receiver, hop = ev.receiver, ev.hop
        if receiver is None or not hasattr(receiver, "attention") or ev.mapped is None:
            raise SelectorUnavailable("receiver-attention needs an embedded receiver and the mapped cache")
        weights = await receiver.attention(list(hop.receiver_ids), past=ev.mapped)  # (L, 1, T_r)
        per_token = _layer_mean(weights[:, -1, :], ev.candidates).tolist()
        return scored([per_token[j] for j in ev.candidates])


@dataclass(frozen=True)
class Scout:
    name: str = "scout"
    needs_map: bool = False

    async def ranker(self, ev: Evidence) -> Ranker:
        scout, hop = ev.scout, ev.hop
        if scout is None or not hasattr(scout, "attention"):
            raise SelectorUnavailable(f"the scout selector needs an embedded scout model ({SCOUT})")
        pieces = [hop.receiver_text[s.receiver_start : s.receiver_start + s.length] for s in hop.sections]
        text = scout.render([{"role": "user", "content": "\n\n".join(pieces) + f"\n\nQuestion: {hop.question}"}])
        text += " Answer:" if text.endswith(":") else "Answer:"
        shift, at = [], 0
        for s, piece in zip(hop.sections, pieces, strict=True):
            at = text.index(piece, at)
            shift.append((at, s.receiver_start, s.length))
            at += len(piece)
        enc = scout.encode(text)
        weights = await scout.attention(list(enc.ids))  # (L, 1, S)
        reader = [_shifted(span, shift) for span in enc.offsets]
        per_reader = _layer_mean(weights[:, -1, :], [t for t, span in enumerate(reader) if span])
        return scored(_to_receiver(reader, per_reader.tolist(), hop.receiver_offsets, ev.candidates))


@dataclass(frozen=True)
class _Joined:
    """Selectors made of parts (``Union``, ``Gated``, ``Fallback``), named by joining the parts'
    names with ``SEP``."""

    parts: tuple[Selector, ...]
    SEP: ClassVar[str] = "+"

    @property
    def name(self) -> str:
        return self.SEP.join(p.name for p in self.parts)

    @property
    def needs_map(self) -> bool:
        return any(p.needs_map for p in self.parts)

    async def _rest(self, ev: Evidence) -> Ranker | None:
        """The parts after the first as one ranker (their union), or None when none can run here."""
        try:
            return await (Union(self.parts[1:]) if len(self.parts) > 2 else self.parts[1]).ranker(ev)
        except SelectorUnavailable:
            return None


@dataclass(frozen=True)
class Union(_Joined):
    async def ranker(self, ev: Evidence) -> Ranker:
        """The parts' rankings interleaved; a part this hop cannot run (an SGLang sender for
        sender-attention) is left out, so ``sender-attention+lexical`` is lexical there. Raises
        ``SelectorUnavailable`` only when no part can run."""
        rankers, missing = [], []
        for p in self.parts:
            try:
                rankers.append(await p.ranker(ev))
            except SelectorUnavailable as exc:
                missing.append(str(exc))
        if not rankers:
            raise SelectorUnavailable("; ".join(missing))
        return union(*rankers)


@dataclass(frozen=True)
class Gated(_Joined):
    SEP: ClassVar[str] = "/"  # the first part's confidence decides the order

    async def ranker(self, ev: Evidence) -> Ranker:
        """``heterofold.select.gated`` over the parts' rankings; a part this hop cannot run is left
        out as in ``Union`` (with no part after the first, the first alone)."""
        first = await self.parts[0].ranker(ev)
        rest = await self._rest(ev)
        return first if rest is None else gated(first, rest)


@dataclass(frozen=True)
class Fallback(_Joined):
    SEP: ClassVar[str] = "|"  # the first part is read always, the others only when it is unsure

    async def ranker(self, ev: Evidence) -> Ranker:
        """The first part alone when it is confident of its first sentence on this hop's text
        (``GATE``; the others never read, so a look-up costs what lexical costs), else the
        others' rankings interleaved ahead of it (``Union``, leaving out a part the hop cannot
        run; with none left, the first alone)."""
        first = await self.parts[0].ranker(ev)
        text, offsets = window(ev)
        confidence = first(spans_of(text, offsets)).confidence
        if confidence is None or confidence >= GATE:
            return first
        rest = await self._rest(ev)
        return first if rest is None else union(rest, first)


LEXICAL = Lexical()
BASIC: dict[str, Selector] = {
    s.name: s for s in (Lexical(), LexicalHop(), Meaning(), SenderAttention(), ReceiverAttention(), Scout())
}
SELECTORS = (*BASIC, "sender-attention+receiver-attention", "sender-attention+lexical", "receiver-attention+lexical",
             "lexical/sender-attention", "lexical-hop/sender-attention", "lexical-hop|sender-attention",
             "lexical-hop|meaning", "lexical-hop|meaning|sender-attention")  # fmt: skip


def make_selector(name: str) -> Selector:
    """A selector by name: one of ``BASIC``, several joined by ``+`` (their union), or by ``/``
    (the gated union, the first part's confidence deciding the order)."""
    for sep, kind in (("/", Gated), ("|", Fallback)):
        if sep not in name:
            continue
        if sum(other in name for other in "+/|") > 1:
            raise ValueError(f"unknown selector {name!r}: join parts with one of '+', '/', '|'")
        names = name.split(sep)
        unknown = [n for n in names if n not in BASIC]
        if unknown or len(set(names)) != len(names) or len(names) < 2:
            raise ValueError(f"unknown selector {name!r}: choose from {', '.join(BASIC)}, joined by {sep!r}")
        return kind(tuple(BASIC[n] for n in names))
    names = name.split("+")
    unknown = [n for n in names if n not in BASIC]
    if unknown or len(set(names)) != len(names):
        raise ValueError(f"unknown selector {name!r}: choose from {', '.join(BASIC)}, or join them with '+'")
    return BASIC[name] if len(names) == 1 else Union(tuple(BASIC[n] for n in names))


def warm(name: str, zoo: Zoo | None = None, *, auto: bool = False) -> None:
    """Load what selector ``name`` reads lazily (the meaning selector's table, about 3 s) now, so no
    hop or timed item pays for it; with ``auto``, the ``auto`` path's request classifier too
    (gemma3-270m's first 9 layers, and the fit, a few seconds). A model that is missing is left to
    the hop to report. ``zoo``: where the table and model are read from, for every later hop too
    (default ``Zoo()``)."""
    if zoo is not None:
        use_zoo(zoo)
    if "meaning" in name.replace("|", "+").replace("/", "+").split("+") or auto:
        with contextlib.suppress(LexiconUnavailable):
            lexicon()
            if auto:
                request_kind()


@dataclass(frozen=True)
class Selection:
    positions: list[int]  # receiver prompt positions, sorted
    ms: float  # the selector's own time (reads and ranking)


def candidates(hop: HopText, prefix: int) -> list[int]:
    """The prefix positions a selector may choose: every receiver token with text inside the shared
    sections' window, those with no sender token included. Those are recomputed on every hop anyway
    (``engines.transfer``), but a sentence is only whole, to be quoted or counted as read, with them:
    qwen2.5's ".\n\n" holds a sentence's final "." and has no sender token."""
    lo, hi = hop.window()
    return [
        j for j in range(prefix)
        if hop.receiver_offsets[j][1] > hop.receiver_offsets[j][0]
        and lo <= hop.receiver_offsets[j][0] and hop.receiver_offsets[j][1] <= hi
    ]  # fmt: skip


async def select(selector: Selector, ev: Evidence, budget: float) -> Selection:
    """The selector's choice at ``budget`` (a share of the candidates), as receiver positions."""
    t0 = time.perf_counter()
    if budget <= 0 or not ev.candidates:
        return Selection([], 0.0)
    ranker = await selector.ranker(ev)
    return choose_with(ranker, ev, budget, t0)


def choose_with(ranker: Ranker, ev: Evidence, budget: float, t0: float | None = None) -> Selection:
    """``heterofold.select.choose`` over the candidates with a ranker made already (a bench reads
    attention once and chooses at several budgets); ``ms`` counts from ``t0`` when given."""
    t1 = time.perf_counter()
    if budget <= 0 or not ev.candidates:
        return Selection([], 0.0)
    text, rel = window(ev)
    picked = choose(text, rel, budget, ranker)
    return Selection([ev.candidates[i] for i in picked], (time.perf_counter() - (t1 if t0 is None else t0)) * 1000)


def lexical_confidence(ev: Evidence) -> float:
    """How sure lexical is of one sentence of the shared text for the hop's question: the
    IDF-weighted share of the question's content words its best sentence holds
    (``heterofold.select.coverage``; 0.0 with no candidates or no sentence matching). Lexical
    alone; no model runs."""
    if not ev.candidates:
        return 0.0
    text, offsets = window(ev)
    return lexical(ev.hop.question)(spans_of(text, offsets)).confidence or 0.0


def names_its_sentence(ev: Evidence) -> bool:
    """The question names the sentence that answers it (lexical confidence at least ``GATE``): a
    look-up, which the chosen spans quoted as text answer as well as any mapped path, and faster;
    below ``GATE`` (a paraphrase, "summarize this", "go on") the mapped context carries what the
    spans miss (BENCHMARKS.md, "One path per hop"). The ``auto`` path's rule (gateway/hop.py)."""
    return lexical_confidence(ev) >= GATE


def auto_path(ev: Evidence) -> Literal["quote", "transfer", "map_quote"]:
    """The ``auto`` path's choice for a hop (gateway/hop.py):

    - ``quote`` when the question names the sentence that answers it (``names_its_sentence``), or
      when it asks for one detail of the document though naming no sentence, a paraphrased
      look-up (``engines.request_kind``: a classifier on gemma3-270m's reading of the request,
      fitted on generic requests; run only for the hops that name no sentence): quoting answers
      those best, and fastest;
    - ``transfer`` otherwise ("summarize", "go on"): the mapped context with the spans recomputed
      in place carries the whole context closest to native (BENCHMARKS.md, "Should `auto`'s mapped
      branch quote?");
    - ``map_quote`` when the classifier's model is not in the zoo cache (the rule before it:
      every hop that names no sentence is mapped, with its spans quoted).
    """
    if names_its_sentence(ev):
        return "quote"
    try:
        kind = request_kind()
    except LexiconUnavailable:
        return "map_quote"
    return "quote" if kind.asks_for_a_detail(ev.hop.question) else "transfer"


def window(ev: Evidence) -> tuple[str, list[tuple[int, int]]]:
    """The text the rankers read (the receiver's prompt over the shared sections) and each
    candidate's character span in it."""
    lo, hi = ev.hop.window()
    return ev.hop.receiver_text[lo:hi], [(ev.hop.receiver_offsets[j][0] - lo, ev.hop.receiver_offsets[j][1] - lo)
                                         for j in ev.candidates]  # fmt: skip


def _shifted(span: tuple[int, int], shift: Sequence[tuple[int, int, int]]) -> tuple[int, int] | None:
    """A reader's character span carried into the receiver's text through the shared sections."""
    a, b = span
    for r0, t0, n in shift:
        if r0 <= a and b <= r0 + n and b > a:
            return a - r0 + t0, b - r0 + t0
    return None


def _layer_mean(weights: torch.Tensor, columns: list[int]) -> torch.Tensor:
    """``(L, S)`` attention rows -> ``(S,)``: each layer renormalised over ``columns`` (others 0), averaged."""
    keep = torch.zeros(weights.shape[-1], dtype=torch.bool)
    keep[columns] = True
    w = weights.float() * keep
    w = w / w.sum(-1, keepdim=True).clamp_min(1e-12)
    return w.mean(0)


def _to_receiver(
    reader: Sequence[tuple[int, int] | None],
    scores: Sequence[float],
    receiver_offsets: Sequence[tuple[int, int]],
    cands: list[int],
) -> list[float]:
    """One score per candidate (in order): the best score of the reader tokens its span overlaps."""
    char: dict[int, float] = {}
    for t, span in enumerate(reader):
        if span:
            for c in range(*span):
                char[c] = max(char.get(c, 0.0), scores[t])
    return [max((char.get(c, 0.0) for c in range(*receiver_offsets[j])), default=0.0) for j in cands]
