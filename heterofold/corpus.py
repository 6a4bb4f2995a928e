"""Offline text read at run time: the docstrings of Python's standard library.

No third-party text is committed; this is real English prose and code commentary that every
Python installation carries, in a fixed module order so that the same Python gives the same text.
"""

from __future__ import annotations

import importlib
import inspect

STDLIB_MODULES = (
    "textwrap", "json", "argparse", "collections", "functools", "itertools", "pathlib", "string",
    "datetime", "decimal", "fractions", "statistics", "heapq", "bisect", "csv", "logging", "shutil",
    "tempfile", "difflib", "calendar",
)  # fmt: skip


def stdlib_docstrings(modules: tuple[str, ...] = STDLIB_MODULES) -> list[str]:
    """Module, class and function docstrings, one per entry, in definition order."""
    docs: list[str] = []
    for name in modules:
        module = importlib.import_module(name)
        seen = set()
        for obj in (module, *vars(module).values()):
            doc = inspect.getdoc(obj) if (obj is module or getattr(obj, "__module__", None) == name) else None
            if doc and len(doc) > 80 and doc not in seen:
                seen.add(doc)
                docs.append(doc)
    return docs


def stdlib_text(min_chars: int, *, start: int = 0) -> str:
    """At least ``min_chars`` of docstrings joined by blank lines, starting at docstring ``start``."""
    docs = stdlib_docstrings()
    parts: list[str] = []
    total, i = 0, start
    while total < min_chars:
        doc = docs[i % len(docs)]
        parts.append(doc)
        total += len(doc) + 2
        i += 1
    return "\n\n".join(parts)
