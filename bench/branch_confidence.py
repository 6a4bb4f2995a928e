"""Probe: does the receiver's own first token tell a paraphrased look-up from a whole-context prompt?

    python -m bench.branch_confidence SENDER RECEIVER ADAPTER [--lengths 1024,4096] [--json OUT]

``auto``'s mapped side holds the paraphrased look-ups and the whole-context prompts ("Summarize",
"Continue"). Map + quote answers the paraphrases; the map with the same spans recomputed in place
is closer to native on the whole-context prompts (``bench.mapped_branch``). Neither the question's
words (``bench.auto_rule``) nor the sender's attention (``bench.attention_rule``) tells the two
apart. This reads the receiver instead: its next-token distribution at the first answer position
under three prompts the mapped side can build for the hop, with the served selector's 2% spans:

- ``quote``: the spans as text before the question, no KV (a ~50-token prompt: the cheapest read);
- ``map+quote``: the whole context mapped by ADAPTER, the spans quoted before the question;
- ``transfer``: the context mapped, the spans recomputed in place.

Signals per item: the top-1 probability and the entropy (nats) of each, and ``branch KL``,
KL(map+quote || transfer) between the two mapped branches (how much quoting the spans changes
what the receiver says first). A look-up whose answer the quote holds should make the receiver
sure of its first token; "Summarize" should leave it spread, whatever the context. Per signal the
side (paraphrase high or low) and threshold are fitted at the first length, and how many of the
items that rule misplaces at every length is printed beside the fewest any threshold misplaces
there (in sample). The same templates at both lengths; other contexts and depths at 4K.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import torch

from bench.auto_rule import MAP_SIDE, QUOTE_SIDE, best_cut, fewest_wrong, misplaced, write_result
from bench.pair import load_pair, pair_parser
from engines.local import LocalEngine
from engines.selectors import make_selector
from engines.transfer import transfer
from gateway.settings import RoleSettings, TransferPolicy
from harness.evaluate import ItemRun
from heterofold.adapter import Adapter
from heterofold.suite import builtin_suite

BRANCHES = ("quote", "map+quote", "transfer")
SIGNALS = (*(f"{b} {s}" for b in BRANCHES for s in ("top-1 p", "entropy")), "branch KL")


def first_token(logits: torch.Tensor) -> tuple[torch.Tensor, float, float]:
    """Log-probabilities of the next token ``(V,)``, their top-1 probability and entropy (nats)."""
    logp = torch.log_softmax(logits.float(), -1)
    return logp, float(logp.max().exp()), float(-(logp.exp() * logp).sum())


async def signals(run: ItemRun, adapter: Adapter, budget: float) -> dict[str, float]:
    """The signals of one item (module docstring); ``run``'s transfer is prepared."""
    receiver = run.receiver
    sel = await run.chosen(budget)
    reads: dict[str, torch.Tensor] = {}
    q_ids, _ = await run.quote_ids(budget)
    reads["quote"] = (await receiver.score(q_ids))[-1]
    mq_ids, _, mq, _ = await run.quoted_transfer(adapter, budget)
    reads["map+quote"] = (await receiver.score(mq_ids, past=mq.kv))[-1]
    tr = await transfer(adapter, run.hop, receiver, selection=sel, tail=run.tail)
    reads["transfer"] = (await receiver.score(run.r_ids, past=tr.kv))[-1]
    out: dict[str, float] = {}
    logps = {}
    for name, logits in reads.items():
        logps[name], top1, entropy = first_token(logits)
        out[f"{name} top-1 p"], out[f"{name} entropy"] = round(top1, 4), round(entropy, 4)
    p = logps["map+quote"]
    out["branch KL"] = round(float((p.exp() * (p - logps["transfer"])).sum()), 4)
    return out


def rule(rows: list[dict[str, Any]], sig: str, lengths: list[int]) -> dict[str, Any]:
    """The side and threshold fitted at ``lengths[0]`` and what they misplace at each length: a
    paraphrase is an item at or above the threshold (side ``high``) or at or below it (``low``)."""

    def sides(n: int, sign: float) -> tuple[list[float], list[float]]:
        at = [r for r in rows if r["length"] == n]
        return ([sign * r[sig] for r in at if r["kind"] in QUOTE_SIDE],
                [sign * r[sig] for r in at if r["kind"] in MAP_SIDE])  # fmt: skip

    # paraphrases high (sign +1) or low (-1): whichever misplaces fewer at the first length
    sign = min((1.0, -1.0), key=lambda s: fewest_wrong(*sides(lengths[0], s)))
    cut = best_cut(*sides(lengths[0], sign))
    return {
        "paraphrase_side": "high" if sign > 0 else "low",
        "threshold": sign * cut,
        "fitted_at": lengths[0],
        "wrong_at_fitted": {str(n): misplaced(*sides(n, sign), cut) for n in lengths},
        "fewest_wrong": {str(n): min(fewest_wrong(*sides(n, s)) for s in (1.0, -1.0)) for n in lengths},
        "of": {str(n): sum(len(x) for x in sides(n, 1.0)) for n in lengths},
    }


async def probe(sender: LocalEngine, receiver: LocalEngine, adapter: Adapter, lengths: list[int],
                budget: float) -> dict[str, Any]:  # fmt: skip
    policy, tail = TransferPolicy(), RoleSettings(engine="-").tail_window
    chooser = make_selector(policy.selector)
    rows: list[dict[str, Any]] = []
    for length in lengths:
        for item in builtin_suite(lengths=(length,), per_cell=1, kinds=QUOTE_SIDE + MAP_SIDE):
            run = ItemRun(sender, receiver, item, 1, tail)
            await run.prepare_transfer(chooser, adapter, None)
            rows.append({"id": item.id, "kind": item.kind, "length": length, **await signals(run, adapter, budget)})
            print(f"{item.id}: " + ", ".join(f"{s} {rows[-1][s]}" for s in SIGNALS), flush=True)
    return {
        "sender": sender.spec.name, "receiver": receiver.spec.name, "adapter_version": adapter.manifest.version,
        "selector": policy.selector, "budget": budget, "tail": tail, "items": rows,
        "signals": {sig: rule(rows, sig, lengths) for sig in SIGNALS},
    }  # fmt: skip


def main() -> None:
    ap = pair_parser(__doc__, "the adapter folder (the map the mapped branches use)")
    ap.add_argument("--lengths", default="1024,4096")
    ap.add_argument("--budget", type=float, default=0.02)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    s, r, adapter = load_pair(args)
    result = asyncio.run(probe(s, r, adapter, [int(x) for x in args.lengths.split(",")], args.budget))
    for sig, v in result["signals"].items():
        print(f"{sig}: paraphrases {v['paraphrase_side']}, threshold {v['threshold']:.4g} "
              f"(fitted at {v['fitted_at']}); misplaced {v['wrong_at_fitted']} of {v['of']}; "
              f"fewest {v['fewest_wrong']}")  # fmt: skip
    write_result(args.json, result)


if __name__ == "__main__":
    main()
