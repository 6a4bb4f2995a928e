"""Text that the built-in suite's task kinds share: invented names and cities, and the haystack.

The haystack is a run of consecutive stdlib docstrings (``heterofold.corpus``) from a random one
on; ``scatter`` puts needle sentences into it, each on a line of its own at a depth (0..1 of the
context). Everything here draws from the ``random.Random`` it is given, so an item stays a pure
function of its seed.
"""

from __future__ import annotations

import random
import re

FIRST_NAMES = (
    "Amara", "Bartholomew", "Chiara", "Dmitri", "Elif", "Fergus", "Haruto", "Ingrid", "Joaquín", "Kalani",
    "Leopold", "Mireille", "Nnamdi", "Oksana", "Priya", "Quentin", "Rosalind", "Søren", "Tamsin", "Zoë",
)  # fmt: skip
SURNAMES = (
    "Abernathy", "Brannigan", "Castellanos", "Drummond", "Eriksdottir", "Fairweather", "Grimaldi", "Holloway",
    "Ishikawa", "Kowalczyk", "Lindqvist", "Montgomery", "Nakamura", "Okonkwo", "Pemberton", "Quarshie",
    "Rasmussen", "Thackeray", "Whitlock", "Yilmaz",
)  # fmt: skip
CITIES = (
    "Valparaiso", "Tromso", "Montevideo", "Nairobi", "Tbilisi", "Ljubljana", "Ushuaia", "Marrakesh", "Cusco",
    "Zanzibar", "Reykjavik", "Hobart", "Antofagasta", "Bratislava", "Kathmandu", "Windhoek", "Yerevan", "Tallinn",
)  # fmt: skip


def people(rng: random.Random, n: int) -> list[str]:
    """``n`` invented full names, no first name or surname used twice."""
    return [f"{first} {last}" for first, last in zip(rng.sample(FIRST_NAMES, n), rng.sample(SURNAMES, n), strict=True)]


def depth(variant: str) -> float:
    """The depth a ``d10`` .. ``d90`` variant names, as a fraction of the context."""
    return int(variant.removeprefix("d")) / 100


def scatter(rng: random.Random, docs: list[str], n_chars: int, placed: list[tuple[float, str]]) -> str:
    """A haystack of ``n_chars`` in all with each needle on a line of its own at its depth (0..1).

    Needles go at line starts of the haystack, the nearest free one to each depth, in list order.
    A short haystack may have fewer line starts than needles: the rest then share the nearest one.
    """
    text = haystack(rng, docs, n_chars - sum(len(needle) + 1 for _, needle in placed))
    starts = [0] + [m.end() for m in re.finditer("\n", text)]
    at: dict[int, list[str]] = {}
    for where, needle in placed:
        near = sorted(range(len(starts)), key=lambda k: abs(starts[k] - where * len(text)))
        k = next((k for k in near if k not in at), near[0])
        at.setdefault(k, []).append(needle)
    parts: list[str] = []
    prev = 0
    for k in sorted(at):
        parts += [text[prev : starts[k]], *(needle + "\n" for needle in at[k])]
        prev = starts[k]
    parts.append(text[prev:])
    return "".join(parts).rstrip()


def haystack(rng: random.Random, docs: list[str], n_chars: int) -> str:
    """Consecutive docstrings from a random one on, joined by blank lines, clipped to ``n_chars``."""
    start, total = rng.randrange(len(docs)), 0
    parts: list[str] = []
    while total < n_chars:
        parts.append(docs[(start + len(parts)) % len(docs)])
        total += len(parts[-1]) + 2
    return clip("\n\n".join(parts), n_chars)


def clip(text: str, n_chars: int) -> str:
    """``text`` cut to at most ``n_chars``, at a line end if one is near, else at a space."""
    if len(text) <= n_chars:
        return text
    cut = text.rfind("\n", 0, n_chars + 1)
    if cut < n_chars - 120:
        cut = text.rfind(" ", 0, n_chars + 1)
    return text[: cut if cut > 0 else n_chars].rstrip()
