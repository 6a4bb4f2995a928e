"""Evaluation of one direction on JSONL task items: every path and ablation on the same items.

The sender processes the context (its own prompt: the context as a user message). The receiver
answers ``{context}\\n\\nQuestion: {question}`` in its own prompt format, followed by ``Answer:``.
Paths (``PATH_FAMILIES``; ``paths=`` runs a subset, native always runs):
- ``native``: the receiver prefills everything itself (the ceiling);
- ``no_context``: it sees only the question (the floor);
- ``sender``: the sender answers alone, with the context;
- ``quote@b``: no transfer at all. The selector's choice at budget ``b`` (``--selector``,
  ``engines.selectors``; the gateway's default when not given), as text: the chosen tokens'
  character spans, merged where adjacent, in context order, joined by ``QUOTE_SEPARATOR``
  (``heterofold.select.elide``), then the question; native prefill of that short prompt;
- ``recompute_only@b``: the same chosen tokens (plus the receiver's template tokens and the last
  prefix token, so the suffix continues at its true position) prefilled natively at their true
  positions with every other context token absent (dropped): what the recompute alone knows.
  Gemma3's sliding layers then count their window in kept tokens, not positions;
- ``{method}@b`` for each adapter given (``heterofold``, ``kv_ridge``, a distilled map, ...): the
  mapped cache plus native recompute of the same chosen tokens; ``@0`` is map-only;
- ``{method}+quote@b``: the mapped cache with no recompute (the template tokens aside), and the
  chosen spans quoted as in ``quote@b`` between the context and the question (placed by
  ``heterofold.select.quote_into``, as the gateway's ``map_quote`` hop), prefilled natively
  with the suffix: the whole context as KV and the selected sentences as text (a path any engine
  that imports a prefix can run, SGLang included);
- ``{method}+auto@b``: the gateway's ``auto`` path, decided per item as the gateway decides it
  (``engines.selectors.auto_path``): ``quote@b`` when the question names its sentence (lexical's
  confidence in one sentence) or asks for one detail (``engines.request_kind``), else
  ``{method}@b`` (``transfer``; ``{method}+quote@b`` with no request classifier); run afresh (its
  own TTFT, the decision's time included), with the branch taken in the item's ``via`` and
  whether lexical named the sentence in ``named``.
Every transfer path also recomputes the receiver tokens without a sender token (BOS, template).

Items are of two metrics (``TaskItem.metric``). ``answer`` items are scored by accuracy, plus
first-token KL and top-1 agreement against native teacher-forced over native's answer.
``fidelity`` items (summaries, continuations) have no answer: native writes up to
``fidelity_tokens`` tokens, and every path is scored by the mean per-token KL(native || path) and
top-1 agreement over native's whole answer, teacher-forced.

"What the map adds" (``map_adds``): per adapter and budget, per item, the map path's score minus
``recompute_only``'s at the same budget, and minus ``quote``'s (correct as 0/1 on answer items;
KL reduction on fidelity items), with mean, standard deviation and n, per kind.

Selector recall (``selector.recall``): per budget and kind of answer item, the share whose answer
value, and whose whole answer-bearing sentence, the selector chose (``heterofold.select.answer_recall``),
and the selector's median time. Every transfer runs ``engines.transfer.transfer``, the gateway's
own function, on the hop ``eval_hop`` builds with the gateway's sections function.

TTFT of a transfer path counts everything from the sender KV in memory to the receiver's first
token; quote and recompute_only include the selector's time.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from engines.base import SamplingParams
from engines.local import LocalEngine
from engines.selectors import (
    Evidence,
    HopText,
    Selection,
    Selector,
    auto_path,
    candidates,
    make_selector,
    names_its_sentence,
    select,
    warm,
)
from engines.transfer import TransferResult, transfer
from heterofold.adapter import Adapter, map_dtype
from heterofold.align import shared_sections
from heterofold.fidelity import first_token_kl, mean_kl, top1_agreement
from heterofold.kv import KVCache
from heterofold.select import answer_recall, elide, quote_into
from heterofold.tasks import TaskItem, is_correct

BUDGETS = (0.0, 0.02, 0.05, 0.1, 0.2)
PATH_FAMILIES = ("no_context", "sender", "quote", "recompute_only")  # plus per adapter: NAME, NAME+quote, NAME+auto


def known_paths(adapters: Iterable[str]) -> list[str]:
    """The path families ``evaluate`` can run with adapters of these names (native aside)."""
    return [*PATH_FAMILIES, *adapters, *(f"{name}+{how}" for name in adapters for how in ("quote", "auto"))]


@dataclass
class Score:
    """One item on one path."""

    kind: str
    correct: bool | None  # None on fidelity items
    ttft_ms: float
    first_kl: float | None = None
    top1: float | None = None
    kl: float | None = None  # mean per-token KL over native's answer
    answer_tokens: int = 0  # length of native's answer, the teacher-forced span
    via: str | None = None  # the auto path: the path it took ("quote", "transfer" or "map_quote")
    named: bool | None = None  # the auto path: lexical named the answering sentence


@dataclass
class PathStats:
    scores: dict[str, Score] = field(default_factory=dict)  # item id -> score

    def summary(self, native_accuracy: float | None) -> dict[str, Any]:
        s = list(self.scores.values())
        answers = [x.correct for x in s if x.correct is not None]
        out: dict[str, Any] = {"ttft_ms": round(statistics.median(x.ttft_ms for x in s), 1)}
        if answers:
            acc = sum(answers) / len(answers)
            out["accuracy"] = round(acc, 4)
            out["retention"] = round(acc / native_accuracy, 4) if native_accuracy else None
        for key, attr, on in (
            ("first_token_kl", "first_kl", True),
            ("top1_agreement", "top1", True),
            ("fidelity_kl", "kl", False),
            ("fidelity_top1", "top1", False),
        ):
            vals = [getattr(x, attr) for x in s if getattr(x, attr) is not None and (x.correct is not None) == on]
            if vals:
                out[key] = round(statistics.mean(vals), 4)
        return out


def receiver_prompt(engine: LocalEngine, content: str) -> str:
    text = engine.render([{"role": "user", "content": content}])
    return text + (" Answer:" if text.endswith(":") else "Answer:")


async def eval_hop(sender: LocalEngine, receiver: LocalEngine, item: TaskItem) -> HopText:
    """The hop an evaluation item makes: the sender reads the context (its own prompt: the context
    as a user message); the receiver is asked ``{context}\\n\\nQuestion: {question}``."""
    s_text = sender.render([{"role": "user", "content": item.context}])
    s_enc = sender.encode(s_text)
    s_kv, _ = await sender.prefill(s_enc.ids)
    r_text = receiver_prompt(receiver, f"{item.context}\n\nQuestion: {item.question}")
    r_enc = receiver.encode(r_text)
    sections = shared_sections(s_text, r_text, [item.context])
    if not sections:
        raise ValueError(f"item {item.id}: the context is not shared by the two prompts")
    return HopText(s_kv, s_text, s_enc.offsets, r_text, r_enc.ids, r_enc.offsets, sections, item.question)


async def fidelity(
    receiver: LocalEngine, r_ids: list[int], answer: list[int], kv: KVCache, ref: torch.Tensor
) -> tuple[float, float]:
    """First-token KL and top-1 agreement of ``kv`` against native's teacher-forced logits ``ref``."""
    logits = await receiver.score(r_ids + answer, past=kv)  # rows for positions kv.num_tokens..
    rows = logits[len(r_ids) - 1 - kv.num_tokens :]  # (1 + len(answer), V), aligned with ref
    return first_token_kl(ref[0], rows[0]), top1_agreement(ref[:-1] if answer else ref, rows[:-1] if answer else rows)


