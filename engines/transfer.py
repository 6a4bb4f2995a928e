"""One cross-family hop on the receiver's side: align, map, selective recompute, ready to continue.

    sender KV (canonical) ──align tokens──▶ src (T_r,) ──adapter.apply──▶ dense mapped receiver KV
        ──engine.recompute(positions)──▶ receiver KV in its own layout ──engine.stream(past=...)

Positions recomputed natively: every receiver token without a sender token (BOS, template
markers), the tail window W, and the selector's choice under the budget (``heterofold.select``).
Also ``collect_pairs``: running both models on fit texts to give ``FitPair``s.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from engines.base import Engine
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
    align_ms: float
    map_ms: float
    recompute_ms: float

    @property
    def total_ms(self) -> float:
        return self.align_ms + self.map_ms + self.recompute_ms


def transferable_prefix(receiver_offsets: Sequence[tuple[int, int]], sections: Sequence[Section]) -> int:
    """Receiver tokens before the first token that ends after the last shared section."""
    if not sections:
        return 0
    end = sections[-1].receiver_start + sections[-1].length
    for j, (_, b) in enumerate(receiver_offsets):
        if b > end:
            return j
    return len(receiver_offsets)


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
    sender_kv: KVCache,
    sender_offsets: Sequence[tuple[int, int]],
    receiver: Engine,
    receiver_ids: Sequence[int],
    receiver_offsets: Sequence[tuple[int, int]],
    sections: Sequence[Section],
    *,
    choose: Callable[[torch.Tensor, int], Sequence[int]] = lambda src, prefix: (),
    tail: int = 0,
) -> TransferResult:
    """Build the receiver's KV for its prompt prefix from ``sender_kv``.

    ``choose(src, prefix)`` names extra positions to recompute (the selector); ``tail`` adds the
    last ``tail`` prefix tokens. Raises FingerprintMismatch for another model's adapter or KV.
    """
    adapter.check(sender_kv.fingerprint, receiver.spec.fingerprint)
    t0 = time.perf_counter()
    prefix = transferable_prefix(receiver_offsets, sections)
    src = align_tokens(sender_offsets, receiver_offsets[:prefix], sections)
    src[src >= sender_kv.num_tokens] = -1  # text the sender's KV does not cover
    unaligned = (src < 0).nonzero().squeeze(1).tolist()
    positions = set(unaligned) | set(range(max(prefix - tail, 0), prefix)) | set(choose(src, prefix))
    chosen = sorted(p for p in positions if 0 <= p < prefix)
    rows = sliding_rows(receiver.spec.windows, prefix, chosen)
    t1 = time.perf_counter()
    dense = adapter.apply(sender_kv, src, torch.tensor(list(receiver_ids[:prefix])), rows)
    t2 = time.perf_counter()
    kv = await receiver.recompute(dense, chosen)
    t3 = time.perf_counter()
    return TransferResult(
        kv=kv,
        prefix=prefix,
        mapped=prefix - len(unaligned),
        recomputed=len(positions),
        align_ms=(t1 - t0) * 1000,
        map_ms=(t2 - t1) * 1000,
        recompute_ms=(t3 - t2) * 1000,
    )


async def collect_pairs(
    sender: Engine,
    receiver: Engine,
    texts: Sequence[str],
    *,
    max_tokens: int = 1024,
    progress: Callable[[str, int, int], None] | None = None,
) -> list[FitPair]:
    """Dense KV of both models on each text (cut to ``max_tokens`` receiver tokens), aligned."""
    pairs = []
    for i, text in enumerate(texts):
        r_enc = receiver.encode(text)
        if len(r_enc.ids) > max_tokens:
            text = text[: r_enc.offsets[max_tokens - 1][1]]
            r_enc = receiver.encode(text)
        s_enc = sender.encode(text)
        src = align_tokens(s_enc.offsets, r_enc.offsets, [Section(0, 0, len(text))])
        s_kv, _ = await sender.prefill(s_enc.ids, dense=True)
        r_kv, _ = await receiver.prefill(r_enc.ids, dense=True)
        pairs.append(FitPair(s_kv, r_kv, src))
        if progress:
            progress("collect", i + 1, len(texts))
    return pairs
