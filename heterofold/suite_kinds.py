"""Makers of the built-in suite's whole-context kinds: ``paraphrase``, ``update``, ``chain``, ``summary``, ``continue``.

A maker has the shape of ``heterofold.suite.Maker``: ``(rng, docs, n_chars, variant)`` gives
``(context, question, answer, copies of the answer in the context)``. The shapes and depth rules of
each kind are written down in ``heterofold.suite``; the tables below hold their wording.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable

from heterofold.select import _words
from heterofold.suite_text import CITIES, clip, depth, people, scatter

# (needle with {obj} and {value}, question with {syn}, value kind, ((needle object, question synonym), ...)).
# No content word of a needle shares a stem with its question: only the meaning links them.
PARAPHRASES = (
    ("To open the {obj}, enter {value}.", "What is the code for the {syn}?", "number", (
        ("strongbox", "safe"), ("wardrobe", "closet"), ("cellar", "basement"), ("attic", "loft"),
        ("mailbox", "letterbox"), ("suitcase", "luggage"),
    )),
    ("The {obj} was painted {value}.", "What colour is the {syn}?", "paint", (
        ("automobile", "car"), ("bicycle", "bike"), ("sofa", "couch"), ("fridge", "refrigerator"),
        ("front door", "entrance"), ("lorry", "truck"),
    )),
    ("The {obj} belongs to {value}.", "Who owns the {syn}?", "person", (
        ("rucksack", "backpack"), ("laptop", "computer"), ("spectacles", "glasses"), ("automobile", "car"),
        ("kitten", "cat"), ("bicycle", "bike"),
    )),
    ("The {obj} departs at {value}.", "At what time does the {syn} leave?", "time", (
        ("ferry", "boat"), ("coach", "bus"), ("flight", "plane"), ("tram", "streetcar"), ("taxi", "cab"),
    )),
)  # fmt: skip
# topic: (first statement, the later change, question, value kind); {value} is the old or the new value.
# The change and the question repeat the statement's words and say "change of plan", so that a model
# that reads both sentences can tell which one holds; the old value stays in the context as the lure.
UPDATES = {
    "day": ("The quarterly review is scheduled for {value}.",
            "Change of plan: the quarterly review is now scheduled for {value}.",
            "After the change of plan, on which day is the quarterly review scheduled?", "weekday"),
    "room": ("The design workshop will be held in room {value}.",
             "Change of plan: the design workshop will now be held in room {value}.",
             "After the change of plan, in which room will the design workshop be held?", "room"),
    "city": ("The annual sales conference will take place in {value}.",
             "Change of plan: the annual sales conference will now take place in {value}.",
             "After the change of plan, in which city will the annual sales conference take place?", "city"),
    "time": ("The weekly board call starts at {value}.",
             "Change of plan: the weekly board call now starts at {value}.",
             "After the change of plan, at what time does the weekly board call start?", "time"),
    "speaker": ("The keynote at the spring gala will be given by {value}.",
                "Change of plan: the keynote at the spring gala will now be given by {value}.",
                "After the change of plan, who will give the keynote at the spring gala?", "person"),
}  # fmt: skip
RELATIONS = ("cousin", "neighbour", "mentor", "flatmate", "business partner", "landlord", "dentist")
PAINTS = ("crimson", "olive", "salmon", "mauve", "khaki", "scarlet", "beige", "lilac", "navy", "apricot")
WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday")
FIDELITY_VARIANTS = ("v0", "v1", "v2", "v3", "v4")
SUMMARY_QUESTION = "Summarize the document in three sentences."
CONTINUE_QUESTION = "Continue the text from where it stops."
_SENTENCE_START = re.compile(r"^(?=\S)|(?<=[.!?] )(?=[A-Z])", re.MULTILINE)
FAR = 0.5  # how far apart (share of the haystack) the two sentences of an update or a chain are placed


def paraphrase(rng: random.Random, docs: list[str], n_chars: int, variant: str) -> tuple[str, str, str, int]:
    """The asked needle and two distractors, one from each of two other templates (so the question's
    template occurs once: the tiny receivers cannot tell same-template objects apart by synonym);
    the question names a synonym of the asked object."""
    asked = rng.choice(PARAPHRASES)
    others = rng.sample([t for t in PARAPHRASES if t is not asked], 2)
    needles, values = [], []
    for template, _, kind, objects in (asked, *others):
        obj = rng.choice(objects)
        (value,) = VALUES[kind](rng, 1)
        needles.append(template.format(obj=obj[0], value=value))
        values.append(value)
        if template is asked[0]:
            question = asked[1].format(syn=obj[1])
    shared = _stems(question) & {stem for needle in needles for stem in _stems(needle)}
    if shared:  # a table bug, not bad luck: no redraw would help
        raise RuntimeError(f"paraphrase question {question!r} shares stems {sorted(shared)} with its needles")
    placed = [(depth(variant), needles[0])] + [(rng.uniform(0.05, 0.95), n) for n in needles[1:]]
    return scatter(rng, docs, n_chars, placed), question, values[0], 1


def update(rng: random.Random, docs: list[str], n_chars: int, variant: str) -> tuple[str, str, str, int]:
    """A fact, its later change at the variant's depth, and 1-2 other facts stated once."""
    asked, *others = rng.sample(sorted(UPDATES), 1 + rng.randint(1, 2))
    first, change, question, kind = UPDATES[asked]
    old, new = VALUES[kind](rng, 2)
    later = depth(variant)
    placed = [(later, change.format(value=new)), (max(0.0, later - FAR), first.format(value=old))]
    for topic in others:
        statement, _, _, other_kind = UPDATES[topic]
        placed.append((rng.uniform(0.05, 0.95), statement.format(value=VALUES[other_kind](rng, 1)[0])))
    return scatter(rng, docs, n_chars, placed), question, new, 1