async def evaluate(
    sender: LocalEngine,
    receiver: LocalEngine,
    items: Sequence[TaskItem],
    *,
    adapters: Mapping[str, Adapter],
    served: str = "heterofold",
    budget: float = 0.02,
    budgets: Sequence[float] = BUDGETS,
    paths: Sequence[str] | None = None,
    selector: str = "lexical",
    scout: LocalEngine | None = None,
    tail: int = 0,
    max_tokens: int = 24,
    fidelity_tokens: int = 64,
    progress: Callable[[str, int, int], None] | None = None,
) -> dict[str, Any]:
    """Every path on ``items`` (module docstring). ``adapters`` maps a method name to its adapter;
    ``served`` names the one the gateway serves, reported as ``paths.heterofold`` at ``budget``.
    ``paths`` picks families from ``PATH_FAMILIES`` and ``adapters`` (default: all). ``selector``
    (``engines.selectors``) chooses for every path; one that reads the mapped cache reads
    ``served``'s map; ``scout`` is the scout selector's reader. ``tail``: the last ``tail`` prefix
    tokens are recomputed natively on every transfer path and kept by recompute_only (the
    gateway's ``tail_window``)."""
    known = known_paths(list(adapters))
    wanted = set(paths) if paths is not None else set(known)
    unknown = wanted - set(known) - {"native"}
    if unknown:
        raise ValueError(f"unknown paths {sorted(unknown)}: choose from {known}")
    sweep = sorted(set(budgets) | {budget})
    chooser = make_selector(selector)
    warm(selector, auto=any("+auto" in p for p in wanted))  # tables read lazily load before any item is timed
    if chooser.needs_map and served not in adapters:
        raise ValueError(f"selector {selector} reads the mapped cache: give the served adapter {served!r}")
    stats: dict[str, PathStats] = {}
    recalls: dict[str, dict[str, list[Any]]] = {}  # budget -> [(kind, answer hit, sentence hit, ms)]
    lengths: dict[str, list[int]] = {}  # native answer tokens per metric
    for n, item in enumerate(items):
        ev = ItemRun(sender, receiver, item, max_tokens if item.metric == "answer" else fidelity_tokens, tail)
        await ev.native(stats)
        lengths.setdefault(item.metric, []).append(len(ev.answer))
        if "no_context" in wanted:
            await ev.no_context(stats)
        if "sender" in wanted and item.metric == "answer":
            await ev.sender_alone(stats)
        await ev.prepare_transfer(chooser, adapters.get(served), scout)
        for b in (b for b in sweep if b > 0):
            if item.metric == "answer":
                recalls.setdefault(f"{b:g}", {}).setdefault(item.kind or "all", []).append(await ev.recall(b))
            if "quote" in wanted:
                await ev.quote(stats, b)
            if "recompute_only" in wanted:
                await ev.recompute_only(stats, b)
        for name, adapter in adapters.items():
            if name in wanted:
                for b in sweep:
                    await ev.mapped(stats, name, adapter, b)
            if f"{name}+quote" in wanted:
                for b in (b for b in sweep if b > 0):
                    await ev.mapped_quote(stats, name, adapter, b)
            if f"{name}+auto" in wanted:
                for b in (b for b in sweep if b > 0):
                    await ev.auto(stats, name, adapter, b)
        if progress:
            progress("eval", n + 1, len(items))
    report = _report(sender, receiver, items, stats, adapters, served, budget, lengths)
    report["selector"] = {"name": chooser.name, "recall": _recall_summary(recalls)}
    report["tail"] = tail
    return report


