"""The auto-rule probe's signals (bench/auto_rule.py): no model, a stand-in word-vector table."""

from collections.abc import Sequence

import torch

from bench.auto_rule import fewest_wrong, signals


def vectors(words: Sequence[str]) -> torch.Tensor:
    """A unit vector per word, the same for the same word, near-orthogonal otherwise; "strongbox"
    sits next to "safe" (a synonym the table knows)."""
    out = []
    for w in words:
        g = torch.Generator().manual_seed(sum(map(ord, "safe" if w == "strongbox" else w)) * 31 + len(w))
        out.append(torch.nn.functional.normalize(torch.randn(64, generator=g), dim=0))
    return torch.stack(out)


CONTEXT = (
    "The weather was mild all week. Tourists walked along the river. "
    "To open the strongbox, enter 34344. The museum opened late on Sunday. Bakeries sold bread early."
)


def test_a_paraphrased_look_up_has_no_lexical_confidence_but_one_sentence_stands_out_by_meaning() -> None:
    asked = signals("What is the code for the safe?", CONTEXT, vectors)
    assert asked["lexical"] == 0.0  # "safe" and "code" are nowhere in the text
    assert asked["meaning z"] > 1.5 and asked["meaning top/2nd"] > 1.0  # the strongbox sentence, by meaning
    named = signals("When did the museum open on Sunday?", CONTEXT, vectors)
    assert named["lexical"] >= 0.5


def test_fewest_wrong_counts_the_items_no_threshold_can_place() -> None:
    assert fewest_wrong([3.0, 4.0], [1.0, 2.0]) == 0  # a threshold in (2, 3] separates them
    assert fewest_wrong([3.0, 4.0], [1.0, 3.5]) == 1
    assert fewest_wrong([1.0], [2.0]) == 1  # the wanted-high item is the lower one
