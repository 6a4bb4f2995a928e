"""Probe: a learned attention rule for the mapped context tokens, fitted end to end through the
frozen receiver: a logit bias per layer and query head on the mapped positions, and learned
key/value slots per layer (``bench.mapped_attention``).

    python -m bench.learned_bias SENDER RECEIVER ADAPTER [--learn bias,bias+slots] [--slots 4]
        [--contexts 16] [--steps 200] [--lr 0.03] [--budget 0.02] [--every 1] [--kinds K,..] [--json OUT]
    python -m bench.learned_bias --table OUT      # the markdown table of a run's JSON

The uniform bias (``bench.mapped_bias``) showed that the mapped background dilutes the receiver's
attention away from the recomputed needle, and that one bias for every head trades whole-context
fidelity for look-ups along one line. Here each head learns its own bias (a head that reads the
map usefully can keep it, a head that is distracted can drop it), and a few slots per layer can
take up the mass the bias removes or carry a learned correction.

Fitting: the adapter (the map) stays frozen; only the rule trains. Documents are
``harness.distill_on_engines.build_docs``' (stdlib docstrings and generic questions, never the
suite's), built for both served shapes of a cross-family hop: map-only and the selector's 2%
recomputed in place (``path=recompute``), and the whole context mapped with the 2% quoted before
the question (``path=quote``). Each step is one document's suffix forward and backward over its
mapped context cache (computed once); the held-out answer KL picks the best step.

Evaluation: the builtin suite at 1024 tokens (every ``--every``-th item), the served selector,
the same selection for every row: native, no_context, quote, recompute_only, and the map at 0 and
at the budget in place and with the quote, each plain and under every learned rule.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import random
import time
from pathlib import Path
from typing import Any

import torch

from bench.mapped_attention import MappedAttention, mapped_positions
from bench.mapped_bias import report, summary_by_kind
from engines.hf_cache import import_kv
from engines.local import LocalEngine
from engines.selectors import Selection, make_selector
from engines.transfer import TransferResult, transfer
from gateway.settings import RoleSettings, TransferPolicy
from harness.distill_on_engines import build_docs
from harness.evaluate import ItemRun, PathStats
from heterofold.adapter import Adapter
from heterofold.corpus import distill_contexts
from heterofold.distill import DistillDoc, LowRankResidual, kl_loss, split_docs
from heterofold.kv import KVCache
from heterofold.suite import builtin_suite


@torch.no_grad()
def mapped_cache(receiver: LocalEngine, adapter: Adapter, doc: DistillDoc) -> tuple[KVCache, torch.Tensor]:
    """``doc``'s context cache with the frozen map (windowed as the engine imports it) and its
    mapped positions."""
    keys, values = LowRankResidual(adapter).context_kv(doc)
    T = doc.token_ids.shape[0]
    kv = KVCache(receiver.spec.fingerprint, doc.token_ids, torch.arange(T), tuple(keys), tuple(values),
                 (0,) * len(keys))  # fmt: skip
    mapped = torch.zeros(T, dtype=torch.bool)
    mapped[doc.mapped] = True
    return kv.windowed(receiver.spec.windows), mapped


def doc_loss(
    receiver: LocalEngine, rule: MappedAttention, doc: DistillDoc, kv: KVCache, mapped: torch.Tensor
) -> torch.Tensor:
    """The answer KL of ``doc`` over its mapped cache, under ``rule`` (runs on the engine's thread)."""
    cache = import_kv(kv, receiver.model.config, receiver.spec, receiver.device, receiver.dtype)
    T, S = doc.token_ids.shape[0], doc.suffix.shape[0]
    pos = torch.arange(T, T + S, device=receiver.device)[None]
    with rule.active(mapped):
        out = receiver.model(input_ids=doc.suffix.to(receiver.device)[None], position_ids=pos, cache=cache,
                             use_cache=True, logits_to_keep=0)  # fmt: skip
    return kl_loss(out.logits[0, doc.answer_rows], doc.target)


async def fit_rule(
    receiver: LocalEngine,
    adapter: Adapter,
    docs: list[list[DistillDoc]],
    rule: MappedAttention,
    *,
    steps: int,
    lr: float,
    penalty: float = 1e-3,
    held: int = 3,
    eval_every: int = 25,
    seed: int = 0,
) -> dict[str, Any]:
    """Adam on ``rule``'s trainable parameters; keeps the step with the lowest held-out KL."""
    prepared = [[(d, *mapped_cache(receiver, adapter, d)) for d in per] for per in docs]
    train, held_out = split_docs(len(prepared), held)
    order = [x for i in train for x in prepared[i]]
    params = [p for p in rule.parameters() if p.requires_grad]
    opt = torch.optim.Adam(params, lr=lr)
    rng = random.Random(seed)
    t0 = time.perf_counter()

    def held_kl() -> float:
        with torch.no_grad():
            vals = [float(doc_loss(receiver, rule, *x)) for i in held_out for x in prepared[i]]
        return sum(vals) / len(vals)

    def step(x: tuple[DistillDoc, KVCache, torch.Tensor]) -> float:
        with torch.enable_grad():
            opt.zero_grad()
            loss = doc_loss(receiver, rule, *x)
            (loss + penalty * rule.penalty()).backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
        return float(loss.detach())

    before = await receiver.run_exclusive(held_kl)
    best, best_step = before, 0
    best_state = {k: v.detach().clone() for k, v in rule.state_dict().items()}
    history, losses = [], []
    for n in range(1, steps + 1):
        losses.append(await receiver.run_exclusive(functools.partial(step, rng.choice(order))))
        if n % eval_every == 0 or n == steps:
            kl = await receiver.run_exclusive(held_kl)
            history.append((n, round(sum(losses[-eval_every:]) / len(losses[-eval_every:]), 4), round(kl, 4)))
            print(f"  {rule.learn}: step {n}/{steps} train KL {history[-1][1]:.4f} held-out KL {kl:.4f}", flush=True)
            if kl < best:
                best, best_step = kl, n
                best_state = {k: v.detach().clone() for k, v in rule.state_dict().items()}
    rule.load_state_dict(best_state)
    return {"held_out_kl_before": round(before, 4), "held_out_kl_after": round(best, 4), "best_step": best_step,
            "history": history, "fit_s": round(time.perf_counter() - t0, 1), **rule.summary()}  # fmt: skip


async def evaluate(
    sender: LocalEngine, receiver: LocalEngine, adapter: Adapter, rules: dict[str, MappedAttention], budget: float,
    every: int, kinds: tuple[str, ...] | None = None,
) -> dict[str, Any]:  # fmt: skip
    policy, tail = TransferPolicy(), RoleSettings(engine="-").tail_window
    chooser = make_selector(policy.selector)
    items = builtin_suite(lengths=(1024,), per_cell=1, kinds=kinds)[::every]
    stats: dict[str, PathStats] = {}
    t0 = time.perf_counter()
    for n, item in enumerate(items):
        run = ItemRun(sender, receiver, item, 24 if item.metric == "answer" else 64, tail)
        await run.native(stats)
        await run.no_context(stats)
        await run.prepare_transfer(chooser, adapter, None)
        await run.quote(stats, budget)
        await run.recompute_only(stats, budget)
        hops: list[tuple[str, list[int], TransferResult, torch.Tensor, float]] = []
        for b in (0.0, budget):
            sel = await run.chosen(b) if b else Selection([], 0.0)
            tr = await transfer(adapter, run.hop, receiver, selection=sel, tail=tail)
            hops.append((f"map@{b:g}", run.r_ids, tr, mapped_positions(run.hop, tr, tail), sel.ms))
        ids, hop, tr, ms = await run.quoted_transfer(adapter, budget)
        hops.append((f"map+quote@{budget:g}", ids, tr, mapped_positions(hop, tr, tail), ms))
        for name, ids, tr, mapped, ms in hops:
            await run.run_path(stats, name, ids, tr.kv, ms + tr.total_ms)
            for label, rule in rules.items():
                with rule.active(mapped):
                    await run.run_path(stats, f"{name} {label}", ids, tr.kv, ms + tr.total_ms)
        print(f"items {n + 1}/{len(items)} ({item.kind}, {time.perf_counter() - t0:.0f} s)", flush=True)
    return {"selector": policy.selector, "budget": budget, "tail": tail, "items": len(items),
            "paths": {path: summary_by_kind(st) for path, st in stats.items()}}  # fmt: skip


async def probe(args: argparse.Namespace) -> dict[str, Any]:
    s, r = LocalEngine.from_zoo(args.sender), LocalEngine.from_zoo(args.receiver)
    adapter = Adapter.load(args.adapter, sender_fingerprint=s.spec.fingerprint, receiver_fingerprint=r.spec.fingerprint)
    MappedAttention.install(r.model)
    contexts = distill_contexts(args.seed, args.contexts)
    t0 = time.perf_counter()

    def progress(stage: str, i: int, total: int) -> None:
        print(f"  {stage} {i}/{total}", flush=True)

    in_place = await build_docs(s, r, adapter, contexts, budgets=(0.0, args.budget), path="recompute",
                                seed=args.seed, progress=progress)  # fmt: skip
    quoted = await build_docs(s, r, adapter, contexts, budgets=(args.budget,), path="quote", seed=args.seed,
                              progress=progress)  # fmt: skip
    docs = [a + b for a, b in zip(in_place, quoted, strict=True)]
    collect_s = round(time.perf_counter() - t0, 1)
    rules, fits = {}, {}
    for learn in args.learn.split(","):
        rule = MappedAttention.for_model(r.model, slots=args.slots, learn=learn)
        fits[learn] = await fit_rule(r, adapter, docs, rule, steps=args.steps, lr=args.lr, seed=args.seed)
        rules[f"learned {learn}"] = rule
    kinds = tuple(args.kinds.split(",")) if args.kinds else None
    result = await evaluate(s, r, adapter, rules, args.budget, args.every, kinds)
    return {"sender": args.sender, "receiver": args.receiver, "adapter": str(args.adapter),
            "adapter_version": adapter.manifest.version, "contexts": args.contexts, "collect_s": collect_s,
            "fits": fits, **result}  # fmt: skip


LOOKUPS = ("passkey", "multikey", "facts", "handoff")  # BENCHMARKS.md's look-up columns
NO_SHARED = ("paraphrase", "update", "chain")


def table(result: dict[str, Any]) -> str:
    """The markdown table BENCHMARKS.md quotes: per path, accuracy on the look-up kinds and on the
    no-shared-word kinds (means over their items), whole-context KL and top-1, median TTFT."""

    def acc(row: dict[str, Any], kinds: tuple[str, ...]) -> str:
        hits = [i for i, (c, _) in row["per_item"].items() if c is not None and i.split("-1024-")[0] in kinds]
        return f"{sum(row['per_item'][i][0] for i in hits) / len(hits):.2f}" if hits else "-"

    lines = ["| path | look-up acc | no-shared-word acc | whole-context KL | whole-context top-1 | median TTFT ms |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    for path, row in result["paths"].items():
        kl, top1 = row.get("fidelity_kl"), row.get("fidelity_top1")
        lines.append(f"| {path} | {acc(row, LOOKUPS)} | {acc(row, NO_SHARED)} | "
                     f"{'-' if kl is None else f'{kl:.3f}'} | {'-' if top1 is None else f'{top1:.2f}'} | "
                     f"{row['ttft_ms']:.0f} |")  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("sender", nargs="?")
    ap.add_argument("receiver", nargs="?")
    ap.add_argument("adapter", type=Path, nargs="?", help="the adapter folder (the frozen map)")
    ap.add_argument("--learn", default="bias,bias+slots", help="comma-separated rules to fit")
    ap.add_argument("--slots", type=int, default=4, help="learned key/value slots per layer")
    ap.add_argument("--contexts", type=int, default=16)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--lr", type=float, default=0.03)
    ap.add_argument("--budget", type=float, default=0.02)
    ap.add_argument("--every", type=int, default=1, help="every n-th builtin item")
    ap.add_argument("--kinds", help="comma-separated builtin kinds to evaluate (default: all)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--table", type=Path, help="print the markdown table of a results JSON and exit")
    args = ap.parse_args()
    if args.table:
        print(table(json.loads(args.table.read_text())))
        return
    if not (args.sender and args.receiver and args.adapter):
        ap.error("SENDER, RECEIVER and ADAPTER are needed to run the probe")
    result = asyncio.run(probe(args))
    print(json.dumps(result["fits"], indent=1))
    report(result, args.json, max(len(p) for p in result["paths"]) + 1)
    print(table(result))


if __name__ == "__main__":
    main()
