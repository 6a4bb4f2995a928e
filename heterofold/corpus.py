"""Offline text read at run time: the docstrings of Python's standard library, and a user's corpus.

No third-party text is committed; this is real English prose and code commentary that every
Python installation carries, in a fixed module order so that the same Python gives the same text.
``distill_contexts`` cuts runs of them for distillation; ``corpus_from_file`` cuts a user's text
into chunks for fitting.
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


def distill_contexts(seed: int = 0, docs: int = 16, chars: int = 3600) -> list[str]:
    """Contexts for distillation: runs of stdlib docstrings of about ``chars`` characters, from
    the far end of the docstring list (the eval haystack draws from all of it at random)."""
    stdlib = stdlib_docstrings()
    texts = []
    for i in range(docs):
        start = (len(stdlib) - 1 - (seed * 7919 + i * 37)) % len(stdlib)
        parts: list[str] = []
        while sum(len(p) + 2 for p in parts) < chars:
            parts.append(stdlib[(start + len(parts)) % len(stdlib)])
        texts.append("\n\n".join(parts)[:chars].rsplit(" ", 1)[0])
    return texts


def corpus_from_file(path: str, chunk_chars: int = 4000) -> list[str]:
    """A user corpus: plain UTF-8 text cut at paragraph breaks into chunks of about ``chunk_chars``."""
    with open(path, encoding="utf-8") as f:
        paragraphs = [p for p in f.read().split("\n\n") if p.strip()]
    texts, current = [], ""
    for p in paragraphs:
        current = f"{current}\n\n{p}" if current else p
        if len(current) >= chunk_chars:
            texts.append(current)
            current = ""
    if current:
        texts.append(current)
    return texts
