"""Question-aware choice of the receiver's context tokens: recomputed natively, or quoted as text.

After a cross-family transfer the receiver recomputes a small budget of context tokens through all
its layers; the rest keep their mapped KV (or, on the quote paths, the chosen spans are pasted as
text). The whole sentence that holds the answer must be chosen. The hop's new message (the
question) is known when the choice is made. This module is the text side of every selector
(``engines/selectors.py`` reads the models): sentences, a ``Ranker`` that orders them, and
``choose``, which turns a ranking and a budget into tokens. Rankers: ``lexical`` (below, steps
2-3; its ranking's confidence is ``coverage``), ``lexical_hop`` (lexical, then one feedback hop for
a chain of facts), ``meaning`` (lexical matching by the words' static embeddings, so a synonym matches),
``scored`` (one evidence score per token, e.g. attention, pooled over ``POOL``
neighbouring tokens; a sentence scores its best token), ``union`` (rankings interleaved) and
``gated`` (a union whose first ranker leads only when it is confident).
``select_tokens`` is ``choose`` with the lexical ranker:

1. Spans. ``sentence_spans`` cuts the context after ``.``, ``!`` or ``?`` that end a sentence
   (followed by whitespace or the end, so ``os.path`` and ``3.14`` stay whole) and at every
   newline. Spans are trimmed of whitespace; a span with no letter or digit is dropped; a span longer
   than ``MAX_SPAN_CHARS`` (about 40 tokens at about 4 characters a token) is cut into near-equal
   chunks at spaces.
2. Words. Text is case-folded and split on anything that is not a letter or digit (any script), so
   "Zoë's" gives "zoë" and "s". Stopwords (function words, question words, contraction pieces such
   as "s" and "t") are dropped, and a light suffix stemmer maps "lives", "lived", "living" and "live"
   to one stem. Digits are words like any other; nothing here knows what an answer looks like.
3. Score. Each span gets BM25 (k1 = 1.2, b = 0.75) over the question's distinct content words, with
   IDF over the context's spans.
4. Choose. Spans with a positive score are taken in descending score, ties to the earlier span, each
   adding every token whose character span overlaps it, until ``k`` tokens are chosen. The span that
   does not fit whole is taken in part: first its anchors (lexical: the tokens of its words that match
   the question; scored: its best token), then its other tokens nearest to those (ties to the earlier
   one); then the choice stops.
5. Leftover budget. Spans that score zero are never chosen as such. When every scoring span fits
   and budget is left, the remaining tokens are filled in by token distance to the nearest chosen
   token (ties to the earlier), which widens the context around each hit, as the passkey needle
   "... 48213. Remember it. 48213 ..." needs; if nothing scores, the most recent tokens are taken,
   as a tail window would.

``k = ceil(budget * len(offsets))`` (rounded to 9 decimals first, so 0.07 * 100 gives 7), raised to
``min_tokens``, and capped at the number of tokens with a non-empty span; tokens with an empty span,
such as BOS at (0, 0), are never chosen. A budget of 0 chooses nothing, whatever ``min_tokens``.
"""

from __future__ import annotations

import bisect
import math
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import torch

MAX_SPAN_CHARS = 160
POOL = 7  # tokens in the mean pooling of attention scores
BM25_K1 = 1.2
BM25_B = 0.75

_SENTENCE_END = re.compile(r"[.!?]+(?=\s|$)|\n")
_WORD = re.compile(r"[^\W_]+")
STOPWORDS = frozenset((  # function and question words, and the pieces contractions split into
    "a", "an", "the", "and", "or", "but", "nor", "not", "no", "yes", "of", "to", "in", "on", "at", "by", "for",
    "from", "with", "without", "into", "onto", "over", "under", "about", "as", "is", "are", "was", "were", "be",
    "been", "being", "am", "do", "does", "did", "done", "doing", "have", "has", "had", "having", "will", "would",
    "shall", "should", "can", "could", "may", "might", "must", "i", "me", "my", "mine", "you", "your", "yours",
    "he", "him", "his", "she", "her", "hers", "it", "its", "we", "us", "our", "ours", "they", "them", "their",
    "theirs", "this", "that", "these", "those", "there", "here", "what", "which", "who", "whom", "whose", "when",
    "where", "why", "how", "all", "any", "some", "if", "then", "than", "so", "too", "very", "just", "also", "again",
    "please", "s", "t", "d", "ll", "m", "re", "ve", "don", "doesn", "didn", "isn", "aren", "wasn", "weren", "won",
    "hasn", "haven", "hadn", "wouldn", "shouldn", "couldn", "cannot",
))  # fmt: skip


