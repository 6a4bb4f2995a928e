"""Selectors compared on the same items: answer recall at each budget, the selector's own time, and
(optionally) the accuracy of quoting each selector's choice.

For every item of the builtin suite (or a JSONL file) the hop is built as ``heterofold eval``
builds it (``harness.evaluate.eval_hop``: the gateway's sections function and candidates). Each
basic selector reads once per item (``Selector.ranker``); unions interleave those rankings (gated
unions in the order ``heterofold.select.gated`` picks; a fallback ``A|B`` is A's ranking alone,
at A's time, when A is confident), and their time is the sum of their parts'. At each budget,
``heterofold.select.answer_recall`` says whether the chosen tokens cover the answer value, and
its whole sentence (no model judges). With ``quote_budget``, each selector's choice at that
budget is quoted as ``heterofold eval``'s quote path does and the receiver answers greedily
(accuracy), next to the receiver's native accuracy.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from engines.base import SamplingParams
from engines.local import LocalEngine
from engines.selectors import BASIC, Evidence, Selection, candidates, choose_with, warm, window
from engines.transfer import transfer
from harness.evaluate import eval_hop, receiver_prompt
from heterofold.adapter import Adapter
from heterofold.select import GATE, Ranker, Ranking, answer_recall, elide, gated, spans_of, union
from heterofold.tasks import TaskItem, is_correct

UNIONS = ("sender-attention+receiver-attention", "sender-attention+lexical", "receiver-attention+lexical",
          "scout+lexical", "meaning+lexical", "meaning+sender-attention")  # fmt: skip
# heterofold.select.gated: the lexical part first when it is confident
GATED = ("lexical/sender-attention", "lexical-hop/sender-attention", "lexical/scout", "lexical-hop/scout")
# engines.selectors.Fallback: the lexical part alone when confident, else the other first (and its time)
FALLBACKS = ("lexical|sender-attention", "lexical-hop|sender-attention", "lexical-hop|scout", "lexical-hop|meaning",
             "lexical-hop|meaning|sender-attention")  # fmt: skip


async def compare(
    sender: LocalEngine,
    receiver: LocalEngine,
    items: Sequence[TaskItem],
    *,
    adapter: Adapter | None,
    scout: LocalEngine | None,
    budgets: Sequence[float] = (0.01, 0.02, 0.05),
    quote_budget: float | None = 0.02,
    quote_selectors: Sequence[str] | None = None,
    native: bool = True,
    progress: Callable[[str, int, int], None] | None = None,
) -> dict[str, Any]:
    """Recall (and quote accuracy) per selector, budget and kind on ``items`` (module docstring).
    Selectors that need what is not given (an adapter for receiver-attention, a scout) are left out.
    ``quote_selectors`` limits the quote accuracy (a greedy answer per selector and item) to those
    named; None quotes every selector's choice."""
    names = ["lexical", "lexical-hop", "meaning", "sender-attention"]
    if adapter is not None:
        names.append("receiver-attention")
    if scout is not None:
        names.append("scout")
    unions = [u for u in UNIONS if all(p in names for p in u.split("+"))]
    gates = [g for g in GATED if all(p in names for p in g.split("/"))]
    fallbacks = [f for f in FALLBACKS if all(p in names for p in f.split("|"))]
    warm("meaning")  # its table loads once, before any item is timed
    rows: list[dict[str, Any]] = []
    greedy = SamplingParams(max_tokens=24)
    for n, item in enumerate(i for i in items if i.metric == "answer"):
        hop = await eval_hop(sender, receiver, item)
        prefix = hop.transferable_prefix()
        ev = Evidence(hop, candidates(hop, prefix), sender, receiver, None, scout)
        rankers: dict[str, tuple[Ranker, float]] = {}
        view = spans_of(*window(ev))
        for name in names:
            t0 = time.perf_counter()
            if name == "receiver-attention":
                assert adapter is not None
                ev = replace(ev, mapped=(await transfer(adapter, hop, receiver)).kv)
            ranking = (await BASIC[name].ranker(ev))(view)  # ranked once, inside the selector's time
            rankers[name] = (_fixed(ranking), (time.perf_counter() - t0) * 1000)
        for u in unions:
            parts = u.split("+")
            rankers[u] = (union(*(rankers[p][0] for p in parts)), sum(rankers[p][1] for p in parts))
        for g in gates:
            parts = g.split("/")
            rankers[g] = (gated(*(rankers[p][0] for p in parts)), sum(rankers[p][1] for p in parts))
        unsure = {}
        for f in fallbacks:
            first, *others = (rankers[p] for p in f.split("|"))
            confidence = first[0](view).confidence
            sure = confidence is None or confidence >= GATE
            rest = union(*(o[0] for o in others)) if len(others) > 1 else others[0][0]
            rankers[f] = first if sure else (union(rest, first[0]), first[1] + sum(o[1] for o in others))
            unsure[f] = not sure
        ctx_at = hop.receiver_text.index(item.context)
        row: dict[str, Any] = {"id": item.id, "kind": item.kind or "all", "selectors": {}}
        for name, (ranker, read_ms) in rankers.items():
            per: dict[str, Any] = {"read_ms": round(read_ms, 1)}
            if name in unsure:
                per["unsure"] = unsure[name]  # a fallback that read with its other part
            for b in budgets:
                sel = choose_with(ranker, ev, b)
                spans = [(hop.receiver_offsets[j][0] - ctx_at, hop.receiver_offsets[j][1] - ctx_at)
                         for j in sel.positions]  # fmt: skip
                value, sentence = answer_recall(item.context, item.answer, spans)
                per[f"{b:g}"] = {"answer": value, "sentence": sentence, "ms": round(read_ms + sel.ms, 1)}
            if quote_budget is not None and (quote_selectors is None or name in quote_selectors):
                per["quote_correct"] = await _quote(receiver, item, hop, choose_with(ranker, ev, quote_budget), greedy)
            row["selectors"][name] = per
        if native:
            ids = list(hop.receiver_ids)
            row["native_correct"] = is_correct(item.answer, (await receiver.complete(ids, greedy)).text)
        rows.append(row)
        if progress:
            progress("selectors", n + 1, len([i for i in items if i.metric == "answer"]))
    return {
        "sender": sender.spec.name,
        "receiver": receiver.spec.name,
        "scout": scout.spec.name if scout else None,
        "items": len(rows),
        "budgets": [f"{b:g}" for b in budgets],
        "quote_budget": quote_budget,
        "quote_selectors": list(quote_selectors) if quote_selectors is not None else None,
        "summary": summarize(rows, [*names, *unions, *gates, *fallbacks], budgets),
        "per_item": rows,
    }


