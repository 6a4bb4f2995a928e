"""Evaluation items, their JSONL file format, and the answer check.

An item is scored by one of two metrics (``TaskItem.metric``):

- ``"answer"``: the output must contain the item's answer (``is_correct``).
- ``"fidelity"``: there is no answer string; the receiver's next-token distributions over native's
  whole answer are compared with native's own (KL, top-1 agreement) by the evaluation, not here.

A task file holds one JSON object per line::

    {"id": "passkey-1024-d50-0", "context": "...", "question": "What is the pass key?", "answer": "48213",
     "kind": "passkey"}
    {"id": "summary-1024-v0-0", "context": "...", "question": "Summarize the document in three sentences.",
     "answer": "", "kind": "summary", "metric": "fidelity"}

``id``, ``context``, ``question`` and ``answer`` are required strings; ``id`` and ``question`` must
not be blank, and neither may ``answer`` unless the metric is ``"fidelity"`` (an empty answer would
be found in every output); an empty ``context`` is allowed. ``kind`` is an optional string;
``metric`` is optional, ``"answer"`` (the default) or ``"fidelity"``; any other key is ignored. Blank
lines are skipped. Ids are unique within a file. Anything else raises ``TaskFormatError`` naming the
file and the 1-based line. ``save_jsonl`` writes ``metric`` only for fidelity items, so answer items
read as before. The built-in suite lives in ``heterofold.suite``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass

from heterofold.errors import TaskFormatError

METRICS = ("answer", "fidelity")
_REQUIRED = ("id", "context", "question", "answer")
_NOT_BLANK = ("id", "question")


@dataclass(frozen=True)
class TaskItem:
    """One question over one context, with the answer a correct output must contain.

    ``metric`` is ``"answer"`` (score by ``is_correct``) or ``"fidelity"`` (score against native's
    own answer; ``answer`` is then normally ``""``). See the module docstring.
    """

    id: str
    context: str
    question: str
    answer: str
    kind: str = ""
    metric: str = "answer"


def is_correct(answer: str, output: str) -> bool:
    """Whether ``answer`` occurs in ``output`` as a substring, ignoring case and whitespace layout.

    Both strings are case-folded and every run of whitespace becomes one space (leading and trailing
    whitespace dropped), so "New  York" matches "the answer is new york." A substring, not a word:
    "48213" is found in "key48213" and "red" in "bored"; the built-in suite draws its answers so
    that this does not matter. A blank answer is never correct.
    """
    needle = _normalise(answer)
    return bool(needle) and needle in _normalise(output)


def _normalise(text: str) -> str:
    return " ".join(text.casefold().split())


def load_jsonl(path: str | os.PathLike[str]) -> list[TaskItem]:
    """Read a task file. Raises ``TaskFormatError`` (with ``file:line``) on any malformed row.

    A missing or unreadable file raises the ``OSError`` of ``open``.
    """
    items: list[TaskItem] = []
    first_line: dict[str, int] = {}
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, start=1):
            where = f"{os.fspath(path)}:{lineno}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise TaskFormatError(f"{where}: not UTF-8 ({exc.reason})") from exc
            if not line.strip():
                continue
            item = _parse_row(line, where)
            if item.id in first_line:
                raise TaskFormatError(f"{where}: duplicate id {item.id!r}, first at line {first_line[item.id]}")
            first_line[item.id] = lineno
            items.append(item)
    if not items:
        raise TaskFormatError(f"{os.fspath(path)}: no task items")
    return items


def _parse_row(line: str, where: str) -> TaskItem:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as exc:
        raise TaskFormatError(f"{where}: not JSON ({exc.msg} at column {exc.colno})") from exc
    if not isinstance(row, dict):
        raise TaskFormatError(f"{where}: expected a JSON object, got {type(row).__name__}")
    for key in _REQUIRED:
        if key not in row:
            raise TaskFormatError(f"{where}: missing field {key!r}")
    for key in (*_REQUIRED, "kind", "metric"):
        if key in row and not isinstance(row[key], str):
            raise TaskFormatError(f"{where}: field {key!r} must be a string, got {type(row[key]).__name__}")
    item = TaskItem(
        row["id"], row["context"], row["question"], row["answer"], row.get("kind", ""), row.get("metric", "answer")
    )
    problem = _problem(item)
    if problem:
        raise TaskFormatError(f"{where}: {problem}")
    return item


def _problem(item: TaskItem) -> str | None:
    """Why ``load_jsonl`` refuses ``item``, or None."""
    if item.metric not in METRICS:
        return f"field 'metric' must be one of {', '.join(METRICS)}, got {item.metric!r}"
    for key in (*_NOT_BLANK, *(("answer",) if item.metric == "answer" else ())):
        if not getattr(item, key).strip():
            return f"field {key!r} is blank"
    return None


def save_jsonl(items: Iterable[TaskItem], path: str | os.PathLike[str]) -> None:
    """Write ``items`` one JSON object per line (UTF-8, non-ASCII kept), in the order given.

    Refuses, with ``TaskFormatError`` and before writing anything, items that ``load_jsonl`` would
    refuse: a duplicate id, a blank id or question, an unknown metric, or a blank answer to an
    ``"answer"`` item. ``metric`` is written only when it is ``"fidelity"``.
    """
    items = list(items)
    seen: set[str] = set()
    for n, item in enumerate(items):
        problem = _problem(item)
        if problem:
            raise TaskFormatError(f"item {n} ({item.id!r}): {problem}")
        if item.id in seen:
            raise TaskFormatError(f"item {n}: duplicate id {item.id!r}")
        seen.add(item.id)
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for item in items:
            row = {"id": item.id, "context": item.context, "question": item.question, "answer": item.answer}
            if item.kind:
                row["kind"] = item.kind
            if item.metric != "answer":
                row["metric"] = item.metric
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
