import hashlib
import json
import re

import pytest

from heterofold.corpus import stdlib_docstrings
from heterofold.select import _words
from heterofold.suite import CHARS_PER_TOKEN, KINDS, builtin_suite
from heterofold.suite_kinds import CONTINUE_QUESTION, PARAPHRASES, SUMMARY_QUESTION, UPDATES
from heterofold.tasks import TaskItem

LENGTHS = (512, 1024, 2048, 4096)
WHOLE_CONTEXT_KINDS = ("paraphrase", "update", "chain", "summary", "continue")
ORIGINAL_KINDS = ("passkey", "multikey", "facts", "handoff")
# sha256 of [[id, context, question, answer, kind], ...] for ORIGINAL_KINDS at lengths (1024,), computed with
# the code before the whole-context kinds were added, over the stdlib docstrings whose sha256 is CORPUS_SHA256.
ORIGINAL_ITEMS_SHA256 = "56a9f3c995dbe407e85b01572fbd7306c6be013eda5f286884652b28eba053b4"
CORPUS_SHA256 = "4dd63971fd8557a24cb61c5b41a234ab910e8fc5d267a549694ecbdd54b66fdd"


@pytest.fixture(scope="module")
def items() -> list[TaskItem]:
    return builtin_suite(lengths=LENGTHS, kinds=WHOLE_CONTEXT_KINDS)


def of(items: list[TaskItem], kind: str) -> list[TaskItem]:
    chosen = [item for item in items if item.kind == kind]
    assert len(chosen) == 20
    return chosen


def asked_person(item: TaskItem) -> tuple[str, str]:
    """(asker, relation) of a chain question."""
    m = re.fullmatch(r"In which city does (.+)'s (.+) live\?", item.question)
    assert m, item.id
    return m.group(1), m.group(2)


def stems(text: str) -> set[str]:
    return {stem for stem, _, _ in _words(text, 0, len(text))}


def pattern(template: str, **slots: str) -> re.Pattern[str]:
    """A regex for the lines ``template`` makes, each ``{slot}`` a group unless given in ``slots``."""
    parts = re.split(r"\{(\w+)\}", template)
    return re.compile(
        "^" + "".join(re.escape(p) if i % 2 == 0 else slots.get(p, "(.+?)") for i, p in enumerate(parts)) + "$",
        re.MULTILINE,
    )


# --- paraphrase ----------------------------------------------------------------------------------


def test_paraphrase_question_shares_no_content_stem_with_any_needle(items: list[TaskItem]) -> None:
    for item in of(items, "paraphrase"):
        template, question, _, objects = next(p for p in PARAPHRASES if pattern(p[1]).match(item.question))
        needles = [m.group(0) for p in PARAPHRASES for m in pattern(p[0]).finditer(item.context)]
        assert len(needles) == 3, item.id
        assert all(not stems(needle) & stems(item.question) for needle in needles), item.id
        syn = pattern(question).fullmatch(item.question)
        assert syn, item.id
        obj = {s: o for o, s in objects}[syn.group(1)]
        assert [n for n in needles if item.answer in n] == [template.format(obj=obj, value=item.answer)], item.id


def test_paraphrase_distractors_come_from_the_other_templates(items: list[TaskItem]) -> None:
    seen_templates = set()
    for item in of(items, "paraphrase"):
        template = next(p[0] for p in PARAPHRASES if pattern(p[1]).match(item.question))
        assert len(pattern(template).findall(item.context)) == 1, item.id  # the asked template occurs once
        assert sum(len(pattern(p[0]).findall(item.context)) for p in PARAPHRASES) == 3, item.id
        seen_templates.add(template)
    assert len(seen_templates) >= 3


# --- update --------------------------------------------------------------------------------------


def update_sentences(item: TaskItem) -> tuple[re.Match[str], re.Match[str]]:
    """The first statement and its change, found in the item's context."""
    first, change, _, _ = next(u for u in UPDATES.values() if u[2] == item.question)
    old = pattern(first).search(item.context)
    new = pattern(change, value=re.escape(item.answer)).search(item.context)
    assert old and new, item.id
    return old, new


def test_update_answer_appears_once_after_the_old_value(items: list[TaskItem]) -> None:
    for item in of(items, "update"):
        old, new = update_sentences(item)
        assert old.group(1) != item.answer and old.group(1) in item.context, item.id
        assert item.context.casefold().count(item.answer.casefold()) == 1, item.id
        assert old.start() < new.start(), item.id


