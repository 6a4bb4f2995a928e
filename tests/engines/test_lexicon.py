"""The meaning selector's word vectors: gemma3-270m's embedding table, read in place from the zoo."""

from __future__ import annotations

import pytest
import torch
from safetensors import safe_open

from engines.catalog import lookup
from engines.lexicon import EMBEDDER, TABLE, Lexicon, LexiconUnavailable, lexicon
from engines.zoo import Zoo

pytestmark = pytest.mark.models


def test_rows_read_in_place_are_the_tables_rows(zoo: Zoo, load_engine) -> None:  # type: ignore[no-untyped-def]
    load_engine(EMBEDDER)  # converted on a fresh machine
    words = lexicon(zoo)
    folder = zoo.model_dir(lookup(EMBEDDER))
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        table = f.get_tensor(TABLE).float()
    ids = words._tok.encode(" strongbox", add_special_tokens=False).ids
    want = table[ids].mean(0) - table.mean(0)
    torch.testing.assert_close(words(["strongbox"])[0], want / want.norm(), atol=1e-5, rtol=1e-4)
    assert words([]).shape == (0, table.shape[1])
    assert lexicon(zoo) is words  # one per process and cache


def test_a_synonym_is_closer_than_unrelated_words(zoo: Zoo, load_engine) -> None:  # type: ignore[no-untyped-def]
    load_engine(EMBEDDER)
    v = lexicon(zoo)(["safe", "strongbox", "river", "theory", "doctor", "physician"])
    sims = v @ v.T
    assert sims[0, 1] > max(sims[0, 2], sims[0, 3]) and sims[4, 5] > max(sims[4, 2], sims[4, 3])


def test_a_zoo_without_the_embedder_says_how_to_get_it(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(LexiconUnavailable, match="heterofold models pull gemma3-270m"):
        Lexicon.from_zoo(Zoo(tmp_path))


def test_warm_loads_the_table_only_for_a_selector_that_reads_it(zoo: Zoo, load_engine, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from engines.selectors import make_selector, warm

    load_engine(EMBEDDER)
    empty = Zoo(tmp_path)
    try:
        warm("lexical-hop|sender-attention", empty)  # reads no table: nothing to load, nothing raised
        warm("lexical-hop|meaning", empty)  # the table is missing: left to the hop to report
        with pytest.raises(LexiconUnavailable):
            lexicon()  # the warmed zoo is the one later hops read
        assert make_selector("lexical-hop|meaning").name == "lexical-hop|meaning"
    finally:
        warm("lexical-hop|meaning", zoo)
    assert lexicon() is lexicon(zoo)
