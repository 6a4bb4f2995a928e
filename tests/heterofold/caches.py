"""A small random ``KVCache`` for tests of the KV value and of what reads it."""

from __future__ import annotations

import torch

from heterofold.kv import KVCache


def make_kv(T: int = 10, windows: tuple[int, ...] = (0, 4, 0), H: int = 2, D: int = 3) -> KVCache:
    g = torch.Generator().manual_seed(0)
    keys, values = [], []
    for w in windows:
        t = T if w == 0 else min(T, w - 1)
        keys.append(torch.randn(H, t, D, generator=g))
        values.append(torch.randn(H, t, D, generator=g))
    return KVCache(
        fingerprint="f" * 64,
        token_ids=torch.arange(100, 100 + T),
        positions=torch.arange(T),
        keys=tuple(keys),
        values=tuple(values),
        windows=windows,
    )
