"""Selective native recompute (in the spirit of CacheBlend) on a transformers model.

Given a dense KV value for T context tokens (mapped from another model) and a set S of positions,
one forward pass runs the tokens at S at their true positions. Query i (position S_i) sees:
- the given KV at every position j <= S_i that is not in S (the mapped tokens before it);
- the recomputed KV of S_k for k <= i, computed in the same pass.
A sliding layer additionally limits both to S_i - j < window. The recomputed KV then replaces the
given KV at S. With S = all positions this is exactly a native prefill.

Cost. A full-attention layer attends each recomputed token over all T + n keys. A sliding layer
needs far fewer: the recomputed tokens are cut into blocks of consecutive ones spanning less than
a window, and each block attends only over the keys its mask allows (at most about two windows plus
its own tokens) through the same SDPA kernel, instead of over all T + n keys with most masked out.
Masked keys add exactly zero either way, so the result is the same.

``recompute_sync`` takes the model, its spec, device and dtype, not an engine; the embedded engine
(``engines.local``) runs it on its worker thread.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from transformers import AttentionInterface
from transformers.cache_utils import DynamicCache, DynamicLayer

from engines.attention import STOCK, sdpa
from engines.errors import KVMismatch
from heterofold.kv import KVCache
from heterofold.spec import ModelSpec

BLOCKED = "heterofold_blocked_sdpa"
Blocks = list[tuple[slice, torch.Tensor]]  # (query rows, key columns they may see)
_blocks: contextvars.ContextVar[Blocks | None] = contextvars.ContextVar("heterofold_blocks", default=None)


def _blocked_sdpa(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """SDPA, except on a sliding layer during a recompute: block by block over the allowed keys."""
    blocks = _blocks.get()
    if blocks is None or not kwargs.get("sliding_window") or attention_mask is None:
        return sdpa(module, query, key, value, attention_mask, **kwargs)
    outs = []
    for rows, cols in blocks:
        out, _ = sdpa(
            module,
            query[:, :, rows],
            key[:, :, cols],
            value[:, :, cols],
            attention_mask[:, :, rows][..., cols],
            **kwargs,
        )
        outs.append(out)  # (B, n_block, heads, D)
    return torch.cat(outs, dim=1), None


AttentionInterface.register(BLOCKED, _blocked_sdpa)


def sliding_blocks(ok: torch.Tensor, chosen: torch.Tensor, window: int) -> Blocks:
    """Blocks of consecutive recomputed tokens spanning less than ``window`` positions, each with
    the key columns (of the T + n in the pass) that its sliding mask ``ok`` (``recompute_allowed``)
    allows."""
    n = chosen.shape[0]
    blocks: Blocks = []
    start = 0
    for i in range(1, n + 1):
        if i == n or chosen[i] - chosen[start] >= window:
            blocks.append((slice(start, i), ok[start:i].any(0).nonzero().squeeze(1)))
            start = i
    return blocks


@contextmanager
def _blocked(model: Any, blocks: Blocks) -> Iterator[None]:
    """Route the model's attention through ``_blocked_sdpa`` with ``blocks`` for this pass. Its
    caller runs one pass on ``model`` at a time (``recompute_sync``), so switching the config is safe."""
    config = model.config
    before = config._attn_implementation
    if not blocks or before not in STOCK:  # no sliding layer, or another kernel: the masks alone do it
        yield
        return
    token = _blocks.set(blocks)
    config._attn_implementation = BLOCKED
    try:
        yield
    finally:
        config._attn_implementation = before
        _blocks.reset(token)


def recompute_allowed(T: int, chosen: torch.Tensor, window: int) -> torch.Tensor:
    """Bool ``(n, T + n)``: True where recomputed token ``i`` may attend (module docstring)."""
    n = chosen.shape[0]
    j = torch.arange(T)
    is_chosen = torch.zeros(T, dtype=torch.bool)
    is_chosen[chosen] = True
    past_ok = (j[None, :] <= chosen[:, None]) & ~is_chosen[None, :]  # (n, T)
    new_ok = torch.ones(n, n, dtype=torch.bool).tril()  # (n, n)
    if window:
        past_ok &= chosen[:, None] - j[None, :] < window
        new_ok &= chosen[:, None] - chosen[None, :] < window
    return torch.cat([past_ok, new_ok], dim=1)  # (n, T + n)


def additive_mask(ok: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Additive mask ``(1, 1, n, T + n)`` from ``recompute_allowed``: 0 where query ``i`` may
    attend, -inf-like elsewhere."""
    mask = torch.zeros(ok.shape, dtype=dtype).masked_fill_(~ok, torch.finfo(dtype).min)
    return mask[None, None]