def chain(rng: random.Random, docs: list[str], n_chars: int, variant: str) -> tuple[str, str, str, int]:
    """Two hops far apart (the second at the variant's depth), and two distractor pairs of the same shape."""
    asker, target, other, stranger, stranger_target = people(rng, 5)
    relation, other_relation = rng.sample(RELATIONS, 2)
    city, other_city, stranger_city = rng.sample(CITIES, 3)
    second = depth(variant)
    first = second + FAR if second < FAR else second - FAR
    placed = [(second, f"{target} lives in {city}."), (first, f"{asker}'s {relation} is {target}.")]
    distractors = [
        f"{asker}'s {other_relation} is {other}.", f"{other} lives in {other_city}.",
        f"{stranger}'s {relation} is {stranger_target}.", f"{stranger_target} lives in {stranger_city}.",
    ]  # fmt: skip
    placed += [(rng.uniform(0.05, 0.95), sentence) for sentence in distractors]
    return scatter(rng, docs, n_chars, placed), f"In which city does {asker}'s {relation} live?", city, 1


def summary(rng: random.Random, docs: list[str], n_chars: int, variant: str) -> tuple[str, str, str, int]:
    """A docstring run to summarise; no answer."""
    return clip(_run(rng, docs, variant, n_chars), n_chars), SUMMARY_QUESTION, "", 0


def continue_(rng: random.Random, docs: list[str], n_chars: int, variant: str) -> tuple[str, str, str, int]:
    """A docstring run cut at the last space inside a line that does not end a sentence; no answer."""
    text = _run(rng, docs, variant, n_chars)
    cut = max(m.start() for m in re.finditer(r"(?<=[^\s.!?:]) (?=\S)", text[: n_chars + 1]))
    return text[:cut], CONTINUE_QUESTION, "", 0


def _run(rng: random.Random, docs: list[str], variant: str, n_chars: int) -> str:
    """More than ``n_chars`` of consecutive docstrings from a random line or sentence start in the
    variant's fifth of the corpus, so that a cell's five variants never coincide."""
    fifth, n_variants = FIDELITY_VARIANTS.index(variant), len(FIDELITY_VARIANTS)
    starts = [
        (i, m.start())
        for i in range(fifth * len(docs) // n_variants, (fifth + 1) * len(docs) // n_variants)
        for m in _SENTENCE_START.finditer(docs[i])
    ]
    first, offset = rng.choice(starts)
    run = [docs[first][offset:]]
    while sum(len(doc) + 2 for doc in run) <= n_chars:
        run.append(docs[(first + len(run)) % len(docs)])
    return "\n\n".join(run)


def _numbers(rng: random.Random, n: int) -> list[str]:
    return [str(v) for v in rng.sample(range(10000, 100000), n)]


def _rooms(rng: random.Random, n: int) -> list[str]:
    return [f"{rng.choice('ABCDEFGH')}{v}" for v in rng.sample(range(100, 1000), n)]


def _times(rng: random.Random, n: int) -> list[str]:
    """Clock times from 10:00 to 21:55, two-digit hours so that "09:15" against "9:15" never arises."""
    return [f"{m // 60}:{m % 60:02d}" for m in rng.sample(range(600, 1320, 5), n)]


# value kind: draws n distinct values
VALUES: dict[str, Callable[[random.Random, int], list[str]]] = {
    "number": _numbers,
    "paint": lambda rng, n: rng.sample(PAINTS, n),
    "person": people,
    "time": _times,
    "weekday": lambda rng, n: rng.sample(WEEKDAYS, n),
    "room": _rooms,
    "city": lambda rng, n: rng.sample(CITIES, n),
}


def _stems(text: str) -> set[str]:
    return {stem for stem, _, _ in _words(text, 0, len(text))}
