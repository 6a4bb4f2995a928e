"""Evaluation of one direction on JSONL task items, every path on the same items.

The sender processes the context (its own prompt: the context as a user message). The receiver
answers ``{context}\\n\\nQuestion: {question}`` in its own prompt format, followed by ``Answer:``:
- ``native``: it prefills everything itself (the ceiling);
- ``heterofold``: transfer with the HeteroFold adapter plus selective recompute (a budget of the
  context tokens, chosen by ``heterofold.select`` from the question);
- ``kv_ridge``: transfer with the KV Ridge adapter, no selective recompute (the baseline);
- ``kv_ridge_recompute``: the KV Ridge adapter with the same selective recompute as
  ``heterofold`` at its budget (and at every budget of the sweep, ``kv_ridge_budget_frontier``):
  what HeteroFold's own map adds once recompute is on, and the budget each needs for a quality;
- ``no_context``: it sees only the question (the floor);
- ``sender``: the sender answers alone, with the context.
Only receiver tokens without a sender token (BOS, template markers) are recomputed on every
transfer path. Transfer paths also get first-token KL and top-1 agreement against native,
teacher-forced over native's answer. TTFT of a transfer path counts everything from the sender
KV in memory to the receiver's first token.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from engines.base import SamplingParams
from engines.local import LocalEngine
from engines.transfer import transfer
from heterofold.adapter import Adapter
from heterofold.align import find_sections
from heterofold.kv import KVCache
from heterofold.metrics import first_token_kl, top1_agreement
from heterofold.select import select_tokens
from heterofold.tasks import TaskItem, is_correct

BUDGETS = (0.0, 0.02, 0.05, 0.1, 0.2)


@dataclass
class PathStats:
    correct: list[bool] = field(default_factory=list)
    ttft_ms: list[float] = field(default_factory=list)
    kl: list[float] = field(default_factory=list)
    top1: list[float] = field(default_factory=list)

    def summary(self, native_accuracy: float | None) -> dict[str, Any]:
        acc = sum(self.correct) / len(self.correct) if self.correct else 0.0
        out: dict[str, Any] = {"accuracy": round(acc, 4), "ttft_ms": round(statistics.median(self.ttft_ms), 1)}
        out["retention"] = round(acc / native_accuracy, 4) if native_accuracy else None
        if self.kl:
            out["first_token_kl"] = round(statistics.mean(self.kl), 4)
            out["top1_agreement"] = round(statistics.mean(self.top1), 4)
        return out


def receiver_prompt(engine: LocalEngine, content: str) -> str:
    text = engine.render([{"role": "user", "content": content}])
    return text + (" Answer:" if text.endswith(":") else "Answer:")


async def evaluate(
    sender: LocalEngine,
    receiver: LocalEngine,
    items: Sequence[TaskItem],
    *,
    heterofold: Adapter | None,
    kv_ridge: Adapter | None,
    budget: float = 0.1,
    budgets: Sequence[float] = BUDGETS,
    max_tokens: int = 24,
    progress: Callable[[str, int, int], None] | None = None,
) -> dict[str, Any]:
    greedy = SamplingParams(max_tokens=max_tokens)
    stats: dict[str, PathStats] = {}
    kinds: dict[str, dict[str, list[bool]]] = {}

    def record(path: str, item: TaskItem, output: str, ttft: float) -> None:
        ok = is_correct(item.answer, output)
        stats.setdefault(path, PathStats()).correct.append(ok)
        stats[path].ttft_ms.append(ttft)
        kinds.setdefault(item.kind or "all", {}).setdefault(path, []).append(ok)

    sweep = sorted(set(budgets) | {budget}) if heterofold else []
    for n, item in enumerate(items):
        content = f"{item.context}\n\nQuestion: {item.question}"
        r_text = receiver_prompt(receiver, content)
        r_enc = receiver.encode(r_text)
        r_ids = list(r_enc.ids)

        # native: prefill all but the last token, then generate; keeps teacher forcing cheap
        kv_n, pre = await receiver.prefill(r_ids[:-1])
        native = await receiver.complete(r_ids, greedy, past=kv_n)
        record("native", item, native.text, pre.prefill_ms + native.timings.ttft_ms)
        answer = list(native.token_ids)
        ref = await receiver.score(r_ids + answer, past=kv_n)  # (1 + len(answer), V)

        nc = receiver.encode(receiver_prompt(receiver, f"Question: {item.question}")).ids
        record("no_context", item, (await receiver.complete(nc, greedy)).text, 0.0)
        s_ids = sender.encode(receiver_prompt(sender, content)).ids
        alone = await sender.complete(s_ids, greedy)
        record("sender", item, alone.text, alone.timings.ttft_ms)

        s_text = sender.render([{"role": "user", "content": item.context}])
        s_enc = sender.encode(s_text)
        s_kv, _ = await sender.prefill(s_enc.ids)
        sections = find_sections(s_text, r_text, [item.context])
        ctx_start = sections[0].receiver_start

        runs: list[tuple[str, Adapter, float | None]] = []
        if kv_ridge:
            runs.append(("kv_ridge", kv_ridge, None))
            runs += [(f"kv_ridge@{b:g}", kv_ridge, b) for b in sweep if b > 0]
        runs += [(f"heterofold@{b:g}", heterofold, b) for b in sweep if heterofold]
        for path, adapter, fraction in runs:
            choose = context_chooser(item, r_enc.offsets, ctx_start, fraction or 0.0)
            tr = await transfer(adapter, s_kv, s_enc.offsets, receiver, r_ids, r_enc.offsets, sections, choose=choose)
            out = await receiver.complete(r_ids, greedy, past=tr.kv)
            record(path, item, out.text, tr.total_ms + out.timings.ttft_ms)
            kl, agree = await _fidelity(receiver, r_ids, answer, tr.kv, ref)
            stats[path].kl.append(kl)
            stats[path].top1.append(agree)
        if progress:
            progress("eval", n + 1, len(items))

    native_acc = sum(stats["native"].correct) / len(items)
    paths = {p: s.summary(native_acc) for p, s in stats.items()}
    if heterofold:
        paths["heterofold"] = {**paths[f"heterofold@{budget:g}"], "budget": budget}
    if f"kv_ridge@{budget:g}" in paths:
        paths["kv_ridge_recompute"] = {**paths[f"kv_ridge@{budget:g}"], "budget": budget}
    frontier = {p.split("@")[1]: v for p, v in paths.items() if p.startswith("heterofold@")}
    ridge_frontier = {p.split("@")[1]: v for p, v in paths.items() if p.startswith("kv_ridge@")}
    return {
        "sender": sender.spec.name,
        "receiver": receiver.spec.name,
        "items": len(items),
        "paths": {p: v for p, v in paths.items() if "@" not in p},
        "heterofold_budget_frontier": frontier,
        "kv_ridge_budget_frontier": ridge_frontier,
        "accuracy_by_kind": {
            k: {p: round(sum(v) / len(v), 4) for p, v in by.items()} for k, by in sorted(kinds.items())
        },
        "adapters": {
            name: a.manifest.metrics | {"version": a.manifest.version}
            for name, a in (("heterofold", heterofold), ("kv_ridge", kv_ridge))
            if a is not None
        },
    }


def context_chooser(
    item: TaskItem, offsets: Sequence[tuple[int, int]], ctx_start: int, fraction: float
) -> Callable[[torch.Tensor, int], list[int]]:
    """The selector over the receiver's context tokens (those inside the context section)."""

    def choose(src: torch.Tensor, prefix: int) -> list[int]:
        inside = [j for j, (a, b) in enumerate(offsets[:prefix]) if a >= ctx_start and b > a]
        rel = [(offsets[j][0] - ctx_start, offsets[j][1] - ctx_start) for j in inside]
        return [inside[i] for i in select_tokens(item.context, rel, item.question, fraction)]

    return choose


async def _fidelity(
    receiver: LocalEngine, r_ids: list[int], answer: list[int], kv: KVCache, ref: torch.Tensor
) -> tuple[float, float]:
    logits = await receiver.score(r_ids + answer, past=kv)  # rows for positions kv.num_tokens..
    rows = logits[len(r_ids) - 1 - kv.num_tokens :]  # (1 + len(answer), V), aligned with ref
    return first_token_kl(ref[0], rows[0]), top1_agreement(ref[:-1] if answer else ref, rows[:-1] if answer else rows)
