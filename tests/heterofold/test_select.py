"""The selector sees only character spans of tokens. These tests make the spans with a whitespace split
(plus a BOS at (0, 0)), a stand-in for the models' tokenizers so that no model has to load; the
transfer path passes the receiver tokenizer's real offsets, which are finer (sub-words, separate
spaces), and ``test_subword_offsets_cover_the_whole_sentence`` checks that granularity too."""

import math
import re
import zlib
from collections.abc import Sequence

import pytest
import torch

from heterofold.select import (
    MAX_SPAN_CHARS,
    QUOTE_SEPARATOR,
    answer_recall,
    choose,
    coverage,
    elide,
    gated,
    lexical,
    lexical_hop,
    meaning,
    quote_into,
    scored,
    select_tokens,
    sentence_spans,
    spans_of,
    union,
)  # fmt: skip
from heterofold.suite import builtin_suite

FILLER = (
    "Return a new list containing all items from the iterable in ascending order. "
    "A custom key function can be supplied to customize the sort order. "
    "The reverse flag can be set to request the result in descending order.\n"
)


def ws_offsets(text: str) -> list[tuple[int, int]]:
    """A BOS, then one token per run of non-space characters."""
    return [(0, 0)] + [(m.start(), m.end()) for m in re.finditer(r"\S+", text)]


def chosen_text(text: str, offsets: list[tuple[int, int]], chosen: list[int]) -> str:
    return " ".join(text[offsets[i][0] : offsets[i][1]] for i in chosen)


def budget_for(n_tokens: int, offsets: list[tuple[int, int]]) -> float:
    """The budget that allows exactly ``n_tokens``."""
    return n_tokens / len(offsets)


def sentence_of(context: str, answer: str) -> list[tuple[int, int]]:
    """Each sentence holding the answer, by a naive rule independent of ``sentence_spans``: from the
    last '.', '!', '?' or newline before the answer to the first one after it."""
    spans, key, at = [], answer.casefold(), context.casefold().find(answer.casefold())
    while at >= 0:
        start = max(context.rfind(c, 0, at) for c in ".!?\n") + 1
        ends = [e for e in (context.find(c, at + len(answer)) for c in ".!?\n") if e >= 0]
        start += len(context[start:]) - len(context[start:].lstrip())
        spans.append((start, min(ends, default=len(context) - 1) + 1))
        at = context.casefold().find(key, at + 1)
    return spans


# --- sentence spans ------------------------------------------------------------------------------


def test_sentence_spans_split_at_sentence_ends_and_newlines() -> None:
    text = "First one. Second one!\nThird line? os.path.join and 3.14 stay whole.\n\n  Last words"
    assert [text[s:e] for s, e in sentence_spans(text)] == [
        "First one.", "Second one!", "Third line?", "os.path.join and 3.14 stay whole.", "Last words",
    ]  # fmt: skip


def test_sentence_spans_drop_blank_and_punctuation_only_pieces() -> None:
    text = "Hello there.\n\n---\n  >>> \n...\n\tWorld ends here"
    assert [text[s:e] for s, e in sentence_spans(text)] == ["Hello there.", "World ends here"]


def test_long_span_without_punctuation_is_cut_into_chunks_at_spaces() -> None:
    text = " ".join(f"word{i}" for i in range(300))
    pieces = [text[s:e] for s, e in sentence_spans(text)]
    assert len(pieces) == math.ceil(len(text) / MAX_SPAN_CHARS)
    assert all(MAX_SPAN_CHARS / 2 <= len(p) <= MAX_SPAN_CHARS for p in pieces)
    assert " ".join(pieces).split() == text.split()


def test_long_word_is_cut_even_without_spaces() -> None:
    text = "x" * 1000
    spans = sentence_spans(text)
    assert all(e - s <= MAX_SPAN_CHARS for s, e in spans) and "".join(text[s:e] for s, e in spans) == text


# --- choosing ------------------------------------------------------------------------------------


