"""Host page layouts and TP splits: the canonical KV value through SGLang's host pool layouts and
back, and each layout's placement checked against the layout's definition."""

from __future__ import annotations

import pytest
import torch

from heterofold.kv import KVCache
from store.errors import BadRequest
from store.hicache.layout import LAYOUTS, PageGeometry, kv_to_pages, pages_to_kv, rank_heads
from tests.sglang.host_pool import HostPoolStandIn

L, H, D, P = 3, 4, 8, 4
FP = "c" * 64


def make_kv(T: int, heads: int = H, seed: int = 0) -> KVCache:
    g = torch.Generator().manual_seed(seed)
    keys = tuple(torch.randn(heads, T, D, generator=g) for _ in range(L))
    values = tuple(torch.randn(heads, T, D, generator=g) for _ in range(L))
    return KVCache(FP, torch.arange(100, 100 + T), torch.arange(T), keys, values, (0,) * L)


def assert_same(a: KVCache, b: KVCache) -> None:
    assert a.fingerprint == b.fingerprint and torch.equal(a.token_ids, b.token_ids)
    for x, y in zip(a.keys + a.values, b.keys + b.values, strict=True):
        assert torch.equal(x, y)


@pytest.mark.parametrize(("tp", "heads"), [(1, 4), (2, 4), (4, 4), (2, 1), (4, 2)])
def test_rank_heads_split_like_sglang(tp: int, heads: int) -> None:
    spans = [rank_heads(heads, tp, r) for r in range(tp)]
    if tp <= heads:  # contiguous, disjoint, covering
        assert [h for a, b in spans for h in range(a, b)] == list(range(heads))
    else:  # each head on tp / heads consecutive ranks
        assert [a for a, _ in spans] == [r // (tp // heads) for r in range(tp)]


def test_rank_heads_refuses_uneven_splits() -> None:
    with pytest.raises(BadRequest):
        rank_heads(3, 2, 0)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize(("tp", "heads"), [(1, 4), (2, 4), (4, 4), (4, 2)])
def test_kv_round_trips_through_host_pages(layout: str, tp: int, heads: int) -> None:
    """KV value -> canonical pages per rank -> each rank's host pool (flat pages set as SGLang does)
    -> flat pages read back -> canonical pages -> KV value, bit for bit."""
    kv = make_kv(3 * P + 2, heads)  # two tokens past the last full page are not paged
    pages = kv_to_pages(kv, P, tp, torch.float32)
    assert len(pages) == 3 and len(pages[0]) == tp
    per_rank = rank_heads(heads, tp, 0)[1] - rank_heads(heads, tp, 0)[0]
    pools = [HostPoolStandIn(layout, L, per_rank, D, P, pages=5) for _ in range(tp)]
    geometry = [PageGeometry.of_host_pool(pool, tp_rank=r, tp_size=tp) for r, pool in enumerate(pools)]
    slots = [4, 0, 2]  # host page slots, not in token order
    for i, page in enumerate(pages):
        for r in range(tp):
            pools[r].set_from_flat_data_page(slots[i] * P, geometry[r].from_canonical(page[r]))
    back = [[geometry[r].to_canonical(pools[r].get_data_page(slots[i] * P)) for r in range(tp)] for i in range(3)]
    assert_same(
        pages_to_kv(back, kv.token_ids.tolist()[: 3 * P], fingerprint=FP, num_kv_heads=heads), kv.truncate(3 * P)
    )


@pytest.mark.parametrize("layout", LAYOUTS)
def test_each_layout_puts_a_token_where_its_definition_says(layout: str) -> None:
    kv = make_kv(2 * P)
    pool = HostPoolStandIn(layout, L, H, D, P, pages=3)
    geometry = PageGeometry.of_host_pool(pool)
    for i, page in enumerate(kv_to_pages(kv, P, 1, torch.float32)):
        pool.set_from_flat_data_page((i + 1) * P, geometry.from_canonical(page[0]))
    for t in range(2 * P):
        expected = torch.stack([torch.stack([kv.keys[layer][:, t] for layer in range(L)]),
                                torch.stack([kv.values[layer][:, t] for layer in range(L)])])  # fmt: skip
        assert torch.equal(pool.token_kv(P + t), expected)  # [2, L, H, D]


def test_pages_keep_the_host_dtype() -> None:
    geometry = PageGeometry("page_first", L, H, D, P, "bfloat16")
    page = kv_to_pages(make_kv(P), P, 1, torch.bfloat16)[0][0]
    flat = geometry.from_canonical(page)
    assert flat.dtype == torch.bfloat16 and torch.equal(geometry.to_canonical(flat), page)


def test_sliding_window_values_have_no_mha_pages() -> None:
    kv = make_kv(2 * P)
    sliding = KVCache(FP, kv.token_ids, kv.positions, kv.keys, kv.values, (0, 0, 3 * P))
    with pytest.raises(BadRequest):
        kv_to_pages(sliding, P, 1, torch.float32)


def test_geometry_refuses_unknown_layouts_and_wrong_sizes() -> None:
    with pytest.raises(BadRequest):
        PageGeometry("page_head", L, H, D, P, "float32")
    with pytest.raises(BadRequest):
        PageGeometry("page_first", L, H, D, P, "float32").to_canonical(torch.zeros(7))
