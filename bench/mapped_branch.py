"""Probe: should ``auto``'s mapped branch quote? Map + quote against map + recompute on the hops that
``auto`` maps, re-read from evaluations already run (no model run).

    python -m bench.mapped_branch docs/results/distq4k_*.json docs/results/full4k_*.json [--json OUT]

``auto`` quotes a hop whose question names its sentence (lexical confidence at least ``GATE``); it
sent every other hop to ``map_quote`` (the whole context mapped, the selector's spans quoted before
the question) until the request classifier, the last two policies below, decided them. Those
other hops are the paraphrased look-ups and the whole-context prompts ("Summarize",
"Continue"). ``heterofold eval`` scores, on the same items, both map + quote
(``M+quote@b``) and the map with the same spans recomputed in place (``M@b``, the ``transfer``
path); an ``auto`` item scores exactly what its branch scores, so any rule for the mapped side can
be scored off-line from those two paths. Per evaluation JSON and map, on the items ``auto`` maps:

- ``map_quote``: the branch served before the request classifier;
- ``transfer``: every mapped hop recomputes its spans in place instead;
- ``by kind``: the paraphrases quoted, the whole-context prompts recomputed. An oracle: it reads
  the item's kind, which no rule at serving time knows; the headroom a rule could buy;
- ``meaning z >= T``: a rule with no model run. ``meaning z`` is how far the ``meaning`` ranker's
  best sentence stands above the context's others (``bench.auto_rule``); at or above ``T`` map +
  quote, below it transfer. ``T`` is fitted on the 1K items (the threshold that misplaces the
  fewest paraphrase / whole-context items, ties to the lowest), so the 4K rows read it out of
  sample (other contexts, other depths; the same templates);
- ``request: quote / transfer``: ``engines.request_kind`` reads the request alone; one that asks for
  a detail is quoted (``quote``, no map), any other recomputes in place (``transfer``). The
  classifier is fitted on generic requests (``engines.request_examples``) and read at 0.5: nothing
  here is fitted on these items;
- ``request: map + quote / transfer``: the same split, the details to map + quote.

With ``--confidence MAP=FILE`` (a ``bench.branch_confidence`` result: the receiver's first token
under both branches), a fifth policy on map ``MAP``'s rows of that file's direction and lengths:
``branch KL rule``, map + quote when KL(map + quote || transfer) at the first answer token is on
the paraphrases' side of the threshold that file fitted on its first length, else transfer. Its signals come from that
file's own map, fitted with the same recipe as the evaluation's (a refit, not the same bytes).

Which items lexical confidence leaves to the mapped side (the hops these policies decide) is read
from the evaluation's own ``M+auto@b`` path where it ran (its ``named``, or in runs before the request
classifier its ``via``), else from lexical confidence re-read off the text.

Each prints the paraphrase answers and the whole-context mean per-token KL and top-1 agreement
against native (the fidelity pass), beside ``quote``'s, on the same items.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from bench.auto_rule import MAP_SIDE, QUOTE_SIDE, best_cut, probe, write_result
from heterofold.select import GATE

POLICIES = ("map_quote", "transfer", "by kind", "meaning z >= T", "request: quote / transfer",
            "request: map + quote / transfer")  # fmt: skip
DETAIL = 0.5  # engines.request_kind's cut, as served
CONFIDENCE = "branch KL"  # the bench.branch_confidence signal scored as a policy


def threshold(rows: list[dict[str, Any]]) -> float:
    """The ``meaning z`` cut that misplaces the fewest paraphrase (wanted at or above) and
    whole-context (wanted below) items; ties go to the lowest cut."""
    high = [r["meaning z"] for r in rows if r["kind"] in QUOTE_SIDE]
    return best_cut(high, [r["meaning z"] for r in rows if r["kind"] in MAP_SIDE])


def _mean(values: list[float]) -> float | None:
    return round(statistics.mean(values), 3) if values else None


def branch(
    result: dict[str, Any],
    name: str,
    budget: str,
    signals: dict[str, dict[str, Any]],
    cut: float,
    confidence: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The six policies on one evaluation's mapped side (module docstring), and with
    ``confidence`` (a ``bench.branch_confidence`` result of the same direction and length) the
    fifth, ``branch KL``."""
    per = result["per_item"]
    rec, mq, quote = per[f"{name}@{budget}"], per[f"{name}+quote@{budget}"], per[f"quote@{budget}"]
    autos = [p for p in per if p.endswith(f"+auto@{budget}")]
    if autos:  # the lexical rule's side, as the evaluation recorded it (older runs: no "named", via map_quote)
        took = per[autos[0]]
        mapped = [i for i in rec if not took[i]["named"]] if "named" in took[next(iter(took))] else [
            i for i in rec if took[i]["via"] == "map_quote"]  # fmt: skip
    else:  # the rule's signal re-read off the text (whitespace words for tokens: bench.auto_rule)
        mapped = [i for i in rec if signals[i]["lexical"] < GATE]
    choose = {
        "map_quote": lambda i: mq,
        "transfer": lambda i: rec,
        "by kind": lambda i: mq if rec[i]["kind"] in QUOTE_SIDE else rec,
        "meaning z >= T": lambda i: mq if signals[i]["meaning z"] >= cut else rec,
        "request: quote / transfer": lambda i: quote if signals[i]["request detail"] >= DETAIL else rec,
        "request: map + quote / transfer": lambda i: mq if signals[i]["request detail"] >= DETAIL else rec,
    }
    if confidence is not None:
        by_id = {r["id"]: r for r in confidence["items"]}
        rule = confidence["signals"][CONFIDENCE]
        sign = 1.0 if rule["paraphrase_side"] == "high" else -1.0
        choose[f"{CONFIDENCE} rule"] = lambda i: mq if sign * by_id[i][CONFIDENCE] >= sign * rule["threshold"] else rec
    out: dict[str, Any] = {}
    for policy, pick in [*choose.items(), ("quote", lambda i: quote)]:
        scored = {i: pick(i)[i] for i in mapped}
        answers = [x["correct"] for x in scored.values() if x["correct"] is not None]
        whole = [x for x in scored.values() if x["kind"] in MAP_SIDE and x.get("kl") is not None]
        out[policy] = {
            "answers": sum(answers),
            "of": len(answers),
            "whole_kl": _mean([x["kl"] for x in whole]),
            "whole_top1": _mean([x["top1"] for x in whole]),
            "n_whole": len(whole),
            "ttft_ms": round(statistics.median(x["ttft_ms"] for x in scored.values())) if scored else None,
            "to_transfer": sum(pick(i) is rec for i in mapped) if policy in choose else None,
        }
    return {"mapped_items": len(mapped), "kinds": sorted({rec[i]["kind"] for i in mapped}), "policies": out}