def test_selector_picks_the_sentence_that_shares_words_with_the_question() -> None:
    target = "Maria Okafor lives in Lisbon."
    context = FILLER + "Maria Okafor has a pet ferret.\n" + FILLER + target + "\n" + FILLER
    offsets = ws_offsets(context)
    chosen = select_tokens(context, offsets, "Where does Maria Okafor live?", budget_for(5, offsets))
    assert chosen_text(context, offsets, chosen) == target


def test_selector_prefers_the_needle_over_distractors_sharing_words() -> None:
    context = (
        FILLER + "The code word for the amber tower is falcon.\n" + FILLER
        + "The access number for the jade gate is 4821.\n" + FILLER
        + "The code word for the amber gate is walrus.\n" + FILLER
    )  # fmt: skip
    offsets = ws_offsets(context)
    chosen = select_tokens(context, offsets, "What is the code word for the amber gate?", budget_for(9, offsets))
    assert chosen_text(context, offsets, chosen) == "The code word for the amber gate is walrus."


@pytest.mark.parametrize(
    ("question", "expected"),
    [
        ("When does Zoë's café open?", "Zoë's café opens at 7."),
        ("Who booked room 4512?", "Room 4512 is booked for Friday."),
        ("Isn't it raining in KRAKÓW?", "It's raining in Kraków today."),
        ("What's the Straße called?", "Die Straße heißt Müllerweg."),
    ],
)
def test_selector_handles_unicode_contractions_and_digits(question: str, expected: str) -> None:
    context = (
        FILLER + "Zoë's café opens at 7.\nRoom 4512 is booked for Friday.\n" + FILLER
        + "It's raining in Kraków today. Die Straße heißt Müllerweg.\n" + FILLER
    )  # fmt: skip
    offsets = ws_offsets(context)
    chosen = select_tokens(context, offsets, question, budget_for(len(expected.split()), offsets))
    assert chosen_text(context, offsets, chosen) == expected


def test_equal_scores_go_to_the_earlier_sentence() -> None:
    context = FILLER + "The lock opens with brass.\n" + FILLER + "The lock opens with steel.\n"
    offsets = ws_offsets(context)
    chosen = select_tokens(context, offsets, "lock?", budget_for(5, offsets))
    assert chosen_text(context, offsets, chosen) == "The lock opens with brass."


def test_sentence_that_overflows_the_budget_keeps_its_matched_word_and_neighbours() -> None:
    target = "one two three four five six seven eight nine ten heron eleven twelve thirteen fourteen."
    context = FILLER + target + "\n" + FILLER
    offsets = ws_offsets(context)
    chosen = select_tokens(context, offsets, "Where is the heron?", budget_for(3, offsets))
    assert chosen_text(context, offsets, chosen) == "ten heron eleven"


def test_leftover_budget_widens_the_context_around_the_hits() -> None:
    prose = "The weather was mild and the river ran slowly past the old mill.\n"
    context = prose * 2 + "The pass key is 48213. Remember it. 48213 is the pass key.\n" + prose * 2
    offsets = ws_offsets(context)
    chosen = select_tokens(context, offsets, "What is the pass key?", budget_for(14, offsets))
    assert (
        chosen_text(context, offsets, chosen) == "mill. The pass key is 48213. Remember it. 48213 is the pass key. The"
    )


def test_question_without_shared_words_takes_the_most_recent_tokens() -> None:
    context = FILLER * 3
    offsets = ws_offsets(context)
    assert select_tokens(context, offsets, "Zebra?", budget_for(6, offsets)) == list(
        range(len(offsets) - 6, len(offsets))
    )
    assert select_tokens(context, offsets, "What is it?", budget_for(2, offsets)) == [
        len(offsets) - 2,
        len(offsets) - 1,
    ]


