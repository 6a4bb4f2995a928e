import json
import re
from itertools import pairwise
from pathlib import Path

import pytest

from heterofold.errors import HeteroFoldError, TaskFormatError
from heterofold.suite import CHARS_PER_TOKEN, DEPTHS, FIDELITY_KINDS, HANDOFF_FACTS, KINDS, LOOKUP_KINDS, builtin_suite
from heterofold.suite_kinds import FIDELITY_VARIANTS
from heterofold.tasks import TaskItem, is_correct, load_jsonl, save_jsonl

LENGTHS = (512, 1024, 2048, 4096)
NEEDLES = {  # kind: one needle line, the value it states as group 2
    "passkey": r"(The pass key is )(\d{5})\. Remember it\. \2 is the pass key\.",
    "multikey": r"The (code word|access number) for the \w+ \w+ is (\w+)\.",
    "facts": r"(\w+ \w+)(?: lives in | works as an? |'s favourite colour is | has a pet )(\w+)\.",
}


@pytest.fixture(scope="module")
def suite() -> list[TaskItem]:
    return builtin_suite()


def row(**fields: object) -> str:
    return json.dumps({"id": "x", "context": "c", "question": "q", "answer": "a", **fields})


# --- file format ---------------------------------------------------------------------------------


def test_jsonl_round_trip_keeps_unicode_line_breaks_and_kind(tmp_path: Path) -> None:
    items = [
        TaskItem("a", "Zoë's café\nsecond line\u2028same row", "Où habite-t-elle ?", "Kraków", kind="facts"),
        TaskItem("b", "", "What is 2 + 2?", "4"),
    ]
    path = tmp_path / "tasks.jsonl"
    save_jsonl(items, path)
    assert load_jsonl(path) == items
    assert path.read_bytes().count(b"\n") == 2 and "Kraków" in path.read_text(encoding="utf-8")


def test_load_ignores_extra_keys_and_blank_lines(tmp_path: Path) -> None:
    path = tmp_path / "tasks.jsonl"
    path.write_text(
        "\n" + row(id="a", source="mine", kind="passkey") + "\n   \n" + row(id="b") + "\n", encoding="utf-8"
    )
    items = load_jsonl(path)
    assert [item.id for item in items] == ["a", "b"] and items[0].kind == "passkey" and items[1].kind == ""


BAD_ROWS = {
    "not-json": '{"id": "x", "context": ',
    "not-an-object": '["x", "c", "q", "a"]',
    "missing-answer": json.dumps({"id": "x", "context": "c", "question": "q"}),
    "number-answer": row(answer=48213),
    "null-context": row(context=None),
    "number-kind": row(kind=3),
    "blank-answer": row(answer="  "),
    "blank-answer-of-answer-metric": row(answer="", metric="answer"),
    "unknown-metric": row(metric="kl"),
    "number-metric": row(metric=1),
    "blank-id": row(id=""),
}


@pytest.mark.parametrize("bad", BAD_ROWS.values(), ids=BAD_ROWS.keys())
def test_bad_jsonl_line_names_the_file_and_line(tmp_path: Path, bad: str) -> None:
    path = tmp_path / "tasks.jsonl"
    path.write_text(row(id="ok") + "\n\n" + bad + "\n" + row(id="later") + "\n", encoding="utf-8")
    with pytest.raises(TaskFormatError, match=re.escape(f"{path}:3: ")):
        load_jsonl(path)


def test_duplicate_id_names_both_lines(tmp_path: Path) -> None:
    path = tmp_path / "tasks.jsonl"
    path.write_text("\n".join([row(id="a"), row(id="b"), row(id="a")]), encoding="utf-8")
    with pytest.raises(TaskFormatError, match=re.escape(f"{path}:3: duplicate id 'a', first at line 1")):
        load_jsonl(path)


def test_non_utf8_line_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "tasks.jsonl"
    latin1 = '{"id": "b", "context": "c", "question": "q", "answer": "café"}'.encode("latin-1")
    path.write_bytes(row(id="a").encode() + b"\n" + latin1 + b"\n")
    with pytest.raises(TaskFormatError, match=re.escape(f"{path}:2: not UTF-8")):
        load_jsonl(path)


def test_file_without_items_is_refused_as_a_heterofold_error(tmp_path: Path) -> None:
    path = tmp_path / "tasks.jsonl"
    path.write_text("\n  \n", encoding="utf-8")
    with pytest.raises(HeteroFoldError, match="no task items") as info:
        load_jsonl(path)
    assert isinstance(info.value, TaskFormatError)


