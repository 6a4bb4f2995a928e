"""Probe: how well does ``engines.request_kind`` tell a request for one detail from a request for the
whole document? No model run (word vectors only).

    python -m bench.request_kind [--lengths 1024,4096] [--json OUT]

- on its own training requests (``engines.request_examples``, generic, none of the suite's
  wording), leave-one-out: each request scored by a classifier fitted on the other 99;
- held out: the 60 requests of ``bench.request_heldout``, never fitted on, scored by the served
  classifier (fitted on all 100);
- on the builtin suite's items at each length, per kind, how many it reads as a detail, and how the
  served ``auto`` rule (lexical naming the sentence first, ``engines.selectors.auto_path``) would
  route them with the question alone: the paraphrases should go to ``quote``, the summaries and
  continuations to ``transfer``. Lexical confidence is re-read off the item's text (whitespace
  words for tokens, as ``bench.auto_rule`` reads it); the evaluation's own ``+auto`` path records
  the branch each item took.
- the classifier's time per request (after the fit).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

from bench.auto_rule import signals, write_result
from bench.request_heldout import HELD_DETAIL, HELD_WHOLE
from engines.lexicon import lexicon
from engines.request_kind import leave_one_out, request_kind
from heterofold.select import GATE
from heterofold.suite import builtin_suite


def probe(lengths: list[int]) -> dict[str, Any]:
    vectors = lexicon()
    t0 = time.perf_counter()
    kind = request_kind(vectors)
    fit_s = time.perf_counter() - t0
    loo = leave_one_out(vectors)
    wrong = [{"request": r, "detail": d, "p_detail": round(p, 3)} for r, d, p in loo if (p >= 0.5) != d]
    held = [(r, True, kind.p_detail(r)) for r in HELD_DETAIL] + [(r, False, kind.p_detail(r)) for r in HELD_WHOLE]
    held_wrong = [(r, d, round(p, 3)) for r, d, p in held if (p >= 0.5) != d]
    missed_details = sum(d for _, d, _ in held_wrong)
    suite: dict[str, Any] = {}
    times = []
    for length in lengths:
        by_kind: dict[str, dict[str, int]] = {}
        for item in builtin_suite(lengths=(length,), per_cell=1):
            t = time.perf_counter()
            detail = kind.asks_for_a_detail(item.question)
            times.append((time.perf_counter() - t) * 1000)
            named = signals(item.question, item.context, vectors)["lexical"] >= GATE
            route = "quote" if named or detail else "transfer"
            row = by_kind.setdefault(item.kind, {"n": 0, "detail": 0, "named": 0, "quote": 0, "transfer": 0})
            row["n"] += 1
            row["detail"] += detail
            row["named"] += named
            row[route] += 1
        suite[str(length)] = by_kind
    return {
        "training_requests": len(loo),
        "leave_one_out_accuracy": round(1 - len(wrong) / len(loo), 3),
        "leave_one_out_wrong": wrong,
        "held_out_requests": len(held),
        "held_out_accuracy": round(1 - len(held_wrong) / len(held), 3),
        "held_out_detail_right": len(HELD_DETAIL) - missed_details,
        "held_out_whole_right": len(HELD_WHOLE) - (len(held_wrong) - missed_details),
        "held_out_wrong": [{"request": r, "detail": d, "p_detail": p} for r, d, p in held_wrong],
        "fit_s": round(fit_s, 3),
        "ms_per_request_median": round(statistics.median(times), 3) if times else None,
        "suite": suite,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lengths", default="1024,4096")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    result = probe([int(x) for x in args.lengths.split(",")])
    print(f"leave-one-out on {result['training_requests']} generic requests: accuracy "
          f"{result['leave_one_out_accuracy']}; fit {result['fit_s']} s, "
          f"{result['ms_per_request_median']} ms a request")  # fmt: skip
    for w in result["leave_one_out_wrong"]:
        print(f"  misread ({'detail' if w['detail'] else 'whole'}, p_detail {w['p_detail']}): {w['request']}")
    print(f"held out, {result['held_out_requests']} requests never fitted on: accuracy {result['held_out_accuracy']} "
          f"(details {result['held_out_detail_right']}/{len(HELD_DETAIL)}, "
          f"whole {result['held_out_whole_right']}/{len(HELD_WHOLE)})")  # fmt: skip
    for w in result["held_out_wrong"]:
        print(f"  misread ({'detail' if w['detail'] else 'whole'}, p_detail {w['p_detail']}): {w['request']}")
    print("| length | kind | items | read as detail | lexical names its sentence | auto: quote | auto: transfer |")
    print("|---|---|---|---|---|---|---|")
    for length, kinds in result["suite"].items():
        for k, v in kinds.items():
            print(f"| {length} | {k} | {v['n']} | {v['detail']} | {v['named']} | {v['quote']} | {v['transfer']} |")
    write_result(args.json, result)


if __name__ == "__main__":
    main()