def test_subword_offsets_cover_the_whole_sentence() -> None:
    target = "Maria Okafor lives in Lisbon."
    context = FILLER + target + "\n" + FILLER
    # three-character pieces, with each space its own token, as some BPE vocabularies split digits and spaces
    offsets = [(0, 0)] + [(m.start(), m.end()) for m in re.finditer(r"\S{1,3}|\s", context)]
    chosen = select_tokens(context, offsets, "Where does Maria Okafor live?", 0.1)
    start = context.index(target)
    covered = {c for i in chosen for c in range(*offsets[i])}
    assert set(range(start, start + len(target))) <= covered


# --- budget --------------------------------------------------------------------------------------


def test_selector_never_exceeds_budget_and_spends_it() -> None:
    item = builtin_suite(lengths=(512,))[0]
    offsets = ws_offsets(item.context)
    live = len(offsets) - 1
    for budget in (0.001, 0.01, 0.02, 0.05, 0.1, 0.33, 0.5, 0.9, 0.999):
        chosen = select_tokens(item.context, offsets, item.question, budget)
        assert chosen == sorted(set(chosen)) and 0 not in chosen, budget
        assert len(chosen) == min(math.ceil(budget * len(offsets)), live), budget


def test_budget_fraction_is_rounded_before_the_ceiling() -> None:
    context = " ".join(f"w{i}" for i in range(100))
    offsets = [(m.start(), m.end()) for m in re.finditer(r"\S+", context)]
    assert len(select_tokens(context, offsets, "w5", 0.07)) == 7  # 0.07 * 100 == 7.000000000000001


def test_zero_budget_selects_nothing_and_full_budget_every_token_with_a_span() -> None:
    context = FILLER
    offsets = [*ws_offsets(context), (len(context), len(context))]
    assert select_tokens(context, offsets, "key function", 0.0, min_tokens=10) == []
    assert select_tokens(context, offsets, "key function", 1.0) == list(range(1, len(offsets) - 1))


def test_min_tokens_raises_the_floor_up_to_the_context() -> None:
    context = FILLER * 4
    offsets = ws_offsets(context)
    assert len(select_tokens(context, offsets, "key", 0.01, min_tokens=20)) == 20
    assert len(select_tokens(context, offsets, "key", 0.01, min_tokens=10**6)) == len(offsets) - 1


@pytest.mark.parametrize(
    ("budget", "min_tokens", "offsets"),
    [(-0.1, 0, [(0, 3)]), (1.5, 0, [(0, 3)]), (float("nan"), 0, [(0, 3)]), (0.5, -1, [(0, 3)]),
     (0.5, 0, [(3, 1)]), (0.5, 0, [(0, 99)]), (0.5, 0, [(-1, 2)])],
)  # fmt: skip
def test_selector_refuses_bad_arguments(budget: float, min_tokens: int, offsets: list[tuple[int, int]]) -> None:
    with pytest.raises(ValueError):
        select_tokens("abc def", offsets, "abc", budget, min_tokens=min_tokens)


# --- the built-in suite --------------------------------------------------------------------------


def test_needle_sentences_of_the_builtin_suite_are_selected_at_five_percent() -> None:
    missed = []
    # The lexical kinds; the whole-context kinds (paraphrase above all) are built for a selector to miss.
    for item in builtin_suite(lengths=(1024, 2048, 4096), kinds=("passkey", "multikey", "facts", "handoff")):
        offsets = ws_offsets(item.context)
        chosen = set(select_tokens(item.context, offsets, item.question, 0.05))
        needed = {
            i for i, (s, e) in enumerate(offsets) for a, b in sentence_of(item.context, item.answer) if s < b and e > a
        }
        assert len(sentence_of(item.context, item.answer)) == (2 if item.kind == "passkey" else 1)
        if not needed <= chosen:
            missed.append(item.id)
    assert missed == []


