"""Probe: which part of the mapped cache keeps the receiver from answering? Native K or V, by layer band.

    python -m bench.native_layers SENDER RECEIVER ADAPTER [--every N] [--kinds K,..] [--json OUT]

An oracle, not a product path: for each builtin item at 1024 tokens the receiver's map-only cache
(the adapter's map, no recompute but the unaligned tokens and the tail window, as served at budget
0) has some of its layers' keys and/or values replaced by the receiver's own native ones for the
same tokens. Each row answers one question: "if the map were exact here, would the receiver answer
and behave like native?" Rows:

- ``map-only``: nothing replaced; ``native``: the reference (and ``kv:all`` checks the splice:
  it must equal native up to float noise);
- ``k:all`` / ``v:all``: native keys (values) in every layer, mapped values (keys): which of the
  two the map gets wrong enough to lose the context;
- ``kv:early`` / ``kv:middle`` / ``kv:late``: native K and V in one third of the layers by depth;
- ``kv:global`` / ``k:global`` / ``v:global``: only the full-attention layers, on receivers that
  mix them with sliding-window layers (gemma3: 3 of 18), and ``kv:L<i>``: each of them alone;
- ``kv:global errE`` (``--errors``): K and V there are native plus the share E of the map's error
  (E = 0.5 halves it): how close the map must come for the receiver to answer;
- ``k:norm`` / ``v:norm`` / ``kv:norm`` (``--norms``): every mapped row keeps the map's direction
  and takes the native row's length (per token, head and layer); ``k:dir``: the native direction
  at the map's length; ``k:unit`` / ``kv:unit``: the map's direction at the mean native length of
  its layer and head (one number per head: what a map could carry without an oracle, if that mean
  were read off the fit data); ``k:scale``: the map's rows times the head's mean native length over
  its mean mapped length (a per-head temperature). Does the map lose the context in the lengths of
  its rows (ridge shrinks predictions toward the mean) or in their directions?
- ``head:N`` (``--heads``): native K and V in every layer for the first N mapped context tokens
  (and every unaligned token before them). Their causal attention sees only recomputed tokens, so
  this is exactly what recomputing the first N context tokens natively would give: does the block
  need its first tokens (attention sinks after the template) exact, as it gets its last ones?

Accuracy on the answer items, whole-context KL and top-1 agreement against native (the harness's
scoring), per kind, on the same items and the same map-only cache for every row.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from bench.mapped_bias import report, summary_by_kind
from bench.pair import load_pair, pair_parser
from engines.local import LocalEngine
from engines.selectors import make_selector
from engines.transfer import transfer
from gateway.settings import RoleSettings, TransferPolicy
from harness.evaluate import ItemRun, PathStats
from heterofold.adapter import Adapter
from heterofold.kv import KVCache
from heterofold.suite import builtin_suite


def layer_sets(windows: tuple[int, ...]) -> dict[str, set[int]]:
    """Layer index sets by name: all, the three depth thirds, and the full-attention layers when
    the model also has sliding-window ones."""
    n = len(windows)
    third = [set(range(i * n // 3, (i + 1) * n // 3)) for i in range(3)]
    sets = {"all": set(range(n)), "early": third[0], "middle": third[1], "late": third[2]}
    full = {i for i, w in enumerate(windows) if w == 0}
    if 0 < len(full) < n:
        sets["global"] = full
    return sets


def _check_same_tokens(mapped: KVCache, native: KVCache) -> None:
    if mapped.num_tokens != native.num_tokens or not bool((mapped.positions == native.positions).all()):
        raise ValueError("the native and mapped caches hold different tokens or positions")


def splice(mapped: KVCache, native: KVCache, layers: set[int], keys: bool, values: bool, error: float = 0.0) -> KVCache:
    """``mapped`` with ``native``'s keys and/or values in ``layers`` (same tokens and positions);
    ``error`` > 0 keeps that share of the map's error there instead (native + error * (mapped - native))."""
    _check_same_tokens(mapped, native)

    def mix(m: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
        n = n.to(m.dtype)
        return n + error * (m - n) if error else n

    k = tuple(mix(m, native.keys[i]) if keys and i in layers else m for i, m in enumerate(mapped.keys))
    v = tuple(mix(m, native.values[i]) if values and i in layers else m for i, m in enumerate(mapped.values))
    return replace(mapped, keys=k, values=v)


def splice_head(mapped: KVCache, native: KVCache, upto: int) -> KVCache:
    """``mapped`` with ``native``'s keys and values, in every layer, at the positions before ``upto``
    (a sliding layer holds the last tokens only: those of its rows that fall before ``upto``)."""
    _check_same_tokens(mapped, native)

    def head(m: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
        rows = max(0, upto - (mapped.num_tokens - m.shape[1]))  # the layer holds the last m.shape[1] tokens
        if rows == 0:
            return m
        return torch.cat([n[:, :rows].to(m.dtype), m[:, rows:]], dim=1)

    return replace(
        mapped,
        keys=tuple(head(m, n) for m, n in zip(mapped.keys, native.keys, strict=True)),
        values=tuple(head(m, n) for m, n in zip(mapped.values, native.values, strict=True)),
    )


NORM_ROWS = ("k:norm", "v:norm", "kv:norm", "k:dir", "k:unit", "kv:unit", "k:scale")


def renorm(mapped: KVCache, native: KVCache, row: str) -> KVCache:
    """``mapped`` with its keys and/or values re-lengthened as the ``--norms`` row ``row`` says
    (module docstring); rows the map did not produce (recomputed, tail) are native already."""
    _check_same_tokens(mapped, native)
    part, mode = row.split(":")

    def fix(m: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
        n = n.to(m.dtype)
        lm, ln = m.norm(dim=-1, keepdim=True), n.norm(dim=-1, keepdim=True)  # (H, T, 1)
        if mode == "norm":
            return m / lm.clamp_min(1e-6) * ln
        if mode == "dir":
            return n / ln.clamp_min(1e-6) * lm
        if mode == "unit":
            return m / lm.clamp_min(1e-6) * ln.mean(dim=1, keepdim=True)
        return m * ln.mean(dim=1, keepdim=True) / lm.mean(dim=1, keepdim=True).clamp_min(1e-6)  # scale

    k = tuple(fix(m, n) if part in ("k", "kv") else m for m, n in zip(mapped.keys, native.keys, strict=True))
    v = tuple(fix(m, n) if part in ("v", "kv") else m for m, n in zip(mapped.values, native.values, strict=True))
    return replace(mapped, keys=k, values=v)


def norm_stats(mapped: KVCache, native: KVCache) -> dict[str, list[float]]:
    """Per layer, over the rows the map produced: mean length ratio mapped / native and mean cosine,
    for keys and values."""
    out: dict[str, list[float]] = {"k_ratio": [], "k_cos": [], "v_ratio": [], "v_cos": []}
    for part, ms, ns in (("k", mapped.keys, native.keys), ("v", mapped.values, native.values)):
        for m, n in zip(ms, ns, strict=True):
            m, n = m.float(), n.float()
            rows = (m - n).abs().amax(dim=-1) > 1e-6  # (H, T): the map's rows
            if not bool(rows.any()):
                out[f"{part}_ratio"].append(1.0)
                out[f"{part}_cos"].append(1.0)
                continue
            ratio = m.norm(dim=-1) / n.norm(dim=-1).clamp_min(1e-6)
            cos = torch.nn.functional.cosine_similarity(m, n, dim=-1)
            out[f"{part}_ratio"].append(round(float(ratio[rows].mean()), 3))
            out[f"{part}_cos"].append(round(float(cos[rows].mean()), 3))
    return out


def head_end(src: torch.Tensor, n: int) -> int:
    """The position after the first ``n`` mapped tokens (``src`` >= 0: a sender token maps there)."""
    mapped = (src >= 0).nonzero().squeeze(1)
    return int(mapped[n - 1]) + 1 if len(mapped) >= n else len(src)


def variants(
    windows: tuple[int, ...], errors: Sequence[float] = (), error_layers: str | None = None
) -> list[tuple[str, set[int], bool, bool, float]]:
    """(row name, layers, native keys, native values, share of the map's error kept)."""
    sets = layer_sets(windows)
    rows: list[tuple[Any, ...]] = [
        ("kv:all", sets["all"], True, True),
        ("k:all", sets["all"], True, False),
        ("v:all", sets["all"], False, True),
    ]
    rows += [(f"kv:{band}", sets[band], True, True) for band in ("early", "middle", "late")]
    if "global" in sets:
        rows += [(f"{part}:global", sets["global"], part != "v", part != "k") for part in ("kv", "k", "v")]
        rows += [(f"kv:L{i}", {i}, True, True) for i in sorted(sets["global"])]
    where = error_layers or ("global" if "global" in sets else "all")
    rows += [(f"kv:{where} err{e:g}", sets[where], True, True, e) for e in errors]
    return [(*row, 0.0) if len(row) == 4 else row for row in rows]


async def probe(
    sender: LocalEngine,
    receiver: LocalEngine,
    adapter: Adapter,
    every: int,
    kinds: tuple[str, ...] | None,
    errors: Sequence[float] = (),
    only: set[str] | None = None,
    error_layers: str | None = None,
    heads: Sequence[int] = (),
    norms: bool = False,
) -> dict[str, Any]:
    tail = RoleSettings(engine="-").tail_window
    chooser = make_selector(TransferPolicy().selector)
    items = builtin_suite(lengths=(1024,), per_cell=1, kinds=kinds)[::every]
    stats: dict[str, PathStats] = {}
    sets: dict[str, set[int]] = {}
    lengths: list[dict[str, list[float]]] = []
    for n, item in enumerate(items):
        run = ItemRun(sender, receiver, item, 24 if item.metric == "answer" else 64, tail)
        await run.native(stats)
        await run.prepare_transfer(chooser, adapter, None)
        tr = await transfer(adapter, run.hop, receiver, tail=tail)
        native, _ = await receiver.prefill(run.r_ids[: tr.kv.num_tokens])
        sets = layer_sets(native.windows)
        await run.run_path(stats, "map-only", run.r_ids, tr.kv, tr.total_ms)
        for name, layers, k, v, e in variants(native.windows, errors, error_layers):
            if only is not None and name not in only:
                continue
            await run.run_path(stats, name, run.r_ids, splice(tr.kv, native, layers, k, v, e), tr.total_ms)
        if norms:
            lengths.append(norm_stats(tr.kv, native))
            for row in NORM_ROWS:
                if only is None or row in only:
                    await run.run_path(stats, row, run.r_ids, renorm(tr.kv, native, row), tr.total_ms)
        src = run.hop.source(tr.prefix)
        for h in heads:
            upto = head_end(src, h)
            await run.run_path(stats, f"head:{h}", run.r_ids, splice_head(tr.kv, native, upto), tr.total_ms)
        print(f"items {n + 1}/{len(items)} ({item.kind})", flush=True)
    result: dict[str, Any] = {
        "items": len(items), "tail": tail, "layers": {name: sorted(s) for name, s in sets.items()},
        "paths": {path: summary_by_kind(st) for path, st in stats.items()},
    }  # fmt: skip
    if lengths:  # per layer, averaged over items
        result["lengths"] = {
            key: [round(sum(d[key][i] for d in lengths) / len(lengths), 3) for i in range(len(lengths[0][key]))]
            for key in lengths[0]
        }
    return result


def main() -> None:
    ap = pair_parser(__doc__, "the adapter folder whose map is probed")
    ap.add_argument("--every", type=int, default=1, help="every n-th builtin item")
    ap.add_argument("--kinds", default=None, help="comma-separated builtin kinds (default: all)")
    ap.add_argument(
        "--errors", default="", help="shares of the map's error to keep in the global (else all) layers, e.g. 0.5,0.25"
    )
    ap.add_argument(
        "--rows", default=None, help="comma-separated rows to run besides native and map-only (default: all)"
    )
    ap.add_argument(
        "--error-layers",
        choices=["all", "early", "middle", "late", "global"],
        default=None,
        help="where --errors applies (default: full-attention layers if the receiver also has sliding ones, else all)",
    )
    ap.add_argument("--heads", default="", help="rows with the first N mapped context tokens native, e.g. 4,16,64")
    ap.add_argument("--norms", action="store_true", help="rows that re-lengthen the mapped rows (k:norm, ...)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    s, r, adapter = load_pair(args)
    kinds = tuple(args.kinds.split(",")) if args.kinds else None
    errors = [float(e) for e in args.errors.split(",") if e]
    only = set(args.rows.split(",")) if args.rows else None
    heads = [int(h) for h in args.heads.split(",") if h]
    result = asyncio.run(probe(s, r, adapter, args.every, kinds, errors, only, args.error_layers, heads, args.norms))
    print(f"{args.sender} -> {args.receiver}, {result['items']} items, map {args.adapter}")
    for key, vals in result.get("lengths", {}).items():
        print(f"{key:8s} by layer: " + " ".join(f"{v:.2f}" for v in vals))
    report(result, args.json, width=18)


if __name__ == "__main__":
    main()
