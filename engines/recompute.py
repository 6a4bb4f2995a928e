"""Selective native recompute (in the spirit of CacheBlend) for the embedded engine.

Given a dense KV value for T context tokens (mapped from another model) and a set S of positions,
one forward pass runs the tokens at S at their true positions. Query i (position S_i) sees:
- the given KV at every position j <= S_i that is not in S (the mapped tokens before it);
- the recomputed KV of S_k for k <= i, computed in the same pass.
A sliding layer additionally limits both to S_i - j < window. The recomputed KV then replaces the
given KV at S. With S = all positions this is exactly a native prefill.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer

from engines.errors import KVMismatch
from heterofold.kv import KVCache

if TYPE_CHECKING:
    from engines.local import LocalEngine


def recompute_masks(T: int, chosen: torch.Tensor, window: int, dtype: torch.dtype) -> torch.Tensor:
    """Additive mask ``(1, 1, n, T + n)``: 0 where query ``i`` may attend, -inf-like elsewhere."""
    n = chosen.shape[0]
    j = torch.arange(T)
    is_chosen = torch.zeros(T, dtype=torch.bool)
    is_chosen[chosen] = True
    past_ok = (j[None, :] <= chosen[:, None]) & ~is_chosen[None, :]  # (n, T)
    new_ok = torch.ones(n, n, dtype=torch.bool).tril()  # (n, n)
    if window:
        past_ok &= chosen[:, None] - j[None, :] < window
        new_ok &= chosen[:, None] - chosen[None, :] < window
    ok = torch.cat([past_ok, new_ok], dim=1)  # (n, T + n)
    mask = torch.zeros(ok.shape, dtype=dtype).masked_fill_(~ok, torch.finfo(dtype).min)
    return mask[None, None]


@torch.inference_mode()
def recompute_sync(engine: LocalEngine, dense: KVCache, positions: Sequence[int]) -> KVCache:
    spec = engine.spec
    if dense.fingerprint != spec.fingerprint or not dense.is_dense or dense.num_layers != spec.num_layers:
        raise KVMismatch("recompute needs a dense KV value in this model's fingerprint and layer count")
    T = dense.num_tokens
    chosen = torch.tensor(sorted(set(positions)), dtype=torch.int64)
    if chosen.numel() and (chosen[0] < 0 or chosen[-1] >= T):
        raise KVMismatch(f"recompute positions must lie within 0..{T - 1}")
    if chosen.numel() == 0:
        return dense.windowed(spec.windows)
    device, dtype = engine.device, engine.dtype
    cache: Any = DynamicCache(config=engine.model.config)
    cache.layers = [DynamicLayer() for _ in range(spec.num_layers)]  # no window trimming in this pass
    for layer, k, v in zip(cache.layers, dense.keys, dense.values, strict=True):
        k1, v1 = k.to(device, dtype)[None], v.to(device, dtype)[None]  # (H, T, D) -> (1, H, T, D)
        layer.lazy_initialization(k1, v1)
        layer.keys, layer.values = k1, v1
    windows = {w for w in spec.windows if w}
    full = recompute_masks(T, chosen, 0, dtype).to(device)
    if windows:
        (window,) = windows
        mask: Any = {"full_attention": full, "sliding_attention": recompute_masks(T, chosen, window, dtype).to(device)}
    else:
        mask = full
    ids = dense.token_ids[chosen].to(device)[None]  # (1, n)
    engine.model(input_ids=ids, position_ids=chosen.to(device)[None], attention_mask=mask, cache=cache, use_cache=True,
                 logits_to_keep=1)  # fmt: skip
    keys, values = [], []
    for layer, k, v in zip(cache.layers, dense.keys, dense.values, strict=True):
        k2, v2 = k.clone(), v.clone()  # (H, T, D)
        k2[:, chosen] = layer.keys[0, :, T:].to(k2.device, k2.dtype)
        v2[:, chosen] = layer.values[0, :, T:].to(v2.device, v2.dtype)
        keys.append(k2)
        values.append(v2)
    merged = KVCache(dense.fingerprint, dense.token_ids, dense.positions, tuple(keys), tuple(values), dense.windows)
    return merged.windowed(spec.windows)