class ItemRun:
    """One item through every path; ``stats`` collects a ``Score`` per path."""

    def __init__(self, sender: LocalEngine, receiver: LocalEngine, item: TaskItem, max_tokens: int, tail: int) -> None:
        self.sender, self.receiver, self.item, self.tail = sender, receiver, item, tail
        self.greedy = SamplingParams(max_tokens=max_tokens)
        self.r_text = receiver_prompt(receiver, f"{item.context}\n\nQuestion: {item.question}")
        self.r_enc = receiver.encode(self.r_text)
        self.r_ids = list(self.r_enc.ids)
        self.answer: list[int] = []
        self.ref = torch.empty(0)
        self._chosen: dict[float, Selection] = {}

    def _record(self, stats: dict[str, PathStats], path: str, output: str, ttft: float, rows: torch.Tensor) -> None:
        """``rows``: the path's logits ``(1 + len(answer), V)`` aligned with native's ``ref``."""
        item, ref = self.item, self.ref
        correct = is_correct(item.answer, output) if item.metric == "answer" else None
        score = Score(item.kind or "all", correct, ttft, answer_tokens=len(self.answer))
        score.first_kl = first_token_kl(ref[0], rows[0])
        if self.answer:
            score.top1 = top1_agreement(ref[:-1], rows[:-1])
            score.kl = mean_kl(ref[:-1], rows[:-1])
        stats.setdefault(path, PathStats()).scores[item.id] = score

    async def run_path(
        self, stats: dict[str, PathStats], path: str, ids: list[int], past: KVCache | None, extra_ms: float
    ) -> None:
        out = await self.receiver.complete(ids, self.greedy, past=past)
        logits = await self.receiver.score(ids + self.answer, past=past)
        rows = logits[len(ids) - 1 - (past.num_tokens if past else 0) :]
        self._record(stats, path, out.text, extra_ms + out.timings.ttft_ms, rows)

    async def native(self, stats: dict[str, PathStats]) -> None:
        r_ids = self.r_ids
        kv_n, pre = await self.receiver.prefill(r_ids[:-1])  # then generate: keeps teacher forcing cheap
        out = await self.receiver.complete(r_ids, self.greedy, past=kv_n)
        self.answer = list(out.token_ids)
        self.ref = await self.receiver.score(r_ids + self.answer, past=kv_n)  # (1 + len(answer), V)
        self._record(stats, "native", out.text, pre.prefill_ms + out.timings.ttft_ms, self.ref)

    async def no_context(self, stats: dict[str, PathStats]) -> None:
        ids = list(self.receiver.encode(receiver_prompt(self.receiver, f"Question: {self.item.question}")).ids)
        await self.run_path(stats, "no_context", ids, None, 0.0)

    async def sender_alone(self, stats: dict[str, PathStats]) -> None:
        s_ids = self.sender.encode(
            receiver_prompt(self.sender, f"{self.item.context}\n\nQuestion: {self.item.question}")
        ).ids
        alone = await self.sender.complete(s_ids, self.greedy)
        score = Score(self.item.kind or "all", is_correct(self.item.answer, alone.text), alone.timings.ttft_ms)
        stats.setdefault("sender", PathStats()).scores[self.item.id] = score

    async def prepare_transfer(self, selector: Selector, served: Adapter | None, scout: LocalEngine | None) -> None:
        self.hop = hop = await eval_hop(self.sender, self.receiver, self.item)
        self.prefix = hop.transferable_prefix()
        src = hop.source(self.prefix)
        self.unaligned = (src < 0).nonzero().squeeze(1).tolist()
        self.selector, self.served = selector, served
        self.evidence = Evidence(hop, candidates(hop, self.prefix), self.sender, self.receiver, None, scout)
        self.q_start = hop.receiver_text.index(self.item.context)
        self._map_ms = 0.0

    async def chosen(self, b: float) -> Selection:
        """The selector's choice at budget ``b``, made once for every path (a selector that reads
        the mapped cache reads the served adapter's map-only cache, whose time it is charged)."""
        if b not in self._chosen:
            if self.selector.needs_map and self.evidence.mapped is None:
                assert self.served is not None
                tr = await transfer(self.served, self.hop, self.receiver)
                self.evidence = replace(self.evidence, mapped=tr.kv)
                self._map_ms = tr.total_ms
            sel = await select(self.selector, self.evidence, b)
            self._chosen[b] = replace(sel, ms=sel.ms + self._map_ms)
        return self._chosen[b]

    async def recall(self, b: float) -> tuple[bool, bool, float]:
        sel = await self.chosen(b)
        spans = [
            (self.r_enc.offsets[j][0] - self.q_start, self.r_enc.offsets[j][1] - self.q_start) for j in sel.positions
        ]
        value, sentence = answer_recall(self.item.context, self.item.answer, spans)
        return value, sentence, sel.ms

    async def quoted(self, b: float) -> tuple[str, float]:
        sel = await self.chosen(b)
        return elide(self.r_text, [self.r_enc.offsets[j] for j in sel.positions]), sel.ms

    async def quote(self, stats: dict[str, PathStats], b: float) -> None:
        ids, select_ms = await self.quote_ids(b)
        await self.run_path(stats, f"quote@{b:g}", ids, None, select_ms)

    async def quote_ids(self, b: float) -> tuple[list[int], float]:
        """The ``quote`` prompt's receiver ids at budget ``b``, and the selector's time."""
        quoted, select_ms = await self.quoted(b)
        text = receiver_prompt(self.receiver, f"{quoted}\n\nQuestion: {self.item.question}")
        return list(self.receiver.encode(text).ids), select_ms

    async def auto(self, stats: dict[str, PathStats], name: str, adapter: Adapter, b: float) -> None:
        """The gateway's ``auto`` path (module docstring): quote, the map with the spans
        recomputed in place, or (with no request classifier) the map with the spans quoted."""
        t0 = time.perf_counter()
        via = auto_path(self.evidence)
        decide_ms = (time.perf_counter() - t0) * 1000
        path = f"{name}+auto@{b:g}"
        if via == "quote":
            ids, select_ms = await self.quote_ids(b)
            await self.run_path(stats, path, ids, None, decide_ms + select_ms)
        elif via == "transfer":
            sel = await self.chosen(b)
            tr = await transfer(adapter, self.hop, self.receiver, selection=sel, tail=self.tail)
            await self.run_path(stats, path, self.r_ids, tr.kv, decide_ms + sel.ms + tr.total_ms)
        else:
            ids, _, tr, select_ms = await self.quoted_transfer(adapter, b)
            await self.run_path(stats, path, ids, tr.kv, decide_ms + select_ms + tr.total_ms)
        score = stats[path].scores[self.item.id]
        score.via, score.named = via, names_its_sentence(self.evidence)

    async def recompute_only(self, stats: dict[str, PathStats], b: float) -> None:
        sel = await self.chosen(b)
        tail = set(range(max(self.prefix - self.tail, 0), self.prefix))
        kept = sorted(set(sel.positions) | set(self.unaligned) | tail | {self.prefix - 1})
        t0 = time.perf_counter()
        kv = await self.receiver.prefill_at([self.r_ids[j] for j in kept], kept)
        prefill_ms = (time.perf_counter() - t0) * 1000
        ids = [self.r_ids[j] for j in kept] + self.r_ids[self.prefix :]
        await self.run_path(stats, f"recompute_only@{b:g}", ids, kv, sel.ms + prefill_ms)

    async def mapped_quote(self, stats: dict[str, PathStats], name: str, adapter: Adapter, b: float) -> None:
        ids, _, tr, select_ms = await self.quoted_transfer(adapter, b)
        await self.run_path(stats, f"{name}+quote@{b:g}", ids, tr.kv, select_ms + tr.total_ms)

    async def quoted_transfer(self, adapter: Adapter, b: float) -> tuple[list[int], HopText, TransferResult, float]:
        """The ``map_quote`` hop: the whole context mapped, the budget's spans quoted before the
        question; its receiver ids, hop, transfer and the selector's time."""
        quoted, select_ms = await self.quoted(b)
        item = self.item
        content = f"{item.context}\n\nQuestion: {item.question}"
        shared = [(s.receiver_start, s.length) for s in self.hop.sections]
        quoted_content, _ = quote_into(content, self.r_text.rfind(content), shared, quoted)
        text = receiver_prompt(self.receiver, quoted_content)
        enc = self.receiver.encode(text)
        ids = list(enc.ids)
        hop = replace(self.hop, receiver_text=text, receiver_ids=enc.ids, receiver_offsets=enc.offsets,
                      sections=shared_sections(self.hop.sender_text, text, [item.context]))  # fmt: skip
        tr = await transfer(adapter, hop, self.receiver, tail=self.tail)
        return ids, hop, tr, select_ms

    async def mapped(self, stats: dict[str, PathStats], name: str, adapter: Adapter, b: float) -> None:
        sel = await self.chosen(b) if b > 0 else Selection([], 0.0)
        tr = await transfer(adapter, self.hop, self.receiver, selection=sel, tail=self.tail)
        await self.run_path(stats, f"{name}@{b:g}", self.r_ids, tr.kv, sel.ms + tr.total_ms)


