"""The ``auto`` path's request classifier (engines/request_kind.py): gemma3-270m's reading of the
request (served) or its word vectors, a logistic regression fitted on generic requests."""

from __future__ import annotations

import pytest
import torch

from engines.lexicon import EMBEDDER, lexicon
from engines.request_examples import DETAIL, WHOLE
from engines.request_kind import (
    LAYER,
    HiddenReader,
    RequestKind,
    WordReader,
    fit_logistic,
    hidden_reader,
    leave_one_out,
    request_kind,
    words,
)
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
def test_the_word_reader_reads_most_requests_right(zoo: Zoo, load_engine) -> None:  # type: ignore[no-untyped-def]
    """Leave-one-out over the generic requests with word vectors (measured 0.91, bench/request_kind.py)."""
    load_engine(EMBEDDER)
    vectors = lexicon(zoo)
    reader = WordReader(vectors)
    loo = leave_one_out(reader)
    right = sum((p >= 0.5) == detail for _, detail, p in loo)
    assert len(loo) == len(DETAIL) + len(WHOLE) and right >= 0.85 * len(loo)
    assert reader(["", "Who won?"]).shape == (2, 2 * vectors.dim)
    kind = RequestKind.fit(reader)
    assert 0.0 < kind.p_detail("") < 1.0  # no word: the bias alone


@pytest.mark.models
def test_the_hidden_reader_reads_the_layer_the_full_model_computes(zoo: Zoo, load_engine) -> None:  # type: ignore[no-untyped-def]
    """The reader keeps gemma3's first ``LAYER`` layers and averages the last one's output over the
    request's tokens: the same numbers as the full model's hidden state after that layer."""
    from heterofold.adapter import map_dtype

    engine = load_engine(EMBEDDER)
    served = hidden_reader(zoo)
    assert hidden_reader(zoo) is served and len(served._decoder.layers) == LAYER
    assert served.dtype == map_dtype(torch.device("cpu"))  # bfloat16 where the CPU has it, as the maps
    reader = HiddenReader.from_zoo(zoo, EMBEDDER, LAYER, dtype=torch.float32)  # exact against the full model
    request = "Which platform does the night train use?"
    ids = engine.tokenizer(request, return_tensors="pt").input_ids
    with torch.no_grad():
        full = engine.model(ids, output_hidden_states=True).hidden_states
    got = reader([request, "Summarize."])
    assert got.shape == (2, engine.model.config.hidden_size)
    torch.testing.assert_close(got[0], full[LAYER][0].float().mean(0), rtol=1e-4, atol=1e-4)
    assert not torch.allclose(got[0], full[LAYER - 1][0].float().mean(0), rtol=1e-2, atol=1e-2)
    with pytest.raises(ValueError, match="layer must be"):
        HiddenReader.from_zoo(zoo, EMBEDDER, layer=99)


@pytest.mark.models
def test_the_served_classifier_reads_requests_never_fitted_on(zoo: Zoo, load_engine) -> None:  # type: ignore[no-untyped-def]
    """Leave-one-out (measured 0.99) and the 39 fresh requests of bench.request_heldout (measured
    38 of 39; the word vectors 35), and the shared classifier is fitted once per reader."""
    from bench.request_heldout import FRESH_DETAIL, FRESH_WHOLE

    load_engine(EMBEDDER)
    reader = hidden_reader(zoo)
    loo = leave_one_out(reader)
    assert sum((p >= 0.5) == detail for _, detail, p in loo) >= 0.95 * len(loo)
    kind = request_kind(reader)
    assert request_kind(reader) is kind and kind.reader is reader
    right = sum(kind.asks_for_a_detail(r) for r in FRESH_DETAIL) + sum(
        not kind.asks_for_a_detail(r) for r in FRESH_WHOLE
    )
    assert right >= 0.9 * (len(FRESH_DETAIL) + len(FRESH_WHOLE))


@pytest.mark.models
def test_warm_fits_the_classifier_for_an_auto_role(zoo: Zoo, load_engine) -> None:  # type: ignore[no-untyped-def]
    """A role on ``auto`` has the served classifier fitted at start-up, whatever its selector reads."""
    from engines import request_kind as module
    from engines.selectors import warm

    load_engine(EMBEDDER)
    module._SHARED.clear()
    warm("lexical-hop", zoo)
    assert not module._SHARED  # no auto: nothing fitted
    warm("lexical-hop", zoo, auto=True)
    assert list(module._SHARED.values()) == [request_kind(hidden_reader(zoo))]


def test_the_held_out_requests_are_new() -> None:
    """``bench.request_heldout``'s two sets share no request with the training set or each other."""
    from bench.request_heldout import FRESH_DETAIL, FRESH_WHOLE, HELD_DETAIL, HELD_WHOLE

    held, fresh, train = {*HELD_DETAIL, *HELD_WHOLE}, {*FRESH_DETAIL, *FRESH_WHOLE}, {*DETAIL, *WHOLE}
    assert not (held & train) and not (fresh & train) and not (held & fresh)
    assert len(HELD_DETAIL) == len(HELD_WHOLE) == 30 and len(FRESH_DETAIL) == 20 and len(FRESH_WHOLE) == 19
