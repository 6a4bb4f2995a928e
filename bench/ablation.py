"""The ablation table of BENCHMARKS.md from ``heterofold eval --json`` files.

One table per file (direction and length): a row per path (native, no_context, sender, quote,
recompute_only, and each adapter map-only and with recompute), and columns per group of kinds:
accuracy on the look-up kinds, accuracy on the kinds the lexical selector cannot see
(paraphrase, update, chain), and mean per-token KL / top-1 agreement against native on the
whole-context kinds (summary, continue), with the median TTFT. Then "what the map adds" per kind.

    python -m bench.ablation artifacts/results/ablation_*.json > tables.md
    python -m bench.ablation --targets docs/results/ablation_*.json docs/results/mapquote_*.json

``--targets`` prints instead one row per direction and map against the targets of the issue "make
the mapped cache carry the context", files of one direction merged (a path's first file wins):
map-only against no_context, map + recompute against recompute_only and quote, retention of native
accuracy over the answer items, and behaviour fidelity, at the budgets up to 5% that were run.
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


ANSWER = GROUPS["look-up"] + GROUPS["meaning"]


def _mean(rows: dict[str, dict[str, Any]], field: str, kinds: tuple[str, ...]) -> float | None:
    vals = [float(x[field]) for x in rows.values() if x["kind"] in kinds and x.get(field) is not None]
    return statistics.mean(vals) if vals else None


def _merged(results: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, dict[str, dict[str, Any]]]]:
    out: dict[tuple[str, str], dict[str, dict[str, dict[str, Any]]]] = {}
    for r in results:
        paths = out.setdefault((r["sender"], r["receiver"]), {})
        for path, rows in r["per_item"].items():
            paths.setdefault(path, rows)
    return out


def _fmt(x: float | None, fmt: str = "{:.2f}") -> str:
    return "-" if x is None else fmt.format(x)


def targets(results: list[dict[str, Any]]) -> str:
    """One row per direction and map (module docstring)."""
    lines = [
        "| direction | map | map-only vs no_context: answer acc; whole-context KL "
        "| whole-context KL, map+recompute / recompute_only / quote, per budget "
        "| look-up acc, map+recompute / quote, per budget | retention, best map path <= 5% "
        "| fidelity (KL, top-1), best map path <= 5% | map+quote (quote): retention, KL, per budget |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for (sender, receiver), paths in sorted(_merged(results).items()):
        native = _mean(paths["native"], "correct", ANSWER) or 0.0
        none = paths.get("no_context", {})
        budgets = sorted({float(b) for p in paths for b in [p.partition("@")[2]] if b and 0 < float(b) <= 0.05})
        maps = sorted({p.partition("@")[0] for p in paths if p.endswith("@0") and "+" not in p})
        for m in maps:
            only = paths[f"{m}@0"]
            a_only, a_none = _mean(only, "correct", ANSWER), _mean(none, "correct", ANSWER)
            k_only, k_none = _mean(only, "kl", FIDELITY), _mean(none, "kl", FIDELITY)
            kl_cells, look_cells, quote_cells, best_ret, best_fid = [], [], [], None, None
            for b in budgets:
                at = f"@{b:g}"
                got = {name: paths.get(name + at, {}) for name in (m, "recompute_only", "quote", f"{m}+quote")}
                kls = [_mean(got[n], "kl", FIDELITY) for n in (m, "recompute_only", "quote")]
                kl_cells.append(f"{b:g}: " + " / ".join(_fmt(k, "{:.3f}") for k in kls))
                looks = [_mean(got[n], "correct", GROUPS["look-up"]) for n in (m, "quote")]
                look_cells.append(f"{b:g}: " + " / ".join(_fmt(a) for a in looks))
                for name in (m, f"{m}+quote"):
                    rows = got[name]
                    acc = _mean(rows, "correct", ANSWER)
                    if acc is not None and native:
                        ret = acc / native
                        if best_ret is None or ret > best_ret[0]:
                            best_ret = (ret, name + at)
                    kl, top1 = _mean(rows, "kl", FIDELITY), _mean(rows, "top1", FIDELITY)
                    if kl is not None and (best_fid is None or kl < best_fid[0]):
                        best_fid = (kl, top1, name + at)
                cell = []
                for name in (f"{m}+quote", "quote"):
                    acc = _mean(got[name], "correct", ANSWER)
                    share = None if acc is None or not native else acc / native
                    cell.append(f"{_fmt(share)}, {_fmt(_mean(got[name], 'kl', FIDELITY), '{:.3f}')}")
                if got[f"{m}+quote"]:
                    quote_cells.append(f"{b:g}: {cell[0]} (quote {cell[1]})")
            lines.append(
                f"| {sender} → {receiver} | {m} | {_fmt(a_only)} vs {_fmt(a_none)}; "
                f"{_fmt(k_only, '{:.3f}')} vs {_fmt(k_none, '{:.3f}')} | {'; '.join(kl_cells)} "
                f"| {'; '.join(look_cells)} "
                f"| {'-' if best_ret is None else f'{best_ret[0]:.2f} ({best_ret[1]})'} "
                f"| {'-' if best_fid is None else f'{best_fid[0]:.3f}, {_fmt(best_fid[1])} ({best_fid[2]})'} "
                f"| {'; '.join(quote_cells) or '-'} |"
            )
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    if argv[:1] == ["--targets"]:
        print(targets([json.loads(Path(name).read_text()) for name in argv[1:]]))
        return
    for name in argv:
        print(table(json.loads(Path(name).read_text())))
        print()


if __name__ == "__main__":
    main(sys.argv[1:])