def _recall_summary(recalls: dict[str, dict[str, list[Any]]]) -> dict[str, Any]:
    """Per budget and kind: the share of answer items whose answer (and whole answer sentence) the
    selector chose, and the selector's median time."""
    out: dict[str, Any] = {}
    for b, by_kind in recalls.items():
        rows = {**by_kind, "all": [r for rs in by_kind.values() for r in rs]}
        out[b] = {
            kind: {
                "answer": round(sum(r[0] for r in rs) / len(rs), 4),
                "sentence": round(sum(r[1] for r in rs) / len(rs), 4),
                "ms": round(statistics.median(r[2] for r in rs), 1),
                "n": len(rs),
            }
            for kind, rs in rows.items()
        }
    return out


def _report(
    sender: LocalEngine,
    receiver: LocalEngine,
    items: Sequence[TaskItem],
    stats: dict[str, PathStats],
    adapters: Mapping[str, Adapter],
    served: str,
    budget: float,
    lengths: dict[str, list[int]],
) -> dict[str, Any]:
    native = stats["native"].summary(None)
    native_acc = native.get("accuracy")
    summaries = {p: s.summary(native_acc) for p, s in stats.items()}
    frontier: dict[str, dict[str, Any]] = {}
    for p, v in summaries.items():
        if "@" in p:
            family, b = p.split("@")
            frontier.setdefault(family, {})[b] = v
    at = f"{budget:g}"
    headline: dict[str, dict[str, Any]] = {
        p: summaries[p] for p in ("native", "no_context", "sender") if p in summaries
    }
    for family, by_budget in frontier.items():
        if at in by_budget:
            headline[family] = {**by_budget[at], "budget": budget}
        if "0" in by_budget:
            headline[f"{family}_map_only"] = by_budget["0"]
    if served in adapters and served != "heterofold" and f"{served}@{at}" in summaries:
        headline["heterofold"] = {**summaries[f"{served}@{at}"], "budget": budget, "method": served}
    if "kv_ridge" in frontier:  # the names outside checks and bench/report.py read
        headline["kv_ridge"] = frontier["kv_ridge"].get("0", {})
        if at in frontier["kv_ridge"]:
            headline["kv_ridge_recompute"] = {**frontier["kv_ridge"][at], "budget": budget}
        headline.pop("kv_ridge_map_only", None)
    kinds = sorted({s.kind for s in stats["native"].scores.values()})
    by_kind: dict[str, dict[str, Any]] = {}
    for kind in kinds:
        for p, s in stats.items():
            sub = PathStats({i: x for i, x in s.scores.items() if x.kind == kind})
            if sub.scores:
                by_kind.setdefault(kind, {})[p] = sub.summary(None)
    return {
        "sender": sender.spec.name,
        "receiver": receiver.spec.name,
        "items": len(items),
        "paths": headline,
        "budget_frontier": frontier,
        "heterofold_budget_frontier": frontier.get("heterofold", {}),
        "kv_ridge_budget_frontier": {b: v for b, v in frontier.get("kv_ridge", {}).items() if b != "0"},
        "accuracy_by_kind": {
            k: {p: v["accuracy"] for p, v in by.items() if "accuracy" in v} for k, by in by_kind.items()
        },
        "by_kind": by_kind,
        "map_adds": _map_adds(stats, adapters),
        "auto_via": {  # per auto path: how many items took each branch
            p: {via: sum(x.via == via for x in s.scores.values()) for via in ("quote", "transfer", "map_quote")}
            for p, s in stats.items()
            if "+auto@" in p
        },
        "native_answer_tokens": {m: {"median": statistics.median(v), "min": min(v)} for m, v in lengths.items()},
        "per_item": {p: {i: vars(x) for i, x in s.scores.items()} for p, s in stats.items()},
        "adapters": {name: a.manifest.metrics | {"version": a.manifest.version} for name, a in adapters.items()},
        "machine": machine(sender),
    }


