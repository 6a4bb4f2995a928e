"""Does a request ask for one detail of the document, or for the document as a whole? A classifier
on a small model's reading of the request, trained on generic requests.

The served ``auto`` path quotes the selector's spans when the question names its sentence (lexical
confidence, ``engines.selectors.names_its_sentence``). A paraphrased look-up ("who owns the
backpack?" over "the rucksack belongs to ...") names no sentence, and neither does "summarize
this": lexical confidence is near 0 for both, yet quoting answers the first best and the mapped
context with the spans recomputed in place carries the second best (BENCHMARKS.md, "Should
`auto`'s mapped branch quote?"). This classifier tells them apart from the request alone.

Features (a ``Reader``), standardised by the training set's mean and spread:

- ``HiddenReader`` (served): the mean over the request's tokens of the output of layer ``LAYER``
  (9, the middle) of gemma3-270m, the zoo model whose embedding table the meaning selector already
  reads (``engines.lexicon.EMBEDDER``). The layers above it and the LM head never run. In
  bfloat16 where the CPU has native bfloat16 (as the maps run), about 18 ms a request on this CPU
  (two threads; 25-49 ms in float32, which reads the same requests right; ``bench.request_kind``).
- ``WordReader``: the mean unit word vector of the request (``engines.lexicon``) and the mean over
  its first two words; no model run, under 0.5 ms. Kept to measure against: it misreads
  imperatives that ask for a detail ("Grab the license key ...") and questions about the whole
  ("What is the tone of the letter?").

A logistic regression with an L2 penalty, fitted on ``engines.request_examples`` (generic requests,
none of the evaluation suite's wording) by L-BFGS from zeros: deterministic, a few seconds on first
use. Measured by ``bench.request_kind`` on requests never fitted on (BENCHMARKS.md, "Should
`auto`'s mapped branch quote?").
"""

from __future__ import annotations

import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from engines.catalog import lookup
from engines.lexicon import EMBEDDER, Lexicon, LexiconUnavailable, configured_zoo
from engines.request_examples import DETAIL, WHOLE
from engines.zoo import Zoo

L2 = 1e-2  # penalty on the weights (not the bias), per example
LEAD = 2  # WordReader: words at the start of a request that get their own mean
LAYER = 9  # HiddenReader: the layer whose output is read (of gemma3-270m's 18: the middle)
_WORD = re.compile(r"[A-Za-z]+(?:'[a-z]+)?")


def words(request: str) -> list[str]:
    """The request's words, case-folded (letters and an apostrophe clitic; digits and signs dropped)."""
    return [w.casefold() for w in _WORD.findall(request)]


class Reader(Protocol):
    """Turns requests into feature rows ``(len(requests), d)``."""

    name: str

    def __call__(self, requests: Sequence[str]) -> torch.Tensor: ...


class WordReader:
    """Per request, the mean word vector and the mean of its first ``LEAD`` words (zeros for a
    request with no word): ``(n, 2 d)``."""

    def __init__(self, vectors: Lexicon) -> None:
        self.vectors = vectors
        self.name = f"words:{vectors.name}"

    def __call__(self, requests: Sequence[str]) -> torch.Tensor:
        d = self.vectors.dim
        rows = []
        for r in requests:
            ws = words(r)
            if not ws:
                rows.append(torch.zeros(2 * d))
                continue
            v = self.vectors(ws)
            rows.append(torch.cat([v.mean(0), v[:LEAD].mean(0)]))
        return torch.stack(rows)


