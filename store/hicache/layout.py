"""SGLang host page layouts, the canonical page, and the canonical KV value.

An MHA host pool (sglang 0.5.23, ``mem_cache/pool_host/mha.py``) holds K and V of one TP rank's
``H`` KV heads, after RoPE. Its flat data page (``get_data_page(index, flat=True)``, and what
``set_from_flat_data_page`` reshapes) is, by layout:

    layer_first        [2, L, P, H, D]      sliced from a [2, L, size, H, D] buffer
    page_first         [2, P, L, H, D]      sliced from a [2, size, L, H, D] buffer (the default)
    page_first_direct  [2, 1, L, P, H, D]   sliced from a [2, pages, L, P, H, D] buffer

(``2`` is K then V, ``L`` layers, ``P`` page size, ``D`` head dim.) The page store keeps one
layout-independent *canonical page* per (page key, TP rank): ``[2, L, P, H, D]``, so an engine
restarted with another layout still hits. ``kv_to_pages`` and ``pages_to_kv`` convert between
canonical pages of every rank and the canonical KV value (``heterofold.kv.KVCache``).

TP ranks split the KV heads as SGLang does: ``H / tp`` contiguous heads per rank; with more ranks
than KV heads each head is replicated on ``tp / H`` consecutive ranks.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal, get_args

import torch

from heterofold.kv import KVCache
from store.errors import BadRequest

Layout = Literal["layer_first", "page_first", "page_first_direct"]
LAYOUTS: tuple[str, ...] = get_args(Layout)


def rank_heads(num_kv_heads: int, tp_size: int, tp_rank: int) -> tuple[int, int]:
    """The KV heads ``[start, stop)`` TP rank ``tp_rank`` holds."""
    if not 0 <= tp_rank < tp_size:
        raise BadRequest(f"TP rank {tp_rank} outside [0, {tp_size})")
    if tp_size <= num_kv_heads:
        if num_kv_heads % tp_size:
            raise BadRequest(f"{num_kv_heads} KV heads do not split over {tp_size} ranks")
        per = num_kv_heads // tp_size
        return tp_rank * per, (tp_rank + 1) * per
    if tp_size % num_kv_heads:
        raise BadRequest(f"{tp_size} ranks do not replicate {num_kv_heads} KV heads evenly")
    head = tp_rank * num_kv_heads // tp_size
    return head, head + 1


@dataclass(frozen=True)
class PageGeometry:
    """One TP rank's host page: what a flat data page holds and in which order."""

    layout: str
    layers: int
    heads: int  # KV heads on this rank
    head_dim: int
    page_size: int
    dtype: str  # torch dtype name without the "torch." prefix
    tp_rank: int = 0
    tp_size: int = 1

    def __post_init__(self) -> None:
        if self.layout not in LAYOUTS:
            raise BadRequest(f"host layout {self.layout!r} is not supported; one of {LAYOUTS}")
        if min(self.layers, self.heads, self.head_dim, self.page_size) < 1:
            raise BadRequest(f"page geometry must be positive: {self}")
        if not isinstance(getattr(torch, self.dtype, None), torch.dtype):
            raise BadRequest(f"unknown dtype {self.dtype!r}")

    @classmethod
    def of_host_pool(cls, pool: Any, *, tp_rank: int = 0, tp_size: int = 1) -> PageGeometry:
        """From an SGLang ``MHATokenToKVPoolHost`` (read by attribute). An MLA pool, or one whose
        K and V widths differ, is refused."""
        v_dim = getattr(pool, "v_head_dim", pool.head_dim)
        if not hasattr(pool, "head_num") or v_dim != pool.head_dim:
            raise BadRequest(f"{type(pool).__name__} is not an MHA host pool with equal K and V widths")
        return cls(
            layout=str(pool.layout),
            layers=int(pool.layer_num),
            heads=int(pool.head_num),
            head_dim=int(pool.head_dim),
            page_size=int(pool.page_size),
            dtype=str(pool.dtype).removeprefix("torch."),
            tp_rank=tp_rank,
            tp_size=tp_size,
        )

    @property
    def torch_dtype(self) -> torch.dtype:
        dtype: torch.dtype = getattr(torch, self.dtype)
        return dtype

    @property
    def canonical_shape(self) -> tuple[int, int, int, int, int]:
        return (2, self.layers, self.page_size, self.heads, self.head_dim)

    @property
    def numel(self) -> int:
        return 2 * self.layers * self.page_size * self.heads * self.head_dim

    def to_canonical(self, flat: torch.Tensor) -> torch.Tensor:
        """A flat data page of this layout -> a canonical page [2, L, P, H, D] (a new tensor)."""
        if flat.numel() != self.numel:
            raise BadRequest(f"a page of {flat.numel()} elements, expected {self.numel}")
        L, P, H, D = self.layers, self.page_size, self.heads, self.head_dim
        if self.layout == "page_first":
            page = flat.reshape(2, P, L, H, D).permute(0, 2, 1, 3, 4)  # -> (2, L, P, H, D)
        else:  # layer_first and page_first_direct share the order; the latter has a page axis of 1
            page = flat.reshape(2, L, P, H, D)
        return page.to("cpu").contiguous().clone()

    def from_canonical(self, page: torch.Tensor) -> torch.Tensor:
        """A canonical page -> a flat data page of this layout, in this pool's dtype."""
        if tuple(page.shape) != self.canonical_shape:
            raise BadRequest(f"canonical page {tuple(page.shape)}, expected {self.canonical_shape}")
        page = page.to(self.torch_dtype)
        if self.layout == "page_first":
            page = page.permute(0, 2, 1, 3, 4)  # (2, L, P, H, D) -> (2, P, L, H, D)
        return page.contiguous().reshape(-1)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> PageGeometry:
        return cls(**json.loads(text))