def machine(engine: LocalEngine) -> dict[str, Any]:
    """What a mapped path's numbers depend on beyond the code: the map's matmul dtype (bfloat16 on a
    CPU with native bfloat16 dot products, else float32: two hosts can differ) and torch's build."""
    return {
        "map_dtype": str(map_dtype(engine.device)).removeprefix("torch."),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
    }


def _map_adds(stats: dict[str, PathStats], adapters: Mapping[str, Adapter]) -> dict[str, Any]:
    """Per adapter and budget: the map path minus recompute_only, and minus quote, per kind."""
    out: dict[str, Any] = {}
    for path, s in stats.items():
        family, _, b = path.partition("@")
        if family not in adapters or b == "0":
            continue
        for base in ("recompute_only", "quote"):
            other = stats.get(f"{base}@{b}")
            if other is None:
                continue
            diffs: dict[str, list[float]] = {}
            for i, x in s.scores.items():
                y = other.scores[i]
                if x.correct is not None:
                    d = float(x.correct) - float(bool(y.correct))
                    diffs.setdefault(f"{x.kind}:accuracy", []).append(d)
                    diffs.setdefault("all:accuracy", []).append(d)
                elif x.kl is not None and y.kl is not None:
                    d = y.kl - x.kl
                    diffs.setdefault(f"{x.kind}:kl_reduction", []).append(d)
                    diffs.setdefault("all:kl_reduction", []).append(d)
            out.setdefault(family, {}).setdefault(b, {})[f"vs_{base}"] = {
                k: {"mean": round(statistics.mean(v), 4), "sd": round(statistics.pstdev(v), 4), "n": len(v)}
                for k, v in sorted(diffs.items())
            }
    return out