def sentence_spans(context: str) -> list[tuple[int, int]]:
    """Sorted, disjoint ``(start, end)`` character spans of the context's sentences (module docstring, step 1)."""
    spans: list[tuple[int, int]] = []
    start = 0
    for m in _SENTENCE_END.finditer(context):
        _add_span(context, start, m.end(), spans)
        start = m.end()
    _add_span(context, start, len(context), spans)
    return spans


def _add_span(context: str, start: int, end: int, spans: list[tuple[int, int]]) -> None:
    while end - start > MAX_SPAN_CHARS:
        ideal = start + (end - start) // math.ceil((end - start) / MAX_SPAN_CHARS)  # near-equal chunks
        cut = next((c for c in range(ideal, (start + ideal) // 2, -1) if context[c].isspace()), ideal)
        _add_trimmed(context, start, cut, spans)
        start = cut
    _add_trimmed(context, start, end, spans)


def _add_trimmed(context: str, start: int, end: int, spans: list[tuple[int, int]]) -> None:
    piece = context[start:end]
    start, end = start + len(piece) - len(piece.lstrip()), start + len(piece.rstrip())
    if start < end and _WORD.search(context, start, end):
        spans.append((start, end))


@dataclass(frozen=True)
class Spans:
    """The context cut into sentences, and the live tokens of each (what a ranking ranks)."""

    context: str
    offsets: Sequence[tuple[int, int]]
    live: list[int]  # tokens with a non-empty span
    spans: list[tuple[int, int]]
    tokens: list[list[int]]  # per span, the live tokens whose span overlaps it


@dataclass(frozen=True)
class Ranking:
    """Sentences worth reading, best first, each with the tokens to keep when only part fits."""

    order: list[int]  # span indices; spans that score nothing are left out
    anchors: dict[int, set[int]]
    confidence: float | None = None  # how sure the ranker is of its first sentence (lexical: coverage); None: unknown
    scores: list[float] | None = None  # per span, what it scored (``meaning``); None: not kept


Ranker = Callable[[Spans], Ranking]


def lexical(question: str) -> Ranker:
    """BM25 of each sentence for the question's content words (module docstring, steps 2-3);
    a sentence taken in part keeps its matched words first."""

    def rank(view: Spans) -> Ranking:
        words = [_words(view.context, s, e) for s, e in view.spans]
        query = {stem for stem, _, _ in _words(question, 0, len(question))}
        docs = [[stem for stem, _, _ in ws] for ws in words]
        scores = _bm25(docs, query)
        order = sorted((j for j, score in enumerate(scores) if score > 0), key=lambda j: (-scores[j], j))
        anchors = {}
        for j in order:
            matched = _tokens_per_span([(s, e) for stem, s, e in words[j] if stem in query], view.offsets, view.live)
            anchors[j] = {t for ts in matched for t in ts}
        return Ranking(order, anchors, coverage(docs, query, docs[order[0]]) if order else 0.0)

    return rank


def lexical_hop(question: str) -> Ranker:
    """``lexical``, then one hop: the sentences after its first are ranked again by BM25 for the
    question's stems together with the first sentence's own (pseudo-relevance feedback), so
    "In which city does Ana's cousin live?" reads "Ana's cousin is Ben." and then the sentence
    it points to, "Ben lives in Oslo.", which shares only "live" with the question. Confidence
    is ``lexical``'s."""
    first = lexical(question)

    def rank(view: Spans) -> Ranking:
        head = first(view)
        if not head.order:
            return head
        words = [_words(view.context, s, e) for s, e in view.spans]
        docs = [[stem for stem, _, _ in ws] for ws in words]
        top = head.order[0]
        query = {stem for stem, _, _ in _words(question, 0, len(question))} | set(docs[top])
        scores = _bm25(docs, query)
        rest = sorted((j for j, score in enumerate(scores) if score > 0 and j != top), key=lambda j: (-scores[j], j))
        anchors = {top: head.anchors[top]}
        for j in rest:
            matched = _tokens_per_span([(s, e) for stem, s, e in words[j] if stem in query], view.offsets, view.live)
            anchors[j] = {t for ts in matched for t in ts}
        return Ranking([top, *rest], anchors, head.confidence)

    return rank


WordVectors = Callable[[Sequence[str]], torch.Tensor]  # words -> (n, d) unit vectors


def meaning(question: str, vectors: WordVectors) -> Ranker:
    """Lexical matching by meaning: each content word of the question meets, in every sentence,
    the word closest to it by the cosine of their static embeddings (``vectors``; the same stem
    counts 1.0, a negative cosine 0), weighted by that word's IDF over the sentences; a sentence
    scores the IDF-weighted sum over the question's words (a word no sentence holds weighs most).
    "What is the code for the safe?" finds "To open the strongbox, enter 34344." through
    safe ~ strongbox, which BM25 cannot. A sentence taken in part keeps its matched words first.
    No model runs: a table look-up per distinct word."""

    def rank(view: Spans) -> Ranking:
        words = [_words(view.context, s, e) for s, e in view.spans]
        asked = sorted({(stem, question[s:e].casefold()) for stem, s, e in _words(question, 0, len(question))})
        seen: dict[str, str] = {}  # stem -> its first surface form in the context
        for ws in words:
            for stem, s, e in ws:
                seen.setdefault(stem, view.context[s:e].casefold())
        if not asked or not seen:
            return Ranking([], {})
        stems = list(seen)
        n = len(view.spans)
        df = Counter(stem for ws in words for stem in {w for w, _, _ in ws})
        idf = torch.tensor([math.log(1 + (n - df[st] + 0.5) / (df[st] + 0.5)) for st in stems], dtype=torch.float64)
        q_idf = torch.tensor([math.log(1 + (n - df.get(st, 0) + 0.5) / (df.get(st, 0) + 0.5)) for st, _ in asked],
                             dtype=torch.float64)  # fmt: skip
        sims = (vectors([w for _, w in asked]) @ vectors([seen[st] for st in stems]).T).double().clamp(min=0)
        column = {st: j for j, st in enumerate(stems)}
        for i, (st, _) in enumerate(asked):
            if st in column:
                sims[i, column[st]] = 1.0
        weighted = sims * idf  # (question words, context stems)
        pairs = sorted({(j, column[st]) for j, ws in enumerate(words) for st, _, _ in ws})
        span = torch.tensor([j for j, _ in pairs], dtype=torch.int64)
        values = weighted[:, [c for _, c in pairs]]  # (question words, distinct (sentence, stem) pairs)
        best = torch.zeros(len(asked), n, dtype=torch.float64).scatter_reduce(
            1, span.expand(len(asked), -1), values, "amax", include_self=True
        )  # per question word, its best match in each sentence
        scores = (best * q_idf[:, None]).sum(0).tolist()
        order = sorted((j for j, score in enumerate(scores) if score > 0), key=lambda j: (-scores[j], j))
        hits: dict[int, set[str]] = {}  # per sentence, the stems that are some question word's best match
        is_best = ((values == best[:, span]) & (values > 0)).any(0).tolist()
        for (j, c), hit in zip(pairs, is_best, strict=True):
            if hit:
                hits.setdefault(j, set()).add(stems[c])
        found = [(j, s, e) for j in sorted(hits) for st, s, e in words[j] if st in hits[j]]  # in text order
        anchors: dict[int, set[int]] = {j: set() for j in order}
        for (j, _, _), ts in zip(found, _tokens_per_span([(s, e) for _, s, e in found], view.offsets, view.live),
                                 strict=True):  # fmt: skip
            anchors[j].update(ts)  # one pass over the tokens for every sentence's matched words
        return Ranking(order, anchors, scores=scores)

    return rank


def scored(scores: Sequence[float], *, pool: int = POOL) -> Ranker:
    """Sentences by their best token, after a ``pool``-token mean over neighbouring live tokens
    (SnapKV's 1-D pooling): ``scores[i]`` is token i's evidence (an attention weight); a sentence
    taken in part keeps its best token first."""

    def rank(view: Spans) -> Ranking:
        if len(scores) != len(view.offsets):
            raise ValueError(f"{len(scores)} scores for {len(view.offsets)} tokens")
        live = torch.tensor([float(scores[t]) for t in view.live], dtype=torch.float64)
        pooled = torch.nn.functional.avg_pool1d(
            live[None, None], pool, stride=1, padding=pool // 2, count_include_pad=False
        )[0, 0][: len(view.live)] if len(view.live) else live  # fmt: skip
        at = {t: float(v) for t, v in zip(view.live, pooled.tolist(), strict=True)}
        best = {j: max(ts, key=lambda t: (at[t], -t)) for j, ts in enumerate(view.tokens) if ts}
        order = sorted((j for j, b in best.items() if at[b] > 0), key=lambda j: (-at[best[j]], j))
        return Ranking(order, {j: {best[j]} for j in order})

    return rank


def coverage(docs: list[list[str]], query: set[str], doc: list[str]) -> float:
    """The IDF-weighted share of the question's content stems that ``doc`` holds (IDF over
    ``docs``; a stem no document holds weighs most): 1.0 when the sentence says every word the
    question asks with, near 0 when it matches only a common word ("code" in a code base) and
    the question's rare words are nowhere (a paraphrase)."""
    if not query:
        return 0.0
    n = len(docs)
    df = Counter(stem for d in docs for stem in set(d) & query)
    idf = {stem: math.log(1 + (n - df[stem] + 0.5) / (df[stem] + 0.5)) for stem in query}
    total = sum(idf.values())
    return sum(idf[stem] for stem in set(doc) & query) / total if total else 0.0


GATE = 0.5  # the lexical coverage above which a gated union reads lexical's sentences first


def gated(first: Ranker, *rest: Ranker, threshold: float = GATE) -> Ranker:
    """``union(first, *rest)`` when ``first`` is confident of its first sentence (its ranking's
    ``confidence`` at least ``threshold``, or unknown), else ``union(*rest, first)``: at a budget
    that holds one or two sentences, the rule that can tell it knows the answer's sentence goes
    first, and the others lead when it cannot (a question that shares no content word with its
    answer)."""

    def rank(view: Spans) -> Ranking:
        head = first(view)
        confident = head.confidence is None or head.confidence >= threshold
        rankers = [lambda _v: head, *rest] if confident else [*rest, lambda _v: head]
        return replace(union(*rankers)(view), confidence=head.confidence)

    return rank


def union(*rankers: Ranker) -> Ranker:
    """The rankings interleaved, first choices first (round robin), each sentence once: the union
    of what the rankers would read, at the same budget."""

    def rank(view: Spans) -> Ranking:
        rankings = [r(view) for r in rankers]
        order: list[int] = []
        anchors: dict[int, set[int]] = {}
        for depth in range(max((len(r.order) for r in rankings), default=0)):
            for r in rankings:
                if depth < len(r.order) and r.order[depth] not in anchors:
                    j = r.order[depth]
                    order.append(j)
                    anchors[j] = set(r.anchors.get(j, ()))
        return Ranking(order, anchors)

    return rank


def select_tokens(
    context: str, offsets: Sequence[tuple[int, int]], question: str, budget: float, *, min_tokens: int = 0
) -> list[int]:
    """Sorted indices of the context tokens to recompute natively, at most ``k`` of them (module docstring).

    ``offsets[i]`` is token i's ``(start, end)`` character span in ``context``; tokens are expected in
    text order. Raises ``ValueError`` for a budget outside [0, 1], a negative ``min_tokens`` or a span
    outside the context.
    """
    return choose(context, offsets, budget, lexical(question), min_tokens=min_tokens)


def choose(
    context: str, offsets: Sequence[tuple[int, int]], budget: float, ranker: Ranker, *, min_tokens: int = 0
) -> list[int]:
    """Sorted indices of at most ``k`` tokens: the ranker's sentences, best first (module
    docstring, steps 4-5). ``select_tokens`` is ``choose`` with the ``lexical`` ranker."""
    if not 0.0 <= budget <= 1.0:
        raise ValueError(f"budget must be a fraction in [0, 1], got {budget}")
    if min_tokens < 0:
        raise ValueError(f"min_tokens must not be negative, got {min_tokens}")
    for i, (s, e) in enumerate(offsets):
        if not 0 <= s <= e <= len(context):
            raise ValueError(f"token {i} has span ({s}, {e}) outside a context of {len(context)} characters")
    view = spans_of(context, offsets)
    live = view.live
    if budget == 0.0 or not live:
        return []
    k = min(len(live), max(math.ceil(round(budget * len(offsets), 9)), min_tokens))
    ranking = ranker(view)

    chosen: set[int] = set()
    for j in ranking.order:
        new = [t for t in view.tokens[j] if t not in chosen]
        if len(chosen) + len(new) > k:  # take this span in part, around its anchors, and stop
            anchors = ranking.anchors.get(j) or {new[len(new) // 2]}
            chosen.update(_nearest(new, anchors, k - len(chosen)))
            return sorted(chosen)
        chosen.update(new)
    if not chosen:
        return live[-k:]
    chosen.update(_nearest([t for t in live if t not in chosen], chosen, k - len(chosen)))
    return sorted(chosen)


def spans_of(context: str, offsets: Sequence[tuple[int, int]]) -> Spans:
    """The view a ranker ranks: ``context``'s sentences and the live tokens of each."""
    live = [i for i, (s, e) in enumerate(offsets) if e > s]
    spans = sentence_spans(context)
    return Spans(context, offsets, live, spans, _tokens_per_span(spans, offsets, live))


def _words(text: str, start: int, end: int) -> list[tuple[str, int, int]]:
    """``(stem, start, end)`` of each content word of ``text[start:end]``, positions in ``text``."""
    out = []
    for m in _WORD.finditer(text, start, end):
        word = m.group().casefold()
        if word not in STOPWORDS:
            out.append((_stem(word), m.start(), m.end()))
    return out


def _stem(word: str) -> str:
    """A light suffix stemmer: plural and verb endings, so "cities"/"city" and "lives"/"lived"/"live" meet."""
    if len(word) > 4 and word.endswith("ies"):
        word = word[:-3] + "y"
    elif len(word) > 3 and word.endswith("s") and not word.endswith(("ss", "us", "is")):
        word = word[:-1]
    for suffix in ("ing", "ed"):
        if len(word) > len(suffix) + 2 and word.endswith(suffix):
            word = word[: -len(suffix)]
            break
    if len(word) > 3 and word.endswith("e"):
        word = word[:-1]
    return word


def _bm25(docs: list[list[str]], query: set[str]) -> list[float]:
    """BM25 of each document (a list of stems) for the distinct stems of ``query``, IDF over ``docs``."""
    n = len(docs)
    df = Counter(stem for doc in docs for stem in set(doc) & query)
    idf = {stem: math.log(1 + (n - count + 0.5) / (count + 0.5)) for stem, count in df.items()}
    avgdl = sum(map(len, docs)) / n if n else 0.0
    scores = []
    for doc in docs:
        norm = BM25_K1 * (1 - BM25_B + BM25_B * len(doc) / avgdl) if avgdl else BM25_K1
        tf = Counter(stem for stem in doc if stem in query)
        scores.append(sum(idf[stem] * f * (BM25_K1 + 1) / (f + norm) for stem, f in tf.items()))
    return scores


def _tokens_per_span(
    spans: Sequence[tuple[int, int]], offsets: Sequence[tuple[int, int]], live: list[int]
) -> list[list[int]]:
    """For each of the sorted, disjoint ``spans``, the tokens of ``live`` whose span overlaps it."""
    starts, ends = [s for s, _ in spans], [e for _, e in spans]
    out: list[list[int]] = [[] for _ in spans]
    for t in live:
        s, e = offsets[t]
        for j in range(bisect.bisect_right(ends, s), bisect.bisect_left(starts, e)):
            out[j].append(t)
    return out


def _nearest(candidates: list[int], anchors: set[int], n: int) -> list[int]:
    """The ``n`` candidates nearest (in token index) to any anchor, ties to the earlier token."""
    marks = sorted(anchors)

    def distance(t: int) -> int:
        i = bisect.bisect_left(marks, t)
        return min(abs(t - marks[j]) for j in (i - 1, i) if 0 <= j < len(marks))

    return sorted(candidates, key=lambda t: (distance(t), t))[:n]


QUOTE_SEPARATOR = "\n...\n"  # stands for the text left out between quoted spans


def elide(text: str, keep: Sequence[tuple[int, int]]) -> str:
    """``text`` reduced to the ``keep`` spans (in text order): spans that touch or are separated
    only by whitespace merge, each piece is trimmed, and the pieces are joined by
    ``QUOTE_SEPARATOR``, which stands for what was left out. The quote paths' text."""
    pieces: list[list[int]] = []
    for a, b in sorted(keep):
        if pieces and not text[pieces[-1][1] : a].strip():
            pieces[-1][1] = max(pieces[-1][1], b)
        else:
            pieces.append([a, b])
    return QUOTE_SEPARATOR.join(p for a, b in pieces if (p := text[a:b].strip()))


def quote_into(content: str, start: int, shared: Sequence[tuple[int, int]], quote: str) -> tuple[str, str]:
    """The map + quote paths' message: ``content`` (found at character ``start`` of the receiver's
    prompt; ``-1``: not found) with ``quote`` placed after the shared text it carries itself
    (``shared``: ``(receiver_start, length)`` of each section, in prompt characters; a document
    pasted with the question), else at its head. Returns the new content and the part of
    ``content`` before the quote: the only part of the message whose KV may be mapped, since the
    quote's tokens and all after it are prefilled natively. The gateway's hop and ``heterofold
    eval`` both build their quoted message here."""
    ends = [a + n - start for a, n in shared if start >= 0 and a >= start]
    cut = max((e for e in ends if e <= len(content)), default=0)
    if not quote:
        return content, content[:cut]
    if cut:
        return f"{content[:cut]}\n\n{quote}\n\n{content[cut:].lstrip()}", content[:cut]
    return f"{quote}\n\n{content}", ""


def answer_recall(context: str, answer: str, chosen: Sequence[tuple[int, int]]) -> tuple[bool, bool]:
    """Whether the chosen character spans cover (1) every character of some occurrence of
    ``answer`` in ``context`` (case-folded) and (2) every non-space character of a whole sentence
    (``sentence_spans``) that holds an occurrence: the answer-bearing sentence, read. Needs no
    model to judge. A blank answer, or one the context lacks, is recalled by nothing."""
    needle = answer.casefold().strip()
    if not needle:
        return False, False
    covered = bytearray(len(context) + 1)
    for a, b in chosen:
        covered[max(a, 0) : max(b, 0)] = b"\x01" * (max(b, 0) - max(a, 0))
    folded = context.casefold()
    spans = sentence_spans(context)
    value = sentence = False
    at = folded.find(needle)
    while at >= 0:
        end = at + len(needle)
        value = value or all(covered[at:end])
        for s, e in spans:
            if s <= at < e:
                sentence = sentence or all(covered[c] for c in range(s, e) if not context[c].isspace())
        at = folded.find(needle, at + 1)
    return value, sentence
