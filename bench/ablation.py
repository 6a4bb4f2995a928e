"""The ablation table of BENCHMARKS.md from ``heterofold eval --json`` files.

One table per file (direction and length): a row per path (native, no_context, sender, quote,
recompute_only, and each adapter map-only and with recompute), and columns per group of kinds:
accuracy on the look-up kinds, accuracy on the kinds the lexical selector cannot see
(paraphrase, update, chain), and mean per-token KL / top-1 agreement against native on the
whole-context kinds (summary, continue), with the median TTFT. Then "what the map adds" per kind.

    python -m bench.ablation artifacts/results/ablation_*.json > tables.md
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any

GROUPS = {
    "look-up": ("passkey", "multikey", "facts", "handoff"),
    "meaning": ("paraphrase", "update", "chain"),
}
FIDELITY = ("summary", "continue")


def _order(path: str) -> tuple[int, str, float]:
    family, _, b = path.partition("@")
    rank = {"native": 0, "no_context": 1, "sender": 2, "quote": 3, "recompute_only": 4}.get(family, 5)
    rank += 1 if family.endswith("+quote") else 0
    return rank, family, float(b or 0)


def _cell(values: list[float], fmt: str = "{:.2f}") -> str:
    return fmt.format(statistics.mean(values)) if values else "-"


def table(result: dict[str, Any]) -> str:
    per_item: dict[str, dict[str, dict[str, Any]]] = result["per_item"]
    native = per_item["native"]
    counts = {g: sum(1 for x in native.values() if x["kind"] in kinds) for g, kinds in GROUPS.items()}
    n_fid = sum(1 for x in native.values() if x["kind"] in FIDELITY)
    head = (
        f"| path | look-up acc (n={counts['look-up']}) | no-shared-word acc (n={counts['meaning']}) "
        f"| whole-context KL (n={n_fid}) | whole-context top-1 | median TTFT ms |"
    )
    lines = [
        f"**{result['sender']} → {result['receiver']}**, {result['items']} items",
        "",
        head,
        "|---|---|---|---|---|---|",
    ]
    for path in sorted(per_item, key=_order):
        rows = per_item[path]
        family, _, b = path.partition("@")
        cells = [f"{family} map-only" if b == "0" else path.replace("@", " @ ")]
        for kinds in GROUPS.values():
            cells.append(_cell([float(x["correct"]) for x in rows.values() if x["kind"] in kinds]))
        fid = [x for x in rows.values() if x["kind"] in FIDELITY and x["kl"] is not None]
        cells.append(_cell([x["kl"] for x in fid], "{:.3f}"))
        cells.append(_cell([x["top1"] for x in fid]))
        cells.append(f"{statistics.median(x['ttft_ms'] for x in rows.values()):.0f}")
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        "What the map adds (map + recompute minus the ablation at the same budget; mean ± sd over items):",
        "",
    ]
    lines += ["| map | budget | vs | kind: mean ± sd (n) |", "|---|---|---|---|"]
    for method, by_budget in result.get("map_adds", {}).items():
        for b, by_base in by_budget.items():
            for base, kinds in by_base.items():
                text = "; ".join(f"{k} {v['mean']:+.2f} ± {v['sd']:.2f} ({v['n']})" for k, v in kinds.items())
                lines.append(f"| {method} | {b} | {base.removeprefix('vs_')} | {text} |")
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    for name in argv:
        print(table(json.loads(Path(name).read_text())))
        print()


if __name__ == "__main__":
    main(sys.argv[1:])
