"""Probe: could a rule read off the question tell a paraphrased look-up from a whole-context prompt?

    python -m bench.auto_rule [--length 1024] [--json OUT]

The served ``auto`` path quotes a hop when lexical confidence (``engines.selectors.lexical_confidence``)
reaches ``GATE`` and maps it otherwise; a paraphrase (no shared content word) falls on the mapped
side with "Summarize the document" and "Continue the text", though quote answers one more
paraphrase on three of six directions at 1K (BENCHMARKS.md, "One path per hop"). This prints, per builtin
item, the signals a rule could read with no model run:

- ``lexical``: lexical's confidence (the served rule's signal);
- ``meaning z``: how far the ``meaning`` ranker's best sentence stands above the others, (best -
  mean) / standard deviation of its sentence scores: one sentence that means what the question
  asks, against a question that matches a little of everything;
- ``meaning top/2nd``: the best sentence's score over the second's;
- ``request detail``: ``engines.request_kind``'s probability that the request asks for one detail
  (the question alone, no context; a classifier fitted on generic requests, not on these items:
  the served rule reads it at 0.5, not at a threshold fitted here);

then, per signal, the fewest paraphrase vs summary/continue items that any one threshold puts on
the wrong side (0: the signal separates them on these items). Sentences and words come from the
item's context text (sentences as ``heterofold.select.sentence_spans`` cuts them, whitespace words
standing in for tokens: the scores read sentences and words only), the question as the item asks it.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from pathlib import Path
from typing import Any

from engines.lexicon import lexicon
from engines.request_kind import RequestKind, request_kind
from heterofold.select import WordVectors, lexical, meaning, spans_of
from heterofold.suite import builtin_suite

SIGNALS = ("lexical", "meaning z", "meaning top/2nd", "request detail")
QUOTE_SIDE, MAP_SIDE = ("paraphrase",), ("summary", "continue")


def signals(question: str, context: str, vectors: WordVectors, kind: RequestKind | None = None) -> dict[str, float]:
    """The signals of one question over one context (module docstring); ``request detail`` only
    with the request classifier ``kind``."""
    view = spans_of(context, [(m.start(), m.end()) for m in re.finditer(r"\S+", context)])
    ranking = meaning(question, vectors)(view)
    scores = sorted(ranking.scores or [0.0], reverse=True)
    spread = statistics.pstdev(scores) if len(scores) > 1 else 0.0
    second = scores[1] if len(scores) > 1 else 0.0
    return {
        "lexical": round(lexical(question)(view).confidence or 0.0, 3),
        "meaning z": round((scores[0] - statistics.mean(scores)) / spread, 2) if spread else 0.0,
        "meaning top/2nd": round(scores[0] / second, 3) if second > 0 else 0.0,
    } | ({} if kind is None else {"request detail": round(kind.p_detail(question), 3)})


def misplaced(high: list[float], low: list[float], t: float) -> int:
    """How many items the threshold ``t`` misplaces, ``high`` wanted >= t and ``low`` below it."""
    return sum(h < t for h in high) + sum(v >= t for v in low)


def best_cut(high: list[float], low: list[float]) -> float:
    """The lowest threshold that misplaces the fewest items (``misplaced``)."""
    cuts = [*sorted(set(high) | set(low)), float("inf")]
    return min(cuts, key=lambda t: (misplaced(high, low, t), t))


def fewest_wrong(high: list[float], low: list[float]) -> int:
    """The fewest items any threshold misplaces."""
    return misplaced(high, low, best_cut(high, low))


def write_result(path: Path | None, result: dict[str, Any]) -> None:
    """A probe's result as JSON at ``path`` (its folder made), when one is given."""
    if path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=1))
        print(f"wrote {path}")


def probe(length: int) -> dict[str, Any]:
    vectors = lexicon()
    kind = request_kind()
    rows: list[dict[str, Any]] = []
    for item in builtin_suite(lengths=(length,), per_cell=1):
        rows.append({"id": item.id, "kind": item.kind, **signals(item.question, item.context, vectors, kind)})
    by_kind: dict[str, dict[str, list[float]]] = {}
    for row in rows:
        for sig in SIGNALS:
            by_kind.setdefault(row["kind"], {}).setdefault(sig, []).append(row[sig])
    ranges = {kind: {sig: [min(v), max(v)] for sig, v in sigs.items()} for kind, sigs in by_kind.items()}
    side = {kinds: [r for r in rows if r["kind"] in kinds] for kinds in (QUOTE_SIDE, MAP_SIDE)}
    wrong = {sig: fewest_wrong([r[sig] for r in side[QUOTE_SIDE]], [r[sig] for r in side[MAP_SIDE]]) for sig in SIGNALS}
    return {"length": length, "items": rows, "ranges": ranges, "fewest_wrong": wrong,
            "pairs": sum(r["kind"] in QUOTE_SIDE + MAP_SIDE for r in rows)}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--length", type=int, default=1024)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    result = probe(args.length)
    print(f"{'kind':12s} " + " ".join(f"{s:>17s}" for s in SIGNALS))
    for kind, sigs in result["ranges"].items():
        print(f"{kind:12s} " + " ".join(f"{lo:>8.2f}-{hi:<8.2f}" for lo, hi in sigs.values()))
    print(f"fewest of the {result['pairs']} paraphrase / summary / continue items misplaced by one threshold:")
    for sig, n in result["fewest_wrong"].items():
        print(f"  {sig}: {n}")
    write_result(args.json, result)


if __name__ == "__main__":
    main()