def test_save_refuses_what_load_would_refuse_and_writes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "tasks.jsonl"
    with pytest.raises(TaskFormatError, match="duplicate id 'a'"):
        save_jsonl([TaskItem("a", "c", "q", "1"), TaskItem("a", "c", "q", "2")], path)
    with pytest.raises(TaskFormatError, match="'answer' is blank"):
        save_jsonl([TaskItem("a", "c", "q", " ")], path)
    with pytest.raises(TaskFormatError, match="'metric' must be one of answer, fidelity, got 'kl'"):
        save_jsonl([TaskItem("a", "c", "q", "", metric="kl")], path)
    assert not path.exists()


def test_unknown_metric_is_refused_naming_the_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "tasks.jsonl"
    path.write_text(row(id="a", metric="fidelity", answer="") + "\n" + row(id="b", metric="Fidelity"), encoding="utf-8")
    with pytest.raises(TaskFormatError, match=re.escape(f"{path}:2: field 'metric' must be one of answer, fidelity")):
        load_jsonl(path)


def test_fidelity_items_round_trip_with_a_blank_answer_and_answer_items_omit_the_metric(tmp_path: Path) -> None:
    items = [
        TaskItem("s", "some document", "Summarize the document in three sentences.", "", "summary", "fidelity"),
        TaskItem("f", "c", "q", "kept", metric="fidelity"),
        TaskItem("a", "c", "q", "48213", "passkey"),
    ]
    path = tmp_path / "tasks.jsonl"
    save_jsonl(items, path)
    assert load_jsonl(path) == items
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    assert [r.get("metric") for r in rows] == ["fidelity", "fidelity", None] and rows[0]["answer"] == ""
    path.write_text(row(answer="", metric="fidelity") + "\n", encoding="utf-8")
    assert load_jsonl(path) == [TaskItem("x", "c", "q", "", metric="fidelity")]


def test_builtin_suite_survives_a_file_round_trip(tmp_path: Path, suite: list[TaskItem]) -> None:
    path = tmp_path / "suite.jsonl"
    save_jsonl(suite, path)
    assert load_jsonl(path) == suite


# --- answer check --------------------------------------------------------------------------------


def test_is_correct_ignores_case_and_whitespace_layout() -> None:
    assert is_correct("New York", "I believe it is NEW\n   york.")
    assert is_correct("48213", "The pass key is 48213.")
    assert is_correct("  falcon ", "Falcon")
    assert is_correct("Zoë", "ZOË said so")


def test_is_correct_needs_the_whole_answer_in_order() -> None:
    assert not is_correct("48213", "The key is 4821 3.")
    assert not is_correct("New York", "York, New")
    assert not is_correct("Kraków", "Krakow")  # no accent folding


def test_blank_answer_is_never_correct() -> None:
    assert not is_correct("", "anything at all")
    assert not is_correct(" \n", "a b")


# --- built-in suite ------------------------------------------------------------------------------


def test_suite_is_deterministic_for_a_seed(suite: list[TaskItem]) -> None:
    assert builtin_suite(seed=0) == suite
    other = builtin_suite(seed=1)
    assert [item.id for item in other] == [item.id for item in suite]
    assert all(a.context != b.context for a, b in zip(other, suite, strict=True))


def test_items_do_not_depend_on_which_lengths_are_asked(suite: list[TaskItem]) -> None:
    assert builtin_suite(lengths=(1024,)) == [item for item in suite if "-1024-" in item.id]


def test_default_suite_has_every_kind_and_variant_at_every_length(suite: list[TaskItem]) -> None:
    variants = {"passkey": DEPTHS, "multikey": DEPTHS, "facts": DEPTHS, "handoff": HANDOFF_FACTS,
                "paraphrase": DEPTHS, "update": DEPTHS, "chain": DEPTHS,
                "summary": FIDELITY_VARIANTS, "continue": FIDELITY_VARIANTS}  # fmt: skip
    assert list(KINDS) == list(variants)
    expected = [f"{kind}-{n}-{v}-0" for kind, vs in variants.items() for n in LENGTHS for v in vs]
    assert [item.id for item in suite] == expected and len(suite) == 180
    assert all(item.kind == item.id.split("-")[0] for item in suite)
    assert LOOKUP_KINDS == ("passkey", "multikey", "facts", "handoff", "paraphrase", "update", "chain")
    assert FIDELITY_KINDS == ("summary", "continue")
    assert all(item.metric == ("fidelity" if item.kind in FIDELITY_KINDS else "answer") for item in suite)


def test_per_cell_gives_that_many_distinct_items_per_cell() -> None:
    items = builtin_suite(lengths=(512,), per_cell=2)
    assert len(items) == 90 and {item.id[-2:] for item in items} == {"-0", "-1"}
    assert len({item.context for item in items}) == 90
    with pytest.raises(ValueError):
        builtin_suite(per_cell=0)


