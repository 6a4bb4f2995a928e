"""The attention-rule probe (bench/attention_rule.py) on a real sender: the signals of one item."""

import asyncio

import pytest

from bench.attention_rule import signals
from bench.auto_rule import best_cut
from heterofold.suite import builtin_suite

pytestmark = pytest.mark.models


def test_the_best_sentence_holds_at_least_its_share_and_stands_at_or_above_the_mean(load_engine) -> None:  # type: ignore[no-untyped-def]
    sender = load_engine("smollm2-135m-instruct")
    item = builtin_suite(lengths=(256,), per_cell=1, kinds=("paraphrase",))[0]
    got = asyncio.run(signals(sender, item))
    sentences = item.context.count(". ") + 1
    assert 1 / sentences <= got["attention share"] <= 1.0 and got["attention z"] > 0.0


def test_best_cut_takes_the_lowest_threshold_that_misplaces_the_fewest() -> None:
    assert best_cut([0.3, 0.4], [0.1, 0.2]) == 0.3
    assert best_cut([0.1], [0.2]) == 0.1  # every cut but 0.2 misplaces one: the lowest of them
