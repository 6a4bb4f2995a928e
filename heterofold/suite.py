"""The built-in evaluation suite: seeded synthetic long-context tasks over a stdlib-docstring haystack.

Nine kinds (``KINDS``), each at every length in ``lengths`` and in five variants, ``per_cell`` items
per (kind, length, variant). The default (4 lengths, ``per_cell=1``) is 9 x 4 x 5 = 180 items, 20 per
kind; ``kinds=`` picks some of them.

Lexical kinds: the question repeats the words of the one sentence that answers it.

- ``passkey``: "The pass key is 48213. Remember it. 48213 is the pass key." on a line of its own at
  depth 10, 30, 50, 70 or 90% (variants ``d10`` .. ``d90``); the answer is the 5-digit key.
- ``multikey``: five needles such as "The code word for the amber gate is falcon." or "The access
  number for the jade tower is 4821."; the asked one sits at the variant's depth, the other four are
  distractors at random depths. Each needle is a word or a number by a coin flip.
- ``facts``: four facts (city, job, favourite colour, pet) about each of three invented people, one
  sentence each at random depths; the asked fact sits at the variant's depth. Answers are words.
- ``handoff``: a "User: ...\\nAssistant: ..." transcript planning a company retreat. The early turns
  state five facts (destination city, budget, venue, head count, contact person) in a random order;
  later turns quote stdlib docstrings as documents. The variant names the fact asked as the hop's
  new message: ``destination``, ``budget``, ``venue``, ``guests`` or ``contact``.

Whole-context kinds (``heterofold.suite_kinds``): quoting the sentence that best matches the
question is not enough.

- ``paraphrase``: three needles of three templates, e.g. "To open the strongbox, enter 34344.",
  "The sofa was painted navy.", "The ferry departs at 13:25."; the question names the asked
  object by a synonym ("What is the code for the safe?") and shares no content-word stem
  (``heterofold.select``'s stemmer) with any needle. (With 3-4 same-template distractors neither
  tiny receiver answered natively.) The asked needle sits at the variant's depth (``d10`` ..
  ``d90``), the distractors at random depths.
  Answers are 5-digit codes, colours, full names or clock times ("14:35").
- ``update``: a fact ("The quarterly review is scheduled for Tuesday."), then its change ("Change
  of plan: the quarterly review is now scheduled for Friday.") at the variant's depth D; the first
  statement sits at depth max(0, D - 0.5), so at the very start for ``d10`` and ``d30`` and half the
  context earlier otherwise. One or two other topics are stated once, at random depths. The answer
  is the new value; the old one is in the context too.
- ``chain``: "Amara Drummond's cousin is Priya Holloway." and "Priya Holloway lives in Tbilisi.";
  the question ("In which city does Amara Drummond's cousin live?") needs both. The second hop sits
  at the variant's depth D, the first at D + 0.5 (``d10``, ``d30``: after it) or D - 0.5 (before
  it), so at least 30% of the context apart. Distractors: the asker's other relation and where that
  person lives, and another person with the same relation and where that one lives.
- ``summary`` and ``continue``: fidelity kinds (``TaskItem.metric == "fidelity"``, answer ``""``),
  scored elsewhere by how close the receiver's next-token distributions stay to native's over
  native's whole answer. ``summary`` is a docstring run with "Summarize the document in three
  sentences."; ``continue`` is a docstring run that stops mid-line, after a word that does not end a
  sentence, with "Continue the text from where it stops.". Variants ``v0`` .. ``v4`` start at a
  random line or sentence start in each fifth of the corpus, so that they never coincide.

Ids read ``{kind}-{length}-{variant}-{index}``, e.g. ``passkey-1024-d50-0``. ``LOOKUP_KINDS`` are
the kinds scored by their answer, ``FIDELITY_KINDS`` the others.

Lengths are targets in tokens, turned into characters at ``CHARS_PER_TOKEN = 4`` (a rule of thumb
for English with BPE tokenizers; docstrings with code run denser, so real token counts come out
somewhat above the target). Every context is at most the target and at least 90% of it, in
characters (from 512 tokens on: at 256 a ``handoff`` transcript may fall short).

Every answer, case-folded, occurs in the context only inside its own needle (once; twice in the
passkey needle), never in another needle or the haystack, and never in the question. Values that
break this are drawn again.

Each item comes from its own ``random.Random`` seeded by (seed, kind, length, variant, index), so an
item does not depend on which lengths or kinds were asked. The haystack is the running Python's
stdlib (``heterofold.corpus``): the same seed gives the same suite on the same Python version.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import NamedTuple

from heterofold import suite_kinds
from heterofold.corpus import stdlib_docstrings
from heterofold.suite_text import CITIES, FIRST_NAMES, SURNAMES, clip, depth, people, scatter
from heterofold.tasks import TaskItem

CHARS_PER_TOKEN = 4
MIN_FILL = 0.9  # a context holds at least this share of its target characters
DEPTHS = ("d10", "d30", "d50", "d70", "d90")
HANDOFF_FACTS = ("destination", "budget", "venue", "guests", "contact")
_ATTEMPTS = 100

JOBS = (
    "cartographer", "beekeeper", "glassblower", "locksmith", "violinist", "blacksmith", "perfumer", "falconer",
    "puppeteer", "stonemason", "luthier", "archivist", "sommelier", "milliner", "astronomer", "upholsterer",
)  # fmt: skip
COLOURS = (
    "turquoise", "magenta", "vermilion", "chartreuse", "lavender", "ochre", "indigo", "maroon", "cerulean",
    "burgundy", "periwinkle", "tangerine", "emerald", "mustard",
)  # fmt: skip
PETS = (
    "tortoise", "parrot", "hedgehog", "ferret", "iguana", "chinchilla", "axolotl", "gecko", "tarantula",
    "alpaca", "cockatoo", "salamander", "hamster", "rabbit",
)  # fmt: skip
CODE_WORDS = (
    "falcon", "juniper", "marigold", "walrus", "nutmeg", "zeppelin", "obsidian", "pelican", "mandolin",
    "thistle", "quokka", "glacier", "sycamore", "paprika", "harpoon", "kumquat", "albatross", "bramble",
    "cinnamon", "dragonfly", "tamarind", "monsoon", "porcupine", "lantern",
)  # fmt: skip
ADJECTIVES = ("amber", "silver", "crimson", "ivory", "cobalt", "jade", "scarlet", "copper")
PLACES = ("gate", "tower", "bridge", "harbour", "cellar", "orchard", "lighthouse", "library")
VENUE_PARTS = (
    ("Heron", "Bramble", "Copper", "Willow", "Thorn", "Raven", "Moss", "Lark"),
    ("mere", "wick", "ford", "hollow", "stead", "combe", "holt", "garth"),
)

# attribute: (values, fact sentence, question); "{a}" is the value's indefinite article
PERSON_FACTS = {
    "city": (CITIES, "{name} lives in {value}.", "Where does {name} live?"),
    "job": (JOBS, "{name} works as {a} {value}.", "What does {name} do for work?"),
    "colour": (COLOURS, "{name}'s favourite colour is {value}.", "What is {name}'s favourite colour?"),
    "pet": (PETS, "{name} has a pet {value}.", "What kind of pet does {name} have?"),
}

# A maker draws (context, question, answer, copies of the answer in its needle) for a target size in characters;
# a fidelity kind's maker gives the answer "" and 0 copies.
Maker = Callable[[random.Random, list[str], int, str], tuple[str, str, str, int]]


def builtin_suite(
    *,
    seed: int = 0,
    lengths: tuple[int, ...] = (512, 1024, 2048, 4096),
    per_cell: int = 1,
    kinds: tuple[str, ...] | None = None,
) -> list[TaskItem]:
    """The built-in items (module docstring), grouped by kind in the order of ``KINDS``, then length, then variant.

    ``kinds`` names the kinds to make, None for all; the order it names them in does not matter.
    Raises ``ValueError`` for an unknown kind, a ``per_cell`` below 1 or a length below 256 tokens.
    """
    if per_cell < 1:
        raise ValueError(f"per_cell must be at least 1, got {per_cell}")
    if any(length < 256 for length in lengths):
        raise ValueError(f"lengths must be at least 256 tokens, got {lengths}")
    unknown = sorted(set(kinds or ()) - set(KINDS))
    if unknown:
        raise ValueError(f"unknown task kinds {unknown}; known: {', '.join(KINDS)}")
    docs = stdlib_docstrings()
    items = []
    for name, kind in KINDS.items():
        if kinds is not None and name not in kinds:
            continue
        for length in lengths:
            for variant in kind.variants:
                for index in range(per_cell):
                    rng = random.Random(f"{seed}/{name}/{length}/{variant}/{index}")
                    context, question, answer = _draw(kind.make, rng, docs, length * CHARS_PER_TOKEN, variant)
                    item_id = f"{name}-{length}-{variant}-{index}"
                    items.append(TaskItem(item_id, context, question, answer, name, kind.metric))
    return items


def _draw(make: Maker, rng: random.Random, docs: list[str], n_chars: int, variant: str) -> tuple[str, str, str]:
    for _ in range(_ATTEMPTS):
        context, question, answer, copies = make(rng, docs, n_chars, variant)
        key = answer.casefold()
        if not key:  # a fidelity item: no answer to keep unique
            return context, question, answer
        if context.casefold().count(key) == copies and key not in question.casefold():
            return context, question, answer
    raise RuntimeError(f"no unique answer after {_ATTEMPTS} draws ({make.__name__}, {variant})")


def _passkey(rng: random.Random, docs: list[str], n_chars: int, variant: str) -> tuple[str, str, str, int]:
    key = str(rng.randint(10000, 99999))
    needle = f"The pass key is {key}. Remember it. {key} is the pass key."
    return scatter(rng, docs, n_chars, [(depth(variant), needle)]), "What is the pass key?", key, 2


def _multikey(rng: random.Random, docs: list[str], n_chars: int, variant: str) -> tuple[str, str, str, int]:
    objects = rng.sample([(adj, place) for adj in ADJECTIVES for place in PLACES], 5)
    words = rng.sample(CODE_WORDS, 5)
    needles, questions, answers = [], [], []
    for (adj, place), word in zip(objects, words, strict=True):
        what, value = ("code word", word) if rng.random() < 0.5 else ("access number", str(rng.randint(1000, 9999)))
        needles.append(f"The {what} for the {adj} {place} is {value}.")
        questions.append(f"What is the {what} for the {adj} {place}?")
        answers.append(value)
    placed = [(depth(variant), needles[0])] + [(rng.uniform(0.05, 0.95), n) for n in needles[1:]]
    return scatter(rng, docs, n_chars, placed), questions[0], answers[0], 1


def _facts(rng: random.Random, docs: list[str], n_chars: int, variant: str) -> tuple[str, str, str, int]:
    names = people(rng, 3)
    drawn = {attr: rng.sample(values, len(names)) for attr, (values, _, _) in PERSON_FACTS.items()}
    asked = rng.choice(list(PERSON_FACTS))
    sentences = {
        (p, attr): fact.format(name=name, value=drawn[attr][p], a="an" if drawn[attr][p][0] in "aeiou" else "a")
        for p, name in enumerate(names)
        for attr, (_, fact, _) in PERSON_FACTS.items()
    }
    target = sentences.pop((0, asked))
    placed = [(depth(variant), target)] + [(rng.uniform(0.05, 0.95), s) for s in sentences.values()]
    question = PERSON_FACTS[asked][2].format(name=names[0])
    return scatter(rng, docs, n_chars, placed), question, drawn[asked][0], 1


def _handoff(rng: random.Random, docs: list[str], n_chars: int, variant: str) -> tuple[str, str, str, int]:
    city, venue = rng.choice(CITIES), rng.choice(VENUE_PARTS[0]) + rng.choice(VENUE_PARTS[1])
    budget, guests = str(rng.randint(2000, 9999)), str(rng.randint(120, 480))
    first, last = rng.choice(FIRST_NAMES), rng.choice(SURNAMES)
    facts = {  # fact: (answer, the user's sentence that states it, the next hop's question)
        "destination": (city, f"We have settled on {city} as the destination for the retreat.",
                        "Which destination did we settle on for the retreat?"),
        "budget": (budget, f"The total budget is {budget} euros, travel included.",
                   "What total budget did I give you, in euros?"),
        "venue": (venue, f"We booked the {venue} Lodge as the venue.", "What is the name of the venue we booked?"),
        "guests": (guests, f"So far {guests} people have signed up to attend.",
                   "How many people have signed up to attend?"),
        "contact": (last, f"Our contact person at the lodge is {first} {last}.",
                    "What is the surname of our contact person at the lodge?"),
    }  # fmt: skip
    order = rng.sample(HANDOFF_FACTS, len(HANDOFF_FACTS))
    turns = [
        "User: I am organising our company retreat and would like your help keeping track of the details.",
        "Assistant: Happy to help. Tell me what has been decided so far.",
    ]
    for name in order:
        turns += [f"User: {facts[name][1]}", f"Assistant: {rng.choice(_ACKS)}"]
    context = "\n".join(turns)
    start = rng.randrange(len(docs))
    for k in range(len(docs)):
        lead, ack = rng.choice(_DOC_LEADS), rng.choice(_DOC_ACKS)
        frame = f'\nUser: {lead}\n"""\n\n"""\nAssistant: {ack}'
        room = n_chars - len(context) - len(frame)
        if room < 40:
            break
        doc = clip(docs[(start + k) % len(docs)], room)
        context += f'\nUser: {lead}\n"""\n{doc}\n"""\nAssistant: {ack}'
    answer, _, question = facts[variant]
    return context, question, answer, 1


_ACKS = (
    "Noted.", "Got it, I will keep that in mind.", "Thanks, that helps.", "Understood.",
    "Good, I have added that to the plan.",
)  # fmt: skip
_DOC_LEADS = (
    "Here is a document from the shared folder, for reference.", "Please read this document too; it may matter later.",
    "Another document I was sent:", "This came in from the IT team:",
)  # fmt: skip
_DOC_ACKS = (
    "Thanks, I have read it.", "Read it. Nothing in it changes the plan so far.", "Noted; I will keep it in mind.",
)  # fmt: skip


class Kind(NamedTuple):
    """A task kind: its variants, the maker of one item, and how its items are scored (``TaskItem.metric``)."""

    variants: tuple[str, ...]
    make: Maker
    metric: str = "answer"


KINDS: dict[str, Kind] = {
    "passkey": Kind(DEPTHS, _passkey),
    "multikey": Kind(DEPTHS, _multikey),
    "facts": Kind(DEPTHS, _facts),
    "handoff": Kind(HANDOFF_FACTS, _handoff),
    "paraphrase": Kind(DEPTHS, suite_kinds.paraphrase),
    "update": Kind(DEPTHS, suite_kinds.update),
    "chain": Kind(DEPTHS, suite_kinds.chain),
    "summary": Kind(suite_kinds.FIDELITY_VARIANTS, suite_kinds.summary, "fidelity"),
    "continue": Kind(suite_kinds.FIDELITY_VARIANTS, suite_kinds.continue_, "fidelity"),
}
LOOKUP_KINDS = tuple(name for name, kind in KINDS.items() if kind.metric == "answer")
FIDELITY_KINDS = tuple(name for name, kind in KINDS.items() if kind.metric == "fidelity")