def test_shortest_length_has_every_item_with_its_answer_in_context() -> None:
    # At 256 tokens a facts haystack has fewer line starts than needles: they share one.
    items = builtin_suite(lengths=(256,))
    assert len(items) == 45
    for item in items:
        assert item.answer.casefold() in item.context.casefold(), item.id
        assert bool(item.answer) == (item.metric == "answer"), item.id
        assert len(item.context) <= 256 * CHARS_PER_TOKEN, item.id


def test_answer_occurs_once_in_context_outside_the_passkey_needle(suite: list[TaskItem]) -> None:
    for item in (item for item in suite if item.metric == "answer"):
        count = item.context.casefold().count(item.answer.casefold())
        if item.kind == "passkey":
            assert count == 2, item.id
            assert f"The pass key is {item.answer}. Remember it. {item.answer} is the pass key." in item.context
        else:
            assert count == 1, item.id


def test_answer_is_not_in_the_question(suite: list[TaskItem]) -> None:
    for item in (item for item in suite if item.metric == "answer"):
        assert item.answer.casefold() not in item.question.casefold(), item.id


def test_same_question_gets_different_answers(suite: list[TaskItem]) -> None:
    passkeys = [item for item in suite if item.kind == "passkey"]
    assert {item.question for item in passkeys} == {"What is the pass key?"}
    assert len({item.answer for item in passkeys}) == len(passkeys)


def test_context_fits_its_target_length(suite: list[TaskItem]) -> None:
    for item in suite:
        target = int(item.id.split("-")[1]) * CHARS_PER_TOKEN
        assert 0.9 * target <= len(item.context) <= target, item.id


def test_asked_needle_sits_at_its_depth(suite: list[TaskItem]) -> None:
    # The new kinds place 4-7 longer sentences, which shift the asked one a little further at 512 tokens.
    tolerance = {"passkey": 0.05, "multikey": 0.05, "facts": 0.05, "paraphrase": 0.05, "update": 0.1, "chain": 0.1}
    for item in (item for item in suite if item.kind in tolerance):
        depth = int(item.id.split("-")[2].removeprefix("d")) / 100
        position = item.context.find(item.answer) / len(item.context)
        assert abs(position - depth) < tolerance[item.kind], (item.id, position)


def test_needles_sit_on_lines_of_their_own(suite: list[TaskItem]) -> None:
    for item in (item for item in suite if item.kind in (*NEEDLES, "handoff")):
        line = next(line for line in item.context.splitlines() if item.answer in line)
        if item.kind == "handoff":
            assert line.startswith("User: ") and line.endswith("."), item.id
        else:
            match = re.fullmatch(NEEDLES[item.kind], line)
            assert match and match.group(2) == item.answer, item.id


def test_multikey_has_four_distractors_and_word_and_number_answers(suite: list[TaskItem]) -> None:
    needle = re.compile(f"^{NEEDLES['multikey']}$", re.MULTILINE)
    answers = []
    for item in (item for item in suite if item.kind == "multikey"):
        needles = needle.findall(item.context)
        assert len(needles) == 5, item.id
        assert sum(value == item.answer for _, value in needles) == 1, item.id
        answers.append(item.answer)
    assert any(a.isdigit() for a in answers) and any(a.isalpha() for a in answers)


def test_facts_ask_one_attribute_of_one_of_three_people(suite: list[TaskItem]) -> None:
    fact = re.compile(f"^{NEEDLES['facts']}$", re.MULTILINE)
    for item in (item for item in suite if item.kind == "facts"):
        facts = fact.findall(item.context)
        people = {name for name, _ in facts}
        assert len(facts) == 12 and len(people) == 3, item.id
        asked = next(name for name, value in facts if value == item.answer)
        assert asked in item.question and item.answer.isalpha(), item.id


def test_handoff_states_the_asked_fact_in_an_early_user_turn(suite: list[TaskItem]) -> None:
    answers = {fact: [] for fact in HANDOFF_FACTS}
    for item in (item for item in suite if item.kind == "handoff"):
        lines = item.context.splitlines()
        turns = [line.split(":")[0] for line in lines if line.startswith(("User: ", "Assistant: "))]
        assert turns[0] == "User" and all(a != b for a, b in pairwise(turns)), item.id
        fact_line = next(i for i, line in enumerate(lines) if item.answer in line)
        assert fact_line < lines.index('"""') and fact_line < 14, item.id
        assert item.context.count('"""') >= 2, item.id
        answers[item.id.split("-")[2]].append(item.answer)
    assert all(a.isdigit() for a in answers["budget"] + answers["guests"])
    assert all(a.isalpha() for a in answers["destination"] + answers["venue"] + answers["contact"])
