"""Probe: how well does ``engines.request_kind`` tell a request for one detail from a request for the
whole document? Both readers: the served one (``HiddenReader``, gemma3-270m's layer 9) and the
word vectors it replaced (``WordReader``).

    python -m bench.request_kind [--lengths 1024,4096] [--grid] [--json OUT]

Per reader (the served one also in float32 when it runs in bfloat16):

- on its own training requests (``engines.request_examples``, generic, none of the suite's
  wording), leave-one-out: each request scored by a classifier fitted on the other 99;
- on requests never fitted on: the 60 of ``bench.request_heldout`` (``HELD_*``: the word vectors
  were fitted before they were written; the hidden-state readers were compared on them, so for the
  choice between readers they are no longer held out) and its 39 ``FRESH_*`` requests, written
  after that comparison and scored once;
- the fit's time and the time per request after it.

For the served reader, the builtin suite's items at each length, per kind: how many it reads as a
detail, and how the served ``auto`` rule (lexical naming the sentence first,
``engines.selectors.auto_path``) would route them with the question alone: the paraphrases should
go to ``quote``, the summaries and continuations to ``transfer``. Lexical confidence is re-read off
the item's text (whitespace words for tokens, as ``bench.auto_rule`` reads it); the evaluation's
own ``+auto`` path records the branch each item took.

``--grid``: the hidden-state reader on every zoo model at a quarter, half, three quarters and all of
its layers, in float32 (leave-one-out and both held-out sets; a model load per cell, a few minutes).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from bench.auto_rule import signals, write_result
from bench.request_heldout import FRESH_DETAIL, FRESH_WHOLE, HELD_DETAIL, HELD_WHOLE
from engines.lexicon import configured_zoo, lexicon
from engines.request_kind import HiddenReader, Reader, RequestKind, WordReader, leave_one_out, request_kind
from heterofold.select import GATE
from heterofold.suite import builtin_suite


def scores(reader: Reader) -> dict[str, Any]:
    """Leave-one-out, both held-out sets, fit and per-request time for one reader."""
    t0 = time.perf_counter()
    kind = RequestKind.fit(reader)
    fit_s = time.perf_counter() - t0
    loo = leave_one_out(reader)
    out: dict[str, Any] = {
        "reader": reader.name,
        "fit_s": round(fit_s, 3),
        "training_requests": len(loo),
        "leave_one_out_accuracy": round(sum((p >= 0.5) == d for _, d, p in loo) / len(loo), 3),
        "leave_one_out_wrong": [
            {"request": r, "detail": d, "p_detail": round(p, 3)} for r, d, p in loo if (p >= 0.5) != d
        ],
    }
    times = []
    for label, detail, whole in (("held_out", HELD_DETAIL, HELD_WHOLE), ("fresh", FRESH_DETAIL, FRESH_WHOLE)):
        rows = []
        for r, d in [(r, True) for r in detail] + [(r, False) for r in whole]:
            t = time.perf_counter()
            p = kind.p_detail(r)
            times.append((time.perf_counter() - t) * 1000)
            rows.append((r, d, p))
        wrong = [(r, d, round(p, 3)) for r, d, p in rows if (p >= 0.5) != d]
        out[label] = {
            "requests": len(rows),
            "right": len(rows) - len(wrong),
            "detail_right": len(detail) - sum(d for _, d, _ in wrong),
            "whole_right": len(whole) - sum(not d for _, d, _ in wrong),
            "wrong": [{"request": r, "detail": d, "p_detail": p} for r, d, p in wrong],
        }
    out["ms_per_request_median"] = round(statistics.median(times), 3)
    return out


def suite_routing(kind: RequestKind, lengths: list[int]) -> dict[str, Any]:
    """Per length and kind of the builtin suite: read as a detail, named by lexical, and routed."""
    vectors = lexicon()
    suite: dict[str, Any] = {}
    for length in lengths:
        by_kind: dict[str, dict[str, int]] = {}
        for item in builtin_suite(lengths=(length,), per_cell=1):
            detail = kind.asks_for_a_detail(item.question)
            named = signals(item.question, item.context, vectors)["lexical"] >= GATE
            route = "quote" if named or detail else "transfer"
            row = by_kind.setdefault(item.kind, {"n": 0, "detail": 0, "named": 0, "quote": 0, "transfer": 0})
            row["n"] += 1
            row["detail"] += detail
            row["named"] += named
            row[route] += 1
        suite[str(length)] = by_kind
    return suite


def grid() -> list[dict[str, Any]]:
    """The hidden-state reader on every zoo model at four depths (module docstring)."""
    from engines.catalog import CATALOG

    zoo = configured_zoo()
    rows = []
    for name, entry in CATALOG.items():
        if not zoo.is_converted(entry):
            continue
        layers_total = int(json.loads((zoo.model_dir(entry) / "config.json").read_text())["num_hidden_layers"])
        for layer in sorted({layers_total // 4, layers_total // 2, 3 * layers_total // 4, layers_total}):
            r = scores(HiddenReader.from_zoo(zoo, name, layer, dtype=torch.float32))
            rows.append({
                "model": name, "layer": layer, "of": layers_total, "leave_one_out": r["leave_one_out_accuracy"],
                "held_out": r["held_out"]["right"], "fresh": r["fresh"]["right"],
                "ms_per_request_median": r["ms_per_request_median"],
            })  # fmt: skip
            n_held, n_fresh = len(HELD_DETAIL) + len(HELD_WHOLE), len(FRESH_DETAIL) + len(FRESH_WHOLE)
            row = rows[-1]
            print(f"  {name} layer {layer}/{layers_total}: leave-one-out {row['leave_one_out']}, "
                  f"held out {row['held_out']}/{n_held}, fresh {row['fresh']}/{n_fresh}", flush=True)  # fmt: skip
    return rows


def probe(lengths: list[int], with_grid: bool = False) -> dict[str, Any]:
    served = request_kind()
    readers = {"served": scores(served.reader)}
    if getattr(served.reader, "dtype", torch.float32) != torch.float32:  # the same reader in float32, same run
        readers["served, float32"] = scores(HiddenReader.from_zoo(dtype=torch.float32))
    readers["words"] = scores(WordReader(lexicon()))
    out: dict[str, Any] = {"readers": readers, "suite": suite_routing(served, lengths)}
    if with_grid:
        out["grid"] = grid()
    return out


def _print_reader(label: str, r: dict[str, Any]) -> None:
    print(f"{label} ({r['reader']}): leave-one-out on {r['training_requests']} generic requests "
          f"{r['leave_one_out_accuracy']}; fit {r['fit_s']} s, {r['ms_per_request_median']} ms a request")  # fmt: skip
    for w in r["leave_one_out_wrong"]:
        print(f"  misread ({'detail' if w['detail'] else 'whole'}, p_detail {w['p_detail']}): {w['request']}")
    for key, title in (("held_out", "held out"), ("fresh", "fresh")):
        h = r[key]
        print(f"  {title}: {h['right']}/{h['requests']} (details {h['detail_right']}, whole {h['whole_right']})")
        for w in h["wrong"]:
            print(f"    misread ({'detail' if w['detail'] else 'whole'}, p_detail {w['p_detail']}): {w['request']}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lengths", default="1024,4096")
    ap.add_argument("--grid", action="store_true", help="every zoo model at four depths (a few minutes)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    result = probe([int(x) for x in args.lengths.split(",")], args.grid)
    for label, r in result["readers"].items():
        _print_reader(label, r)
    print("served reader on the builtin suite:")
    print("| length | kind | items | read as detail | lexical names its sentence | auto: quote | auto: transfer |")
    print("|---|---|---|---|---|---|---|")
    for length, kinds in result["suite"].items():
        for k, v in kinds.items():
            print(f"| {length} | {k} | {v['n']} | {v['detail']} | {v['named']} | {v['quote']} | {v['transfer']} |")
    write_result(args.json, result)


if __name__ == "__main__":
    main()