async def _quote(
    receiver: LocalEngine, item: TaskItem, hop: Any, sel: Selection, greedy: SamplingParams
) -> bool:  # fmt: skip
    quoted = elide(hop.receiver_text, [hop.receiver_offsets[j] for j in sel.positions])
    ids = receiver.encode(receiver_prompt(receiver, f"{quoted}\n\nQuestion: {item.question}")).ids
    return is_correct(item.answer, (await receiver.complete(ids, greedy)).text)


def summarize(rows: list[dict[str, Any]], names: Sequence[str], budgets: Sequence[float]) -> dict[str, Any]:
    """Per selector and kind (and ``all``): recall per budget, median time, quote accuracy."""
    kinds = sorted({r["kind"] for r in rows})
    out: dict[str, Any] = {}
    for name in names:
        for kind in [*kinds, "all"]:
            sub = [r for r in rows if kind in ("all", r["kind"])]
            times = [r["selectors"][name]["read_ms"] for r in sub]
            cell: dict[str, Any] = {"n": len(sub), "read_ms": round(statistics.median(times), 1),
                                    "read_ms_mean": round(statistics.fmean(times), 1)}  # fmt: skip
            if all("unsure" in r["selectors"][name] for r in sub):
                cell["unsure"] = round(sum(r["selectors"][name]["unsure"] for r in sub) / len(sub), 3)
            for b in (f"{b:g}" for b in budgets):
                cell[f"ms@{b}"] = round(statistics.median(r["selectors"][name][b]["ms"] for r in sub), 1)
                cell[f"answer@{b}"] = round(sum(r["selectors"][name][b]["answer"] for r in sub) / len(sub), 3)
                cell[f"sentence@{b}"] = round(sum(r["selectors"][name][b]["sentence"] for r in sub) / len(sub), 3)
            if all("quote_correct" in r["selectors"][name] for r in sub):
                cell["quote_accuracy"] = round(sum(r["selectors"][name]["quote_correct"] for r in sub) / len(sub), 3)
            if "native_correct" in sub[0]:
                cell["native_accuracy"] = round(sum(r["native_correct"] for r in sub) / len(sub), 3)
            out.setdefault(name, {})[kind] = cell
    return out


