"""The ``auto`` path's request classifier (engines/request_kind.py): word vectors of the request,
a logistic regression fitted on generic requests."""

from __future__ import annotations

import pytest
import torch

from engines.lexicon import EMBEDDER, lexicon
from engines.request_examples import DETAIL, WHOLE
from engines.request_kind import RequestKind, features, fit_logistic, leave_one_out, request_kind, words
from engines.zoo import Zoo


def test_words_are_case_folded_letters_with_their_clitic() -> None:
    assert words("What's the Wi-Fi PIN? (room 12)") == ["what's", "the", "wi", "fi", "pin", "room"]
    assert words("12 + 3 = ?") == []


def test_the_logistic_fit_separates_separable_data_and_is_deterministic() -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(40, 5, generator=g, dtype=torch.float64)
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).double()
    w, b = fit_logistic(x, y, l2=1e-3)
    assert ((x @ w + b > 0).double() == y).all()
    w2, b2 = fit_logistic(x, y, l2=1e-3)
    assert torch.equal(w, w2) and b == b2
    strong, _ = fit_logistic(x, y, l2=10.0)  # the penalty shrinks the weights
    assert strong.norm() < 0.2 * w.norm()


def test_the_training_requests_are_balanced_and_distinct() -> None:
    assert len(DETAIL) == len(WHOLE) >= 50
    assert len(set(DETAIL) | set(WHOLE)) == len(DETAIL) + len(WHOLE)


@pytest.mark.models
def test_held_out_requests_are_read_as_their_kind(zoo: Zoo, load_engine) -> None:  # type: ignore[no-untyped-def]
    """Leave-one-out over the generic requests (measured 0.91, bench/request_kind.py), and the
    shared classifier is fitted once per table."""
    load_engine(EMBEDDER)
    vectors = lexicon(zoo)
    loo = leave_one_out(vectors)
    right = sum((p >= 0.5) == detail for _, detail, p in loo)
    assert len(loo) == len(DETAIL) + len(WHOLE) and right >= 0.85 * len(loo)
    kind = request_kind(vectors)
    assert request_kind(vectors) is kind and isinstance(kind, RequestKind)
    assert features(vectors, ["", "Who won?"]).shape == (2, 2 * vectors.dim)
    assert 0.0 < kind.p_detail("") < 1.0  # no word: the bias alone
    fit = {r: kind.p_detail(r) >= 0.5 for r in (*DETAIL, *WHOLE)}
    assert sum(fit[r] for r in DETAIL) + sum(not fit[r] for r in WHOLE) >= 0.9 * len(fit)


@pytest.mark.models
def test_warm_fits_the_classifier_for_an_auto_role(zoo: Zoo, load_engine) -> None:  # type: ignore[no-untyped-def]
    """A role on ``auto`` has the classifier fitted at start-up, whatever its selector reads."""
    from engines import request_kind as module
    from engines.selectors import warm

    load_engine(EMBEDDER)
    module._SHARED.clear()
    warm("lexical-hop", zoo)
    assert not module._SHARED  # no auto: nothing fitted
    warm("lexical-hop", zoo, auto=True)
    assert list(module._SHARED.values()) == [request_kind(lexicon(zoo))]


def test_the_held_out_requests_are_new() -> None:
    """``bench.request_heldout`` shares no request with the training set."""
    from bench.request_heldout import HELD_DETAIL, HELD_WHOLE

    assert not ({*HELD_DETAIL, *HELD_WHOLE} & {*DETAIL, *WHOLE}) and len(HELD_DETAIL) == len(HELD_WHOLE) == 30
