"""One cross-family hop on the receiver's side: align, map, selective recompute, ready to continue.

    sender KV (canonical) ──align tokens──▶ src (T_r,) ──adapter.apply──▶ dense mapped receiver KV
        ──engine.recompute(positions)──▶ receiver KV in its own layout ──engine.stream(past=...)

Positions recomputed natively: every receiver token without a sender token (BOS, template
markers), the tail window W, and the selector's choice under the budget (``engines.selectors``).
A selector that reads the mapped cache (receiver-attention) gets a first, map-only pass.
``transferable_prefix`` is re-exported from ``engines.selectors``.
Also ``collect_pairs``: running both models on fit texts to give ``FitPair``s.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import torch

from engines.base import Engine
from engines.selectors import (
    LEXICAL,
    Evidence,
    HopText,
    Selection,
    Selector,
    candidates,
    select,
)  # fmt: skip
from heterofold.adapter import Adapter
from heterofold.align import Section, align_tokens
from heterofold.fit import FitPair
from heterofold.kv import KVCache


@dataclass(frozen=True)
class TransferResult:
    kv: KVCache  # receiver value for receiver tokens [0, prefix), in the receiver's layout
    prefix: int  # receiver tokens covered
    mapped: int  # of which mapped from the sender
    recomputed: int  # of which recomputed natively
    chosen: tuple[int, ...]  # the selector's positions (a subset of the recomputed ones)
    select_ms: float
    align_ms: float
    map_ms: float
    recompute_ms: float

    @property
    def total_ms(self) -> float:
        return self.select_ms + self.align_ms + self.map_ms + self.recompute_ms


def sliding_rows(windows: Sequence[int], prefix: int, chosen: Sequence[int]) -> list[torch.Tensor | None]:
    """Per layer, the positions whose mapped KV will be read: all of them on a full-attention
    layer; on a sliding layer, the last ``window - 1`` (kept in the cache) and the ``window``
    positions up to each recomputed token (what its attention sees)."""
    rows: list[torch.Tensor | None] = []
    masks: dict[int, torch.Tensor] = {}
    for w in windows:
        if w == 0:
            rows.append(None)
            continue
        if w not in masks:
            need = torch.zeros(prefix + 1, dtype=torch.int64)  # difference array of covered ranges
            starts = torch.tensor([max(p - w + 1, 0) for p in chosen] + [max(prefix - w + 1, 0)], dtype=torch.int64)
            ends = torch.tensor([p + 1 for p in chosen] + [prefix], dtype=torch.int64)
            need.index_add_(0, starts, torch.ones_like(starts))
            need.index_add_(0, ends, -torch.ones_like(ends))
            masks[w] = need.cumsum(0)[:prefix] > 0
        rows.append(masks[w])
    return rows


async def transfer(
    adapter: Adapter,
    hop: HopText,
    receiver: Engine,
    *,
    selector: Selector = LEXICAL,
    budget: float = 0.0,
    tail: int = 0,
    sender: Engine | None = None,
    scout: Engine | None = None,
    selection: Selection | None = None,
) -> TransferResult:
    """Build the receiver's KV for its prompt prefix from the hop's sender KV: the one transfer
    path that the gateway, ``heterofold eval`` and the benches all run (module docstring).

    ``selector`` chooses ``budget`` of the candidate context tokens to recompute natively
    (``engines.selectors``; ``sender`` and ``scout`` are the engines it may read); ``selection``
    passes a choice made already instead. ``tail`` adds the last ``tail`` prefix tokens. Raises
    FingerprintMismatch for another model's adapter or KV, SelectorUnavailable when the selector
    needs an engine the hop lacks.
    """
    adapter.check(hop.sender_kv.fingerprint, receiver.spec.fingerprint)
    t0 = time.perf_counter()
    prefix = hop.transferable_prefix()
    src = hop.source(prefix)
    unaligned = (src < 0).nonzero().squeeze(1).tolist()
    ids = torch.tensor(list(hop.receiver_ids[:prefix]))
    t1 = time.perf_counter()
    map_ms = 0.0
    dense = None
    if selection is None:
        ev = Evidence(hop, candidates(hop, prefix), sender, receiver, None, scout)
        if selector.needs_map and budget > 0:
            dense = adapter.apply(hop.sender_kv, src, ids, None, embeddings=_embeddings(adapter, receiver))
            map_ms = (time.perf_counter() - t1) * 1000
            ev = replace(ev, mapped=await receiver.recompute(dense, unaligned))
        selection = await select(selector, ev, budget)
    positions = set(unaligned) | set(range(max(prefix - tail, 0), prefix)) | set(selection.positions)
    chosen = sorted(p for p in positions if 0 <= p < prefix)
    t2 = time.perf_counter()
    if dense is None:
        rows = sliding_rows(receiver.spec.windows, prefix, chosen)
        dense = adapter.apply(hop.sender_kv, src, ids, rows, embeddings=_embeddings(adapter, receiver))
    t3 = time.perf_counter()
    kv = await receiver.recompute(dense, chosen)
    t4 = time.perf_counter()
    return TransferResult(
        kv=kv,
        prefix=prefix,
        mapped=prefix - len(unaligned),
        recomputed=len(chosen),
        chosen=tuple(selection.positions),
        select_ms=selection.ms,
        align_ms=(t1 - t0) * 1000,
        map_ms=map_ms + (t3 - t2) * 1000,
        recompute_ms=(t4 - t3) * 1000,
    )


def _embeddings(adapter: Adapter, receiver: Engine) -> torch.Tensor | None:
    """The receiver's input embeddings where the adapter's map reads them (a token map), else None.
    An engine that cannot give them leaves it None: ``Adapter.apply`` then raises AdapterError."""
    return receiver.token_embeddings() if adapter.token is not None else None


async def collect_pairs(
    sender: Engine,
    receiver: Engine,
    texts: Sequence[str],
    *,
    max_tokens: int = 1024,
    queries: bool = False,
    progress: Callable[[str, int, int], None] | None = None,
) -> list[FitPair]:
    """Dense KV of both models on each text (cut to ``max_tokens`` receiver tokens), aligned; with
    ``queries``, also the receiver's own queries of each pass (``prefill_with_queries``: a fit
    running while the receiver serves chat requests records its own passes only)."""
    if queries and not hasattr(receiver, "prefill_with_queries"):
        raise TypeError(f"{receiver.spec.name}: capturing queries needs an embedded receiver engine")
    pairs = []
    for i, text in enumerate(texts):
        r_enc = receiver.encode(text)
        if len(r_enc.ids) > max_tokens:
            text = text[: r_enc.offsets[max_tokens - 1][1]]
            r_enc = receiver.encode(text)
        s_enc = sender.encode(text)
        src = align_tokens(s_enc.offsets, r_enc.offsets, [Section(0, 0, len(text))])
        s_kv, _ = await sender.prefill(s_enc.ids, dense=True)
        if queries:
            r_kv, q = await receiver.prefill_with_queries(r_enc.ids)  # type: ignore[attr-defined]
            pairs.append(FitPair(s_kv, r_kv, src, q))
        else:
            r_kv, _ = await receiver.prefill(r_enc.ids, dense=True)
            pairs.append(FitPair(s_kv, r_kv, src))
        if progress:
            progress("collect", i + 1, len(texts))
    return pairs