class HiddenReader:
    """Per request, the mean over its tokens (the tokenizer's own, BOS included) of the output of
    decoder layer ``layer`` of a zoo model: ``(n, hidden)``. Only the first ``layer`` decoder
    layers are kept; the rest of the model is dropped at load. Thread-safe (one request at a time)."""

    def __init__(self, decoder: Any, tokenizer: Any, layer: int, name: str) -> None:
        self.dtype = next(decoder.parameters()).dtype
        self.name = f"hidden:{name}:{layer}:{str(self.dtype).removeprefix('torch.')}"
        self.layer = layer
        self._decoder = decoder
        self._tok = tokenizer
        self._lock = threading.Lock()
        self._out: list[torch.Tensor] = []

        def keep(_module: Any, _inputs: Any, output: Any) -> None:
            self._out.append(output[0] if isinstance(output, tuple) else output)

        decoder.layers[layer - 1].register_forward_hook(keep)

    @classmethod
    def from_zoo(
        cls, zoo: Zoo | None = None, name: str = EMBEDDER, layer: int = LAYER, dtype: torch.dtype | None = None
    ) -> HiddenReader:
        """Load ``name``'s first ``layer`` decoder layers from the zoo cache (a second or two), in
        ``dtype`` (default: the maps' rule, ``heterofold.adapter.map_dtype``: bfloat16 where the CPU
        has native bfloat16 dot products, float32 elsewhere). Raises ``LexiconUnavailable`` when
        the model is not converted."""
        from engines.loader import load_converted
        from heterofold.adapter import map_dtype

        zoo = zoo or configured_zoo()
        entry = lookup(name)
        if not zoo.is_converted(entry):
            raise LexiconUnavailable(
                f"the auto path's request classifier reads {name}; run: heterofold models pull {name}"
            )
        loaded = load_converted(zoo.model_dir(entry), zoo.manifest(entry))
        decoder = loaded.model.model
        if not 1 <= layer <= len(decoder.layers):
            raise ValueError(f"{name} has {len(decoder.layers)} decoder layers; layer must be 1..{len(decoder.layers)}")
        decoder.layers = torch.nn.ModuleList(list(decoder.layers)[:layer])
        decoder.requires_grad_(False)
        decoder.to(dtype or map_dtype(torch.device("cpu")))
        return cls(decoder, loaded.tokenizer, layer, name)

    def __call__(self, requests: Sequence[str]) -> torch.Tensor:
        rows = []
        with self._lock, torch.inference_mode():
            for r in requests:
                ids = self._tok(r, return_tensors="pt").input_ids
                self._out.clear()
                self._decoder(input_ids=ids, use_cache=False)
                rows.append(self._out[-1][0].float().mean(0))
        return torch.stack(rows)


@dataclass(frozen=True)
class RequestKind:
    """A fitted classifier: ``p_detail`` is the probability that a request asks for one detail."""

    reader: Reader
    mean: torch.Tensor  # (d,): the training features' mean and spread, which standardise a request's
    scale: torch.Tensor
    weight: torch.Tensor  # (d,), on standardised features
    bias: float

    @classmethod
    def fit(cls, reader: Reader, detail: Sequence[str] = DETAIL, whole: Sequence[str] = WHOLE) -> RequestKind:
        x, y = _examples(reader, detail, whole)
        return cls(reader, *_fit_standardised(x, y))

    def p_detail(self, request: str) -> float:
        return _p(self.reader([request])[0], self.mean, self.scale, self.weight, self.bias)

    def asks_for_a_detail(self, request: str) -> bool:
        return self.p_detail(request) >= 0.5


def leave_one_out(
    reader: Reader, detail: Sequence[str] = DETAIL, whole: Sequence[str] = WHOLE
) -> list[tuple[str, bool, float]]:
    """Each request scored by a classifier fitted on all the others (standardised on them too):
    ``(request, asks for a detail, p_detail)``. About 0.1 s a fit."""
    x, y = _examples(reader, detail, whole)
    out = []
    for i, request in enumerate([*detail, *whole]):
        keep = torch.arange(len(y)) != i
        out.append((request, bool(y[i]), _p(x[i], *_fit_standardised(x[keep], y[keep]))))
    return out


def _examples(reader: Reader, detail: Sequence[str], whole: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """Features (float64) and labels (1: a detail) of the training requests."""
    y = torch.tensor([1.0] * len(detail) + [0.0] * len(whole), dtype=torch.float64)
    return reader([*detail, *whole]).double(), y


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


_SHARED: dict[object, RequestKind] = {}
_READERS: dict[tuple[object, str, int], HiddenReader] = {}
_LOCK = threading.Lock()


def hidden_reader(zoo: Zoo | None = None, name: str = EMBEDDER, layer: int = LAYER) -> HiddenReader:
    """The process's one ``HiddenReader`` for this zoo cache, model and layer (loaded on first use)."""
    zoo = zoo or configured_zoo()
    key = (zoo.cache_dir, name, layer)
    with _LOCK:
        if key not in _READERS:
            _READERS[key] = HiddenReader.from_zoo(zoo, name, layer)
        return _READERS[key]


def request_kind(reader: Reader | None = None) -> RequestKind:
    """The process's classifier over ``reader`` (default: ``hidden_reader()``, the served one),
    fitted on first use. Raises ``engines.lexicon.LexiconUnavailable`` when the model it reads is
    not converted."""
    reader = reader or hidden_reader()
    with _LOCK:
        if id(reader) not in _SHARED:
            _SHARED[id(reader)] = RequestKind.fit(reader)
        return _SHARED[id(reader)]
