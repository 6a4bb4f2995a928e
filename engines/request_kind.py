"""Does a request ask for one detail of the document, or for the document as a whole? A classifier
on static word vectors, trained on generic requests; no model runs.

The served ``auto`` path quotes the selector's spans when the question names its sentence (lexical
confidence, ``engines.selectors.names_its_sentence``). A paraphrased look-up ("who owns the
backpack?" over "the rucksack belongs to ...") names no sentence, and neither does "summarize
this": lexical confidence is near 0 for both, yet quoting answers the first best and the mapped
context with the spans recomputed in place carries the second best (BENCHMARKS.md, "Should
`auto`'s mapped branch quote?"). This classifier tells them apart from the request's words alone.

Features: the mean unit word vector (``engines.lexicon``: gemma3's input embedding table) over the
request's words, and the mean over its first two words (where "who", "which", "summarise", "write"
stand), each standardised by the training set's mean and spread. A logistic regression with an L2
penalty, fitted on ``engines.request_examples`` (generic requests, none of the evaluation suite's
wording) by L-BFGS from zeros: deterministic, 1-2 s on first use, then a table look-up and a dot
product per request (under 0.5 ms).

Leave-one-out on those 100 requests it reads 91 right, and 51 of 60 requests never fitted on
(``bench.request_heldout``; ``bench.request_kind`` measures both). What it misreads
has a shape: imperatives that ask for a detail ("Find the date of ...", "Look up the account
number ...") read as whole-document requests, and questions about the whole ("What is the overall
message?", "can you go on from there") as details.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from engines.lexicon import Lexicon, lexicon
from engines.request_examples import DETAIL, WHOLE

L2 = 1e-2  # penalty on the weights (not the bias), per example
LEAD = 2  # words at the start of a request that get their own mean
_WORD = re.compile(r"[A-Za-z]+(?:'[a-z]+)?")


def words(request: str) -> list[str]:
    """The request's words, case-folded (letters and an apostrophe clitic; digits and signs dropped)."""
    return [w.casefold() for w in _WORD.findall(request)]


def features(vectors: Lexicon, requests: Sequence[str]) -> torch.Tensor:
    """``(len(requests), 2 d)``: per request, the mean word vector and the mean of its first
    ``LEAD`` words (zeros for a request with no word)."""
    d = vectors.dim
    rows = []
    for r in requests:
        ws = words(r)
        if not ws:
            rows.append(torch.zeros(2 * d))
            continue
        v = vectors(ws)
        rows.append(torch.cat([v.mean(0), v[:LEAD].mean(0)]))
    return torch.stack(rows)


@dataclass(frozen=True)
class RequestKind:
    """A fitted classifier: ``p_detail`` is the probability that a request asks for one detail."""

    vectors: Lexicon
    mean: torch.Tensor  # (2 d,): the training features' mean and spread, which standardise a request's
    scale: torch.Tensor
    weight: torch.Tensor  # (2 d,), on standardised features
    bias: float

    @classmethod
    def fit(cls, vectors: Lexicon, detail: Sequence[str] = DETAIL, whole: Sequence[str] = WHOLE) -> RequestKind:
        x, y = _examples(vectors, detail, whole)
        return cls(vectors, *_fit_standardised(x, y))

    def p_detail(self, request: str) -> float:
        return _p(features(self.vectors, [request])[0], self.mean, self.scale, self.weight, self.bias)

    def asks_for_a_detail(self, request: str) -> bool:
        return self.p_detail(request) >= 0.5


def leave_one_out(
    vectors: Lexicon, detail: Sequence[str] = DETAIL, whole: Sequence[str] = WHOLE
) -> list[tuple[str, bool, float]]:
    """Each request scored by a classifier fitted on all the others (standardised on them too):
    ``(request, asks for a detail, p_detail)``. About 0.1 s a fit."""
    x, y = _examples(vectors, detail, whole)
    out = []
    for i, request in enumerate([*detail, *whole]):
        keep = torch.arange(len(y)) != i
        out.append((request, bool(y[i]), _p(x[i], *_fit_standardised(x[keep], y[keep]))))
    return out


def _examples(vectors: Lexicon, detail: Sequence[str], whole: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """Features (float64) and labels (1: a detail) of the training requests."""
    y = torch.tensor([1.0] * len(detail) + [0.0] * len(whole), dtype=torch.float64)
    return features(vectors, [*detail, *whole]).double(), y


def _fit_standardised(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, float]:
    """Mean and spread of ``x``'s columns, and the logistic fit on ``x`` standardised by them."""
    mean, scale = x.mean(0), x.std(0) + 1e-6
    w, b = fit_logistic((x - mean) / scale, y)
    return mean.float(), scale.float(), w.float(), b


def _p(x: torch.Tensor, mean: torch.Tensor, scale: torch.Tensor, weight: torch.Tensor, bias: float) -> float:
    """The probability of "detail" for one request's features."""
    return float(torch.sigmoid((x.float() - mean) / scale @ weight + bias))


def fit_logistic(x: torch.Tensor, y: torch.Tensor, l2: float = L2) -> tuple[torch.Tensor, float]:
    """Weights and bias minimising the mean logistic loss plus ``l2`` times the squared weights
    (float64 L-BFGS from zeros: the same data always gives the same fit)."""
    w = torch.zeros(x.shape[1], dtype=torch.float64, requires_grad=True)
    b = torch.zeros((), dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([w, b], lr=1.0, max_iter=500, tolerance_grad=1e-10, tolerance_change=1e-12,
                            line_search_fn="strong_wolfe")  # fmt: skip

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = torch.nn.functional.binary_cross_entropy_with_logits(x @ w + b, y) + l2 * (w @ w)
        loss.backward()
        return loss

    with torch.enable_grad():
        opt.step(closure)
    return w.detach(), float(b.detach())


_SHARED: dict[int, RequestKind] = {}
_LOCK = threading.Lock()


def request_kind(vectors: Lexicon | None = None) -> RequestKind:
    """The process's classifier over ``vectors`` (default: the shared ``engines.lexicon``), fitted
    on first use. Raises ``engines.lexicon.LexiconUnavailable`` when the embedder is not converted."""
    vectors = vectors or lexicon()
    with _LOCK:
        if id(vectors) not in _SHARED:
            _SHARED[id(vectors)] = RequestKind.fit(vectors)
        return _SHARED[id(vectors)]