def markdown(result: dict[str, Any]) -> str:
    """One table: a row per selector, recall of the answer sentence per budget and kind group."""
    budgets = result["budgets"]
    kinds = [k for k in next(iter(result["summary"].values())) if k != "all"] + ["all"]
    mid = budgets[1 if len(budgets) > 1 else 0]
    head = ["selector", *(f"sentence recall @{b} (all)" for b in budgets), *(f"@{mid} {k}" for k in kinds[:-1]),
            "quote acc", "read ms"]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, by_kind in result["summary"].items():
        a = by_kind["all"]
        cells = [_cell(name), *(f"{a[f'sentence@{b}']:.2f}" for b in budgets),
                 *(f"{by_kind[k][f'sentence@{mid}']:.2f}" for k in kinds[:-1]),
                 f"{a['quote_accuracy']:.2f}" if "quote_accuracy" in a else "-", f"{a['read_ms']:.0f}"]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    native = next(iter(result["summary"].values()))["all"].get("native_accuracy")
    if native is not None:
        lines.append(f"\nnative accuracy on these items: {native:.2f}")
    return "\n".join(lines)


def across(results: Sequence[dict[str, Any]]) -> str:
    """One table over several runs (directions or lengths): a row per selector, a column per run,
    the answer-sentence recall of every answer item at each budget (``1% / 2% / 5%``), then the
    selector's median (and mean) time per item at the second budget (``_ms``)."""
    names = list(dict.fromkeys(n for r in results for n in r["summary"]))
    runs = [f"{_short(r['sender'])} → {_short(r['receiver'])}" for r in results]
    head = ["selector", *runs, *(f"ms {run}" for run in runs)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name in names:
        recall, times = [], []
        for r in results:
            cell = r["summary"].get(name, {}).get("all")
            recall.append(" / ".join(f"{cell[f'sentence@{b}']:.2f}" for b in r["budgets"]) if cell else "-")
            times.append(_ms(r, name))
        lines.append("| " + " | ".join([_cell(name), *recall, *times]) + " |")
    return "\n".join(lines)


def _fixed(ranking: Ranking) -> Ranker:
    """A ranker that answers a ranking made already (every choice of an item reads one view)."""
    return lambda _view: ranking


def _ms(result: dict[str, Any], name: str) -> str:
    """The selector's time per item at the run's second budget, read and choice together, median
    (mean) over the answer items (per item, so runs that timed the read alone differently agree)."""
    b = result["budgets"][1 if len(result["budgets"]) > 1 else 0]
    ms = [row["selectors"][name][b]["ms"] for row in result["per_item"] if name in row["selectors"]]
    return f"{statistics.median(ms):.0f} ({statistics.fmean(ms):.0f})" if ms else "-"


def _cell(name: str) -> str:
    """A selector's name in a Markdown table cell (a fallback's ``|`` escaped)."""
    return name.replace("|", "\\|")


def _short(model: str) -> str:
    return model.split("-")[0]


def main(argv: list[str]) -> None:
    """``python -m bench.selectors FILE...``: each run's table, then the table across runs."""
    import json
    import sys
    from pathlib import Path

    if not argv:
        sys.exit("usage: python -m bench.selectors RESULT.json ...")
    results = [json.loads(Path(a).read_text()) for a in argv]
    for r in results:
        print(f"\n{r['sender']} -> {r['receiver']}, {r['items']} items\n")
        print(markdown(r))
    print(f"\nanswer-sentence recall at {' / '.join(results[0]['budgets'])}, all answer items; ms per item\n")
    print(across(results))


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