def totals(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per policy over every row: paraphrase answers and items summed, the mean of the rows'
    whole-context KL, and on how many rows that KL is below the ``map_quote`` branch's."""
    out: dict[str, dict[str, Any]] = {}
    for policy in rows[0]["policies"] if rows else []:
        pairs = [(r["policies"][policy], r["policies"]["map_quote"]) for r in rows if policy in r["policies"]]
        scored = [p for p, _ in pairs]
        kls = [(p["whole_kl"], mq["whole_kl"]) for p, mq in pairs if p["whole_kl"] is not None]
        out[policy] = {
            "rows": len(scored),
            "answers": sum(p["answers"] for p in scored),
            "of": sum(p["of"] for p in scored),
            "mean_whole_kl": _mean([kl for kl, _ in kls]),
            "rows_kl_below_map_quote": sum(kl < mq for kl, mq in kls),
        }
    return out


def run(files: list[Path], budget: str, confidence: list[str] | None = None) -> dict[str, Any]:
    """Every map of every evaluation JSON that ran both ``M@budget`` and ``M+quote@budget``;
    ``confidence``: ``MAP=FILE``, a ``bench.branch_confidence`` result scored on the rows of map
    ``MAP`` in its direction and lengths (its rule as fitted there, on its own map's signals)."""
    confidences = []
    for spec in confidence or []:
        name, sep, file = spec.partition("=")
        if not sep:
            raise SystemExit(f"--confidence takes MAP=FILE, got {spec!r}")
        confidences.append({**json.loads(Path(file).read_text()), "map": name})
    base = probe(1024)
    cut = threshold([r for r in base["items"] if r["kind"] in QUOTE_SIDE + MAP_SIDE])
    signal_sets: dict[int, dict[str, dict[str, Any]]] = {1024: {r["id"]: r for r in base["items"]}}
    rows: list[dict[str, Any]] = []
    for path in files:
        result = json.loads(path.read_text())
        per = result["per_item"]
        if f"quote@{budget}" not in per:
            continue
        length = int(next(iter(per["native"])).split("-")[1])
        if length not in signal_sets:
            signal_sets[length] = {r["id"]: r for r in probe(length)["items"]}
        quoted = [p.split("+")[0] for p in per if p.endswith(f"+quote@{budget}")]
        names = sorted(m for m in quoted if f"{m}@{budget}" in per)
        for name in names:
            direction = (result["sender"], result["receiver"])
            conf = next((c for c in confidences if (c["sender"], c["receiver"]) == direction and c["map"] == name
                         and any(r["length"] == length for r in c["items"])), None)  # fmt: skip
            row = branch(result, name, budget, signal_sets[length], cut, conf)
            rows.append({"file": path.name, "sender": result["sender"], "receiver": result["receiver"],
                         "length": length, "map": name, **row})  # fmt: skip
    return {"budget": budget, "gate": GATE, "meaning_z_cut": cut, "rows": rows, "totals": totals(rows)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+", type=Path)
    ap.add_argument("--budget", default="0.02")
    ap.add_argument("--confidence", action="append", metavar="MAP=FILE",
                    help="a bench.branch_confidence JSON for map MAP's rows (repeatable)")  # fmt: skip
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    result = run(args.files, args.budget, args.confidence)
    print(f"meaning z cut T = {result['meaning_z_cut']} (fitted on the 1K items); budget {result['budget']}")
    cols = ("direction", "length", "map", "policy", "paraphrase answers", "whole-context KL", "top-1",
            "median TTFT ms", "to transfer")  # fmt: skip
    print("| " + " | ".join(cols) + " |")
    print("|---|---|---|---|---|---|---|---|---|")
    for row in result["rows"]:
        d = f"{row['sender'][0]} → {row['receiver'][0]}"
        for policy, v in row["policies"].items():
            moved = "" if v["to_transfer"] is None else v["to_transfer"]
            print(f"| {d} | {row['length']} | {row['map']} | {policy} | {v['answers']}/{v['of']} | {v['whole_kl']} | "
                  f"{v['whole_top1']} | {v['ttft_ms']} | {moved} |")  # fmt: skip
    print("over every row: | policy | paraphrase answers | mean whole-context KL | rows with KL below map_quote's |")
    for policy, t in result["totals"].items():
        below = f"{t['rows_kl_below_map_quote']}/{t['rows']}"
        print(f"| {policy} | {t['answers']}/{t['of']} | {t['mean_whole_kl']} | {below} |")
    write_result(args.json, result)


if __name__ == "__main__":
    main()