def test_scored_ranker_reads_the_sentence_of_the_best_pooled_token() -> None:
    context = "Alpha beta gamma. Delta epsilon zeta. Eta theta iota."
    offsets = ws_offsets(context)
    scores = [0.0] * len(offsets)
    scores[offsets.index((context.index("epsilon"), context.index("epsilon") + 7))] = 1.0
    chosen = choose(context, offsets, budget_for(3, offsets), scored(scores, pool=1))
    assert chosen_text(context, offsets, chosen) == "Delta epsilon zeta."
    # pooling spreads a token's score to its neighbours, so ties go by the pooled value
    flat = choose(context, offsets, budget_for(3, offsets), scored([0.0] * len(offsets)))
    assert flat == list(range(len(offsets) - 3, len(offsets)))  # nothing scores: the most recent tokens
    with pytest.raises(ValueError, match="scores for"):
        choose(context, offsets, 0.5, scored([1.0]))


def test_union_interleaves_the_rankings_one_sentence_at_a_time() -> None:
    context = "Red apples grow. Blue birds sing. Green frogs jump. Yellow suns shine."
    offsets = ws_offsets(context)
    last = [1.0 if context.index("Yellow") <= a else 0.0 for a, _ in offsets]  # a scorer that likes the last
    both = choose(context, offsets, budget_for(6, offsets), union(lexical("Which birds sing?"), scored(last, pool=1)))
    assert chosen_text(context, offsets, both) == "Blue birds sing. Yellow suns shine."
    one = choose(context, offsets, budget_for(3, offsets), union(lexical("Which birds sing?"), scored(last, pool=1)))
    assert chosen_text(context, offsets, one) == "Blue birds sing."  # the first ranking's best comes first


def test_gated_union_lets_lexical_lead_only_when_it_covers_the_question() -> None:
    context = "Strongbox holds 4411. Blue birds sing. Code runs fast. Green frogs jump."
    offsets = ws_offsets(context)
    box = [1.0 if a < context.index("Blue") else 0.0 for a, _ in offsets]
    birds = [1.0 if context.index("Blue") <= a < context.index("Code") else 0.0 for a, _ in offsets]
    k = budget_for(3, offsets)  # one short sentence
    # the question's words are all in one sentence: lexical leads, the attention-like scorer follows
    sure = gated(lexical("Which birds sing?"), scored(box, pool=1))
    assert chosen_text(context, offsets, choose(context, offsets, k, sure)) == "Blue birds sing."
    # only the common word "code" matches, "safe" is nowhere: the other ranking leads
    unsure = gated(lexical("What is the code for the safe?"), scored(box, pool=1))
    assert chosen_text(context, offsets, choose(context, offsets, k, unsure)) == "Strongbox holds 4411."
    # the same lexical ranking in a plain union leads either way
    plain = union(lexical("What is the code for the safe?"), scored(birds, pool=1))
    assert chosen_text(context, offsets, choose(context, offsets, k, plain)) == "Code runs fast."


def test_coverage_weighs_the_question_words_a_sentence_holds() -> None:
    docs = [["code", "run"], ["code", "fast"], ["bird", "sing"]]
    assert coverage(docs, {"bird", "sing"}, docs[2]) == 1.0
    assert 0.0 < coverage(docs, {"code", "safe"}, docs[0]) < 0.5  # "safe" is nowhere: it weighs most
    assert coverage(docs, set(), docs[0]) == 0.0


def test_lexical_hop_reads_the_sentence_the_first_one_points_to() -> None:
    context = "Ana's cousin is Ben. Rain fell all day. Cara lives in Rome. Ben lives in Oslo. Ana's aunt is Cara."
    offsets = ws_offsets(context)
    question = "In which city does Ana's cousin live?"
    k = budget_for(8, offsets)  # two short sentences
    plain = chosen_text(context, offsets, choose(context, offsets, k, lexical(question)))
    assert "Ben lives in Oslo." not in plain  # BM25 alone ranks the first hop, then Ana's aunt
    hop = chosen_text(context, offsets, choose(context, offsets, k, lexical_hop(question)))
    assert hop == "Ana's cousin is Ben. Ben lives in Oslo."


def test_elide_keeps_the_spans_and_marks_what_was_left_out() -> None:
    context = "Alpha beta. Gamma delta.\nEpsilon zeta."
    # "Alpha", " beta" touch; "Epsilon" is far from them
    assert elide(context, [(0, 5), (5, 10), (25, 32)]) == f"Alpha beta{QUOTE_SEPARATOR}Epsilon"
    assert elide(context, [(6, 10), (0, 5)]) == "Alpha beta"  # only whitespace between: one piece, any order
    assert elide(context, []) == ""