def kv_to_pages(kv: KVCache, page_size: int, tp_size: int, dtype: torch.dtype) -> list[list[torch.Tensor]]:
    """The canonical pages of every full page of ``kv``: ``pages[i][rank]`` is [2, L, P, H_rank, D].

    Only full-attention values convert: SGLang's MHA pool keeps every token of every layer."""
    if not kv.is_dense:
        raise BadRequest("a value with sliding-window layers has no MHA host pages")
    n_pages = kv.num_tokens // page_size
    K = torch.stack(kv.keys)  # (L, H, T, D)
    V = torch.stack(kv.values)  # (L, H, T, D)
    kvs = torch.stack((K, V)).to(dtype)  # (2, L, H, T, D)
    H = kvs.shape[2]
    spans = [rank_heads(H, tp_size, r) for r in range(tp_size)]
    pages = []
    for i in range(n_pages):
        page = kvs[:, :, :, i * page_size : (i + 1) * page_size].permute(0, 1, 3, 2, 4)  # (2, L, P, H, D)
        pages.append([page[:, :, :, a:b].contiguous() for a, b in spans])
    return pages


def pages_to_kv(
    pages: Sequence[Sequence[torch.Tensor]], token_ids: Sequence[int], *, fingerprint: str, num_kv_heads: int
) -> KVCache:
    """Inverse of ``kv_to_pages``: the value for ``token_ids`` (``len(pages) * P`` of them) from
    ``pages[i][rank]``. A head replicated on several ranks is taken from the first of them."""
    if not pages:
        raise BadRequest("no pages")
    tp_size = len(pages[0])
    P = pages[0][0].shape[2]
    if len(token_ids) != len(pages) * P:
        raise BadRequest(f"{len(token_ids)} token ids for {len(pages)} pages of {P}")
    # each rank once, or for replicated heads the first rank holding each head
    owners = (
        list(range(tp_size)) if tp_size <= num_kv_heads else [h * tp_size // num_kv_heads for h in range(num_kv_heads)]
    )
    merged = [torch.cat([page[r] for r in owners], dim=3) for page in pages]  # each (2, L, P, H, D)
    full = torch.cat(merged, dim=2)  # (2, L, T, H, D)
    if full.shape[3] != num_kv_heads:
        raise BadRequest(f"pages hold {full.shape[3]} KV heads, expected {num_kv_heads}")
    per_layer = full.permute(0, 1, 3, 2, 4)  # (2, L, H, T, D)
    T, L = len(token_ids), full.shape[1]
    return KVCache(
        fingerprint=fingerprint,
        token_ids=torch.tensor(list(token_ids), dtype=torch.int64),
        positions=torch.arange(T),
        keys=tuple(per_layer[0, layer].contiguous() for layer in range(L)),
        values=tuple(per_layer[1, layer].contiguous() for layer in range(L)),
        windows=(0,) * L,
    )
