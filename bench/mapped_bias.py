"""Probe: an additive attention-logit bias on the mapped (not recomputed) context tokens.

    python -m bench.mapped_bias SENDER RECEIVER ADAPTER [--betas 0,-1,-3,-30] [--budget 0.02] [--json OUT]

Every receiver pass after the transfer (the suffix's prefill, greedy decoding, the teacher-forced
scoring) adds ``beta`` to the attention logits of every mapped context position, in every layer
and head: the mapped tokens' attention weights are multiplied by ``exp(beta)`` before the softmax
renormalizes. ``beta = 0`` is the served map + recompute path; ``beta -> -inf`` lets the question
see only the natively recomputed tokens (which were themselves computed over the mapped ones).
It asks whether the mapped background dilutes the receiver's attention away from the recomputed
answer sentence, and whether a fixed down-weighting buys look-up accuracy without losing what
the map carries on whole-context prompts.

Not a product path: the bias lives in this process only (``bench.mapped_attention``, which also
places it on the right positions of a sliding layer's windowed cache). On the builtin suite at
1024 tokens, every item, the
same selection (the gateway's default selector and tail window) for every row, plus native,
quote and the map with the spans quoted on the same items.
"""

from __future__ import annotations

import asyncio
import json
import statistics
from pathlib import Path
from typing import Any

import torch

from bench.mapped_attention import MappedAttention, mapped_positions
from bench.pair import load_pair, pair_parser
from engines.local import LocalEngine
from engines.selectors import make_selector
from engines.transfer import transfer
from gateway.settings import RoleSettings, TransferPolicy
from harness.evaluate import ItemRun, PathStats
from heterofold.adapter import Adapter
from heterofold.suite import builtin_suite


async def probe(
    sender: LocalEngine, receiver: LocalEngine, adapter: Adapter, betas: list[float], budget: float, every: int
) -> dict[str, Any]:
    MappedAttention.install(receiver.model)
    rule = MappedAttention.for_model(receiver.model)
    policy, tail = TransferPolicy(), RoleSettings(engine="-").tail_window
    chooser = make_selector(policy.selector)
    items = builtin_suite(lengths=(1024,), per_cell=1)[::every]
    stats: dict[str, PathStats] = {}
    for n, item in enumerate(items):
        run = ItemRun(sender, receiver, item, 24 if item.metric == "answer" else 64, tail)
        await run.native(stats)
        await run.prepare_transfer(chooser, adapter, None)
        await run.quote(stats, budget)
        await run.mapped_quote(stats, "map", adapter, budget)
        sel = await run.chosen(budget)
        tr = await transfer(adapter, run.hop, receiver, selection=sel, tail=tail)
        mapped = mapped_positions(run.hop, tr, tail)
        for beta in betas:
            with torch.no_grad():
                rule.bias.fill_(beta)
            with rule.active(mapped):
                await run.run_path(stats, f"map@{budget:g} beta={beta:g}", run.r_ids, tr.kv, sel.ms + tr.total_ms)
        print(f"items {n + 1}/{len(items)} ({item.kind})", flush=True)
    return {"selector": policy.selector, "budget": budget, "tail": tail, "items": len(items),
            "paths": {path: summary_by_kind(st) for path, st in stats.items()}}  # fmt: skip


def summary_by_kind(stats: PathStats) -> dict[str, Any]:
    """``PathStats.summary`` (accuracy on answer items, ``fidelity_kl``/``fidelity_top1`` on the
    whole-context ones), plus accuracy per kind and the per-item scores."""
    kinds: dict[str, list[float]] = {}
    for s in stats.scores.values():
        if s.correct is not None:
            kinds.setdefault(s.kind, []).append(float(s.correct))
    return {
        **stats.summary(None),
        "by_kind": {k: round(statistics.mean(v), 2) for k, v in sorted(kinds.items())},
        "per_item": {k: [s.correct, s.kl] for k, s in stats.scores.items()},
    }


def report(result: dict[str, Any], out: Path | None, width: int) -> None:
    """Print one row per path of ``result["paths"]`` (rows of ``summary_by_kind``): accuracy on the
    answer items, their first-token KL against native, whole-context KL and top-1, accuracy per
    kind; then write ``result`` as JSON to ``out`` if given."""
    print(f"{'path':{width}s} {'answer acc':>10s} {'first KL':>9s} {'whole KL':>9s} {'top-1':>6s}  by kind")
    for path, row in result["paths"].items():
        cells = [row.get(k) for k in ("first_token_kl", "fidelity_kl", "fidelity_top1")]
        first, kl, top1 = (f"{c:g}" if c is not None else "-" for c in cells)
        kinds = " ".join(f"{k}={v:g}" for k, v in row["by_kind"].items())
        print(f"{path:{width}s} {row['accuracy']:>10.3f} {first:>9} {kl:>9} {top1:>6}  {kinds}")
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1))
        print(f"wrote {out}")


def main() -> None:
    ap = pair_parser(__doc__, "the adapter folder (e.g. a distilled map)")
    ap.add_argument("--betas", default="0,-1,-3,-30")
    ap.add_argument("--budget", type=float, default=0.02)
    ap.add_argument("--every", type=int, default=1, help="every n-th builtin item")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    s, r, adapter = load_pair(args)
    betas = [float(b) for b in args.betas.split(",")]
    result = asyncio.run(probe(s, r, adapter, betas, args.budget, args.every))
    print(f"{args.sender} -> {args.receiver}, {result['items']} items, selector {result['selector']}")
    report(result, args.json, width=26)


if __name__ == "__main__":
    main()
