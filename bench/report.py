"""Turn the JSON results of ``heterofold eval`` and ``heterofold bench transfer`` into markdown tables
and an SVG plot (accuracy against recompute budget, per direction). No plotting dependency.

    python -m bench.report artifacts/results [--svg docs/frontier.svg]
    python -m bench.report --per-kind artifacts/results/full4k_*_4096.json   # answers and TTFT by kind
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

PATHS = ("native", "heterofold", "kv_ridge", "kv_ridge_recompute", "no_context", "sender")
COLOURS = ("#1b9e77", "#d95f02", "#7570b3", "#e7298a", "#66a61e", "#e6ab02")


def _load(folder: Path, prefix: str) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted(folder.glob(f"{prefix}_*.json"))]


def _evals(folder: Path) -> list[dict[str, Any]]:
    """One evaluation per direction: of the ``eval*_*.json`` files, those that also ran KV Ridge with
    recompute (the newer format) if any, and of those the one with the most items."""
    best: dict[tuple[str, str], dict[str, Any]] = {}
    for p in sorted(folder.glob("eval*_*.json")):
        e = json.loads(p.read_text())
        key = (e["sender"], e["receiver"])
        rank = (bool(e.get("kv_ridge_budget_frontier")), e["items"])
        old = best.get(key)
        if old is None or rank > (bool(old.get("kv_ridge_budget_frontier")), old["items"]):
            best[key] = e
    return [best[k] for k in sorted(best)]


def quality_table(evals: list[dict[str, Any]]) -> str:
    lines = [
        "| direction | items | " + " | ".join(PATHS) + " | HF retention | HF KL | HF top-1 | ridge KL | ridge top-1 |",
        "|---" * (len(PATHS) + 7) + "|",
    ]
    for e in evals:
        p = e["paths"]
        acc = " | ".join(f"{p[k]['accuracy']:.2f}" if k in p else "-" for k in PATHS)
        hf, kr = p.get("heterofold", {}), p.get("kv_ridge", {})
        lines.append(
            f"| {e['sender']} → {e['receiver']} | {e['items']} | {acc} | {hf.get('retention')} | "
            f"{hf.get('first_token_kl')} | {hf.get('top1_agreement')} | {kr.get('first_token_kl')} | "
            f"{kr.get('top1_agreement')} |"
        )
    return "\n".join(lines)


def frontier_table(evals: list[dict[str, Any]], method: str = "heterofold") -> str:
    """Accuracy (median TTFT) against recompute budget for ``method``'s map: heterofold or kv_ridge
    (whose budget-0 point is the plain ``kv_ridge`` path)."""
    key = f"{method}_budget_frontier"
    evals = [e for e in evals if e.get(key)]
    budgets = sorted({b for e in evals for b in e[key]} | ({"0"} if method == "kv_ridge" else set()), key=float)
    lines = [
        "| direction | native | " + " | ".join(f"budget {b}" for b in budgets) + " |",
        "|---" * (len(budgets) + 2) + "|",
    ]
    for e in evals:
        f = dict(e[key])
        if method == "kv_ridge" and "kv_ridge" in e["paths"]:
            f.setdefault("0", e["paths"]["kv_ridge"])
        cells = " | ".join(f"{f[b]['accuracy']:.2f} ({f[b]['ttft_ms']:.0f} ms)" if b in f else "-" for b in budgets)
        native = e["paths"]["native"]
        lines.append(
            f"| {e['sender']} → {e['receiver']} | {native['accuracy']:.2f} ({native['ttft_ms']:.0f} ms) | {cells} |"
        )
    return "\n".join(lines)


def speed_table(benches: list[dict[str, Any]]) -> str:
    lines = [
        "| direction | context | native TTFT ms | HeteroFold TTFT ms | speedup | KV Ridge TTFT ms | HF vs ridge | "
        "ridge + same recompute ms | HF vs it | align+map ms | memory floor ms | align+map / floor |",
        "|---" * 12 + "|",
    ]
    for b in sorted(benches, key=lambda x: (x["sender"], x["receiver"], x["context_tokens"])):
        hf, kr, krr = b.get("heterofold", {}), b.get("kv_ridge", {}), b.get("kv_ridge_recompute", {})
        lines.append(
            f"| {b['sender']} → {b['receiver']} | {b['context_tokens']} | {b['native_ttft_ms']:.0f} | "
            f"{hf.get('ttft_ms', 0):.0f} | {hf.get('speedup_vs_native')}x | {kr.get('ttft_ms', 0):.0f} | "
            f"{b.get('heterofold_speedup_vs_kv_ridge')}x | {krr.get('ttft_ms', '-')} | "
            f"{_times(b.get('heterofold_speedup_vs_kv_ridge_recompute'))} | {hf.get('align_map_ms')} | "
            f"{b['memory_floor_ms']} | "
            f"{hf.get('align_map_over_floor')}x |"
        )
    return "\n".join(lines)


def _times(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio}x"


def frontier_svg(evals: list[dict[str, Any]], width: int = 640, height: int = 360) -> str:
    """Accuracy (y) against recompute budget (x), one line per direction: solid HeteroFold, dotted KV
    Ridge with the same recompute (where measured), dashed native."""
    left, right, top, bottom = 50, 200, 20, 40
    w, h = width - left - right, height - top - bottom
    budgets = sorted({float(b) for e in evals for b in e["heterofold_budget_frontier"]}) or [0.0, 1.0]
    xmax = max(budgets) or 1.0

    def x(b: float) -> float:
        return left + w * b / xmax

    def y(a: float) -> float:
        return top + h * (1 - a)

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        'font-family="sans-serif" font-size="11">'
    ]
    out.append(f'<rect x="{left}" y="{top}" width="{w}" height="{h}" fill="none" stroke="#888"/>')
    for a in (0.0, 0.25, 0.5, 0.75, 1.0):
        out.append(f'<text x="{left - 8}" y="{y(a) + 4}" text-anchor="end">{a:.2f}</text>')
    for b in budgets:
        out.append(f'<text x="{x(b)}" y="{top + h + 16}" text-anchor="middle">{b:g}</text>')
    out.append(
        f'<text x="{left + w / 2}" y="{height - 6}" text-anchor="middle">'
        "recompute budget (share of context tokens)</text>"
    )
    for i, e in enumerate(evals):
        colour = COLOURS[i % len(COLOURS)]
        pts = sorted((float(b), v["accuracy"]) for b, v in e["heterofold_budget_frontier"].items())
        path = " ".join(f"{x(b):.1f},{y(a):.1f}" for b, a in pts)
        out.append(f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="2"/>')
        ridge = {float(b): v["accuracy"] for b, v in e.get("kv_ridge_budget_frontier", {}).items()}
        if ridge and "kv_ridge" in e["paths"]:
            ridge.setdefault(0.0, e["paths"]["kv_ridge"]["accuracy"])
            dots = " ".join(f"{x(b):.1f},{y(a):.1f}" for b, a in sorted(ridge.items()))
            out.append(f'<polyline points="{dots}" fill="none" stroke="{colour}" stroke-dasharray="1 3"/>')
        native = e["paths"]["native"]["accuracy"]
        out.append(
            f'<line x1="{left}" x2="{left + w}" y1="{y(native)}" y2="{y(native)}" '
            f'stroke="{colour}" stroke-dasharray="4 3"/>'
        )
        out.append(
            f'<text x="{left + w + 8}" y="{top + 14 * (i + 1)}" fill="{colour}">'
            f"{e['sender'].split('-')[0]} → {e['receiver'].split('-')[0]}</text>"
        )
    for i, line in enumerate(("solid: HeteroFold", "dotted: KV Ridge map", "dashed: native")):
        out.append(f'<text x="{left + w + 8}" y="{top + h - 14 * (2 - i)}" fill="#444">{line}</text>')
    out.append("</svg>")
    return "\n".join(out)


WHOLE_KINDS = ("summary", "continue")
PARAPHRASE = "paraphrase"


def answer_kinds(e: dict[str, Any]) -> list[str]:
    """The answer kinds of one ``heterofold eval`` JSON, in the order its items first show them."""
    return list(dict.fromkeys(v["kind"] for items in e["per_item"].values() for v in items.values()
                              if v["correct"] is not None))  # fmt: skip


def per_kind_header(e: dict[str, Any]) -> str:
    cols = ("path", *answer_kinds(e), "answers", "whole-context KL", "top-1", "TTFT ms all", "look-ups", "paraphrases",
            "whole-context")  # fmt: skip
    return "| " + " | ".join(cols) + " |\n|" + "---|" * len(cols)


def per_kind_rows(e: dict[str, Any]) -> list[str]:
    """One markdown row per path of one ``heterofold eval`` JSON, from its per-item results: answers
    per answer kind (``answer_kinds``) and in all, mean whole-context KL and top-1 over the summary
    and continue items, and median TTFT over all items, the look-ups (answer items but the
    paraphrases), the paraphrases, and the whole-context items."""
    kinds = answer_kinds(e)
    rows = []
    for path, items in e["per_item"].items():
        done = list(items.values())
        whole = [v for v in done if v["kind"] in WHOLE_KINDS]
        counts = [sum(1 for v in done if v["kind"] == k and v["correct"]) for k in kinds]

        def med(vs: list[dict[str, Any]]) -> str:
            return f"{statistics.median(v['ttft_ms'] for v in vs):.0f}" if vs else "-"

        kl = f"{statistics.mean(v['kl'] for v in whole):.3f}" if whole else "-"
        top1 = f"{statistics.mean(v['top1'] for v in whole):.3f}" if whole else "-"
        looks = [v for v in done if v["correct"] is not None and v["kind"] != PARAPHRASE]
        paraphrases = [v for v in done if v["kind"] == PARAPHRASE]
        cells = [path, *map(str, counts), str(sum(counts)), kl, top1, med(done), med(looks), med(paraphrases),
                 med(whole)]  # fmt: skip
        rows.append("| " + " | ".join(cells) + " |")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("folder", type=Path, nargs="?")
    ap.add_argument("--svg", type=Path, default=None)
    ap.add_argument("--per-kind", type=Path, nargs="+", default=None, metavar="EVAL_JSON")
    args = ap.parse_args()
    if args.per_kind:
        for f in args.per_kind:
            e = json.loads(f.read_text())
            print(f"{e['sender']} -> {e['receiver']}")
            print(per_kind_header(e))
            print("\n".join(per_kind_rows(e)))
        return
    if args.folder is None:
        ap.error("give a results folder, or --per-kind with eval JSON files")
    evals, benches = _evals(args.folder), _load(args.folder, "bench")
    print(
        "## Quality\n\n" + quality_table(evals) + "\n\n## Accuracy against recompute budget\n\n" + frontier_table(evals)
    )
    print("\n## KV Ridge map with the same recompute\n\n" + frontier_table(evals, "kv_ridge"))
    print("\n## Speed\n\n" + speed_table(benches))
    if args.svg:
        args.svg.parent.mkdir(parents=True, exist_ok=True)
        args.svg.write_text(frontier_svg(evals))


if __name__ == "__main__":
    main()