@torch.inference_mode()
def recompute_sync(
    model: Any,
    spec: ModelSpec,
    dense: KVCache,
    positions: Sequence[int],
    *,
    device: torch.device,
    dtype: torch.dtype,
) -> KVCache:
    """``dense`` with the tokens at ``positions`` recomputed natively by ``model`` (module docstring),
    windowed as ``spec``. Runs one forward pass in ``dtype`` on ``device``; no other pass may run on
    ``model`` meanwhile (its attention implementation is switched for the pass). Raises KVMismatch
    for a value of another model, not dense, or positions outside it."""
    if dense.fingerprint != spec.fingerprint or not dense.is_dense or dense.num_layers != spec.num_layers:
        raise KVMismatch("recompute needs a dense KV value in this model's fingerprint and layer count")
    T = dense.num_tokens
    chosen = torch.tensor(sorted(set(positions)), dtype=torch.int64)
    if chosen.numel() and (chosen[0] < 0 or chosen[-1] >= T):
        raise KVMismatch(f"recompute positions must lie within 0..{T - 1}")
    if chosen.numel() == 0:
        return dense.windowed(spec.windows)
    cache: Any = DynamicCache(config=model.config)
    cache.layers = [DynamicLayer() for _ in range(spec.num_layers)]  # no window trimming in this pass
    for layer, k, v in zip(cache.layers, dense.keys, dense.values, strict=True):
        k1, v1 = k.to(device, dtype)[None], v.to(device, dtype)[None]  # (H, T, D) -> (1, H, T, D)
        layer.lazy_initialization(k1, v1)
        layer.keys, layer.values = k1, v1
    windows = {w for w in spec.windows if w}
    full = additive_mask(recompute_allowed(T, chosen, 0), dtype).to(device)
    blocks: Blocks = []
    if windows:
        (window,) = windows
        ok = recompute_allowed(T, chosen, window)
        mask: Any = {"full_attention": full, "sliding_attention": additive_mask(ok, dtype).to(device)}
        blocks = [(rows, cols.to(device)) for rows, cols in sliding_blocks(ok, chosen, window)]
    else:
        mask = full
    ids = dense.token_ids[chosen].to(device)[None]  # (1, n)
    with _blocked(model, blocks):
        model(input_ids=ids, position_ids=chosen.to(device)[None], attention_mask=mask, cache=cache,
              use_cache=True, logits_to_keep=1)  # fmt: skip
    # The pass appended the n recomputed rows after the T given ones in a buffer of its own: move
    # them to their positions inside that buffer and keep its first T rows (no copy of the cache).
    keys, values = [], []
    for layer, k in zip(cache.layers, dense.keys, strict=True):
        k2, v2 = layer.keys[0], layer.values[0]  # (H, T + n, D)
        k2[:, chosen] = k2[:, T:].clone()
        v2[:, chosen] = v2[:, T:].clone()
        keys.append(k2[:, :T].to(k.device, k.dtype))
        values.append(v2[:, :T].to(k.device, k.dtype))
    merged = KVCache(dense.fingerprint, dense.token_ids, dense.positions, tuple(keys), tuple(values), dense.windows)
    return merged.windowed(spec.windows)
