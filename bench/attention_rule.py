"""Probe: does the sender's attention tell a paraphrased look-up from a whole-context prompt?

    python -m bench.attention_rule --sender gemma3-270m [--lengths 1024,4096] [--json OUT]

``auto``'s mapped side holds the paraphrased look-ups and the whole-context prompts ("Summarize",
"Continue"). Map + quote answers the paraphrases; the map with the same spans recomputed in place
is closer to native on the whole-context prompts (``bench.mapped_branch``). Lexical confidence puts
both on the mapped side, and the ``meaning`` ranker's standout (``bench.auto_rule``), cut where it
splits the 1K items best, misplaces items at 4K. This reads what the ``sender-attention`` selector
already computes when a hop asks for it: the question run by the sender over its own cache, the last
token's attention over the context (``engines.selectors.SenderAttention``: full-attention layers from
a third of the depth up, renormalised over the context, averaged), carried to the context's tokens.
Per sentence the mass of its tokens; two signals per item:

- ``attention share``: the best sentence's share of the context's attention mass;
- ``attention z``: (best - mean) / standard deviation of the sentences' masses.

A question that asks for one sentence should point at it; "summarize" should spread. Then per
signal and length, the fewest paraphrase vs whole-context items any one threshold misplaces, and
how many the threshold fitted at the first length misplaces at each other length (out of sample).
The sender reads its own rendering of the context (the receiver side of the hop is the sender's own
template: the signal depends on the sender only). One sender prefill and one attention pass per
item.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
from pathlib import Path
from typing import Any

from bench.auto_rule import MAP_SIDE, QUOTE_SIDE, best_cut, fewest_wrong, misplaced, write_result
from engines.local import LocalEngine
from engines.selectors import Evidence, SenderAttention, candidates, window
from engines.zoo import Zoo
from harness.evaluate import eval_hop
from heterofold.select import spans_of
from heterofold.suite import builtin_suite

SIGNALS = ("attention share", "attention z")


async def signals(sender: LocalEngine, item: Any) -> dict[str, float]:
    """The two signals of one item (module docstring)."""
    hop = await eval_hop(sender, sender, item)
    ev = Evidence(hop, candidates(hop, hop.transferable_prefix()), sender=sender)
    scores = await SenderAttention().token_scores(ev)
    view = spans_of(*window(ev))
    mass = [sum(scores[t] for t in tokens) for tokens in view.tokens if tokens]
    total, spread = sum(mass), statistics.pstdev(mass) if len(mass) > 1 else 0.0
    return {
        "attention share": round(max(mass) / total, 4) if total else 0.0,
        "attention z": round((max(mass) - statistics.mean(mass)) / spread, 3) if spread else 0.0,
    }


def probe(sender: LocalEngine, lengths: list[int]) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    for length in lengths:
        for item in builtin_suite(lengths=(length,), per_cell=1, kinds=QUOTE_SIDE + MAP_SIDE):
            rows.append({"id": item.id, "kind": item.kind, "length": length, **asyncio.run(signals(sender, item))})
            print(f"{item.id}: " + ", ".join(f"{s} {rows[-1][s]}" for s in SIGNALS), flush=True)
    out: dict[str, Any] = {"sender": sender.spec.name, "items": rows, "signals": {}}
    for sig in SIGNALS:
        side = {
            n: ([r[sig] for r in rows if r["length"] == n and r["kind"] in QUOTE_SIDE],
                [r[sig] for r in rows if r["length"] == n and r["kind"] in MAP_SIDE])
            for n in lengths
        }  # fmt: skip
        fitted = best_cut(*side[lengths[0]])
        out["signals"][sig] = {
            "fitted_at": lengths[0],
            "threshold": fitted,
            "fewest_wrong": {str(n): fewest_wrong(*side[n]) for n in lengths},
            "wrong_at_fitted": {str(n): misplaced(*side[n], fitted) for n in lengths},
            "ranges": {
                str(n): {k: [min(v), max(v)] for k, v in (("paraphrase", side[n][0]), ("whole-context", side[n][1]))}
                for n in lengths
            },
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sender", required=True)
    ap.add_argument("--lengths", default="1024,4096")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    sender = LocalEngine.from_zoo(args.sender, zoo=Zoo())
    result = probe(sender, [int(x) for x in args.lengths.split(",")])
    for sig, v in result["signals"].items():
        print(f"{sig}: threshold {v['threshold']} (fitted at {v['fitted_at']}); fewest misplaced {v['fewest_wrong']}; "
              f"misplaced by the fitted threshold {v['wrong_at_fitted']}; ranges {v['ranges']}")  # fmt: skip
    write_result(args.json, result)


if __name__ == "__main__":
    main()