def test_quote_into_places_the_quote_after_the_shared_text_the_message_carries() -> None:
    prompt = "<user>Doc one. Doc two.\n\nQuestion: which?<end>"
    content = "Doc one. Doc two.\n\nQuestion: which?"
    start = prompt.index(content)
    shared = [(start, len("Doc one. Doc two."))]  # the document pasted with the question is shared
    out, head = quote_into(content, start, shared, "Doc two.")
    assert out == "Doc one. Doc two.\n\nDoc two.\n\nQuestion: which?"  # the eval prompt's layout
    assert head == "Doc one. Doc two."  # only this part's KV may be mapped
    out, head = quote_into(content, start, [(0, 5)], "Doc two.")  # nothing shared inside the message
    assert (out, head) == ("Doc two.\n\n" + content, "")
    assert quote_into(content, -1, shared, "Doc two.")[1] == ""  # the message is not in the prompt
    assert quote_into(content, start, shared, "") == (content, "Doc one. Doc two.")  # nothing to quote


def test_answer_recall_needs_the_value_and_its_whole_sentence() -> None:
    context = "Noise here. The pass key is 48213. More noise."
    at = context.index("The pass")
    sentence = (at, context.index("48213.") + 6)
    value = (context.index("48213"), context.index("48213") + 5)
    assert answer_recall(context, "48213", [sentence]) == (True, True)
    assert answer_recall(context, "48213", [value]) == (True, False)
    assert answer_recall(context, "48213", [(0, 11)]) == (False, False)
    assert answer_recall(context, "", [sentence]) == (False, False)
    assert answer_recall(context, "99999", [(0, len(context))]) == (False, False)


# --- meaning: lexical matching by static word vectors -----------------------------------------------

SYNONYMS = {"strongbox": "safe", "automobile": "car"}  # a word and its synonym share one direction


def toy_vectors(words: Sequence[str]) -> torch.Tensor:
    """Unit vectors: one axis per word (a synonym takes its partner's), every other pair orthogonal."""
    out = torch.zeros(len(words), 256)
    for i, w in enumerate(words):
        out[i, zlib.crc32(SYNONYMS.get(w, w).encode()) % 256] = 1.0
    return out


def test_meaning_finds_the_sentence_a_synonym_points_to() -> None:
    context = "The code base is large. To open the strongbox, enter 34344. The code is tested. Rain fell."
    offsets = ws_offsets(context)
    question = "What is the code for the safe?"
    k = budget_for(6, offsets)  # one short sentence
    assert "strongbox" not in chosen_text(context, offsets, choose(context, offsets, k, lexical(question)))
    got = chosen_text(context, offsets, choose(context, offsets, k, meaning(question, toy_vectors)))
    assert got == "To open the strongbox, enter 34344."  # "safe" (in no sentence) outweighs the common "code"


def test_meaning_counts_the_same_stem_as_a_full_match_and_keeps_matched_words_first() -> None:
    context = "Cars rust in the rain. A small bird sang in the old tree at dawn, loud and clear. Rain fell."
    offsets = ws_offsets(context)
    ranker = meaning("Which birds?", toy_vectors)
    assert ranker(spans_of(context, offsets)).order == [1]  # "birds" ~ "bird" by stem; nothing else matches
    assert chosen_text(context, offsets, choose(context, offsets, budget_for(2, offsets), ranker)) == "small bird"


def test_meaning_without_content_words_ranks_nothing() -> None:
    context = "Rain fell. The sun rose."
    offsets = ws_offsets(context)
    ranker = meaning("What is it?", toy_vectors)
    assert ranker(spans_of(context, offsets)).order == []
    assert choose(context, offsets, budget_for(2, offsets), ranker) == [len(offsets) - 2, len(offsets) - 1]