def test_update_states_the_old_value_half_a_context_earlier_or_at_the_start(items: list[TaskItem]) -> None:
    for item in of(items, "update"):
        old, new = update_sentences(item)
        if item.id.split("-")[2] in ("d10", "d30"):
            assert old.start() == 0, item.id
        else:
            assert new.start() - old.start() >= 0.3 * len(item.context), item.id


def test_update_has_other_facts_stated_once(items: list[TaskItem]) -> None:
    for item in of(items, "update"):
        stated = [topic for topic, (first, *_) in UPDATES.items() if pattern(first).search(item.context)]
        assert 2 <= len(stated) <= 3, item.id


# --- chain ---------------------------------------------------------------------------------------


def test_chain_needs_both_hops_which_sit_far_apart(items: list[TaskItem]) -> None:
    for item in of(items, "chain"):
        asker, relation = asked_person(item)
        hop1 = re.search(rf"^{re.escape(asker)}'s {re.escape(relation)} is (.+)\.$", item.context, re.MULTILINE)
        assert hop1, item.id
        hop2 = re.search(rf"^{re.escape(hop1.group(1))} lives in (\w+)\.$", item.context, re.MULTILINE)
        assert hop2 and hop2.group(1) == item.answer, item.id
        assert item.answer not in hop1.group(0) and hop1.group(1) not in item.question, item.id
        assert abs(hop1.start() - hop2.start()) >= 0.3 * len(item.context), item.id


def test_chain_distractors_give_the_asker_another_relation_and_another_person_the_same_one(
    items: list[TaskItem],
) -> None:
    for item in of(items, "chain"):
        asker, relation = asked_person(item)
        relations = re.findall(r"^(.+)'s (.+) is (.+)\.$", item.context, re.MULTILINE)
        assert len(relations) == 3, item.id
        assert sum(who == asker for who, _, _ in relations) == 2, item.id
        assert sum(rel == relation for _, rel, _ in relations) == 2, item.id
        assert len(re.findall(r"^.+ lives in \w+\.$", item.context, re.MULTILINE)) == 3, item.id


# --- fidelity ------------------------------------------------------------------------------------


def test_fidelity_items_have_no_answer_and_ask_for_the_whole_context(items: list[TaskItem]) -> None:
    for kind, question in (("summary", SUMMARY_QUESTION), ("continue", CONTINUE_QUESTION)):
        cells = of(items, kind)
        assert {(item.answer, item.metric, item.question) for item in cells} == {("", "fidelity", question)}
        assert [item.id.split("-")[2] for item in cells[:5]] == ["v0", "v1", "v2", "v3", "v4"]
        assert len({item.context for item in cells}) == len(cells)


def test_continue_context_stops_mid_sentence(items: list[TaskItem]) -> None:
    for item in of(items, "continue"):
        assert item.context == item.context.rstrip() and item.context[-1] not in ".!?:", item.id


# --- the suite -----------------------------------------------------------------------------------


def test_whole_context_kinds_fit_their_target_from_512_to_4096_tokens(items: list[TaskItem]) -> None:
    for item in items:
        target = int(item.id.split("-")[1]) * CHARS_PER_TOKEN
        assert 0.9 * target <= len(item.context) <= target, item.id


def test_kinds_selects_in_registry_order_and_refuses_unknown_kinds() -> None:
    chosen = builtin_suite(lengths=(512,), kinds=("chain", "passkey"))
    assert [item.kind for item in chosen] == ["passkey"] * 5 + ["chain"] * 5
    assert chosen[5:] == [item for item in builtin_suite(lengths=(512,)) if item.kind == "chain"]
    known = "passkey, multikey, facts, handoff, paraphrase, update, chain, summary, continue"
    with pytest.raises(ValueError, match=re.escape(f"unknown task kinds ['needle']; known: {known}")):
        builtin_suite(kinds=("passkey", "needle"))


def test_original_kinds_are_unchanged_by_the_new_ones() -> None:
    if hashlib.sha256("\x00".join(stdlib_docstrings()).encode()).hexdigest() != CORPUS_SHA256:
        pytest.skip("this Python's stdlib docstrings differ from those the stored hash was computed over")
    original = builtin_suite(lengths=(1024,), kinds=ORIGINAL_KINDS)
    rows = [[item.id, item.context, item.question, item.answer, item.kind] for item in original]
    assert hashlib.sha256(json.dumps(rows, ensure_ascii=False).encode()).hexdigest() == ORIGINAL_ITEMS_SHA256
    assert set(ORIGINAL_KINDS) < set(KINDS)
