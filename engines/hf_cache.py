"""Conversion between the canonical KVCache and a transformers ``DynamicCache``.

transformers keeps a sliding-window layer's true length in ``cumulative_length`` apart from the
tensors (which hold the last ``window - 1`` tokens); a rebuilt cache that leaves it at the tensor
length gives wrong positions and masks once a prompt passes the window. Both directions set it.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import DynamicCache

from engines.errors import KVMismatch
from heterofold.kv import KVCache
from heterofold.spec import ModelSpec


def dense_cache(model_config: Any) -> Any:
    """An empty cache whose sliding layers keep every token (they record their past), so one
    forward from scratch exports a dense value while attention still slides."""
    cache: Any = DynamicCache(config=model_config)
    for layer in cache.layers:
        if getattr(layer, "is_sliding", False):
            layer.activate_past_recording()
    return cache


def export_kv(cache: Any, token_ids: torch.Tensor, spec: ModelSpec, *, dense: bool = False) -> KVCache:
    """The canonical value of ``cache`` after it has seen exactly ``token_ids``."""
    (T,) = token_ids.shape
    if cache.get_seq_length() != T:
        raise KVMismatch(f"cache has seen {cache.get_seq_length()} tokens, not {T}")
    keys = tuple(layer.keys[0] for layer in cache.layers)  # (1, H, T_l, D) -> (H, T_l, D)
    values = tuple(layer.values[0] for layer in cache.layers)
    return KVCache(
        fingerprint=spec.fingerprint,
        token_ids=token_ids.to("cpu", torch.int64),
        positions=torch.arange(T, dtype=torch.int64),
        keys=keys,
        values=values,
        windows=(0,) * spec.num_layers if dense else spec.windows,
    )


def import_kv(kv: KVCache, model_config: Any, spec: ModelSpec, device: torch.device, dtype: torch.dtype) -> Any:
    """A DynamicCache holding ``kv``, ready for the model to continue at position ``kv.num_tokens``."""
    if kv.fingerprint != spec.fingerprint:
        raise KVMismatch(f"KV value from model {kv.fingerprint[:12]}, this engine runs {spec.fingerprint[:12]}")
    if kv.windows != spec.windows:
        raise KVMismatch(f"KV layer windows {kv.windows} differ from the model's {spec.windows}")
    if kv.num_tokens and (int(kv.positions[0]) < 0 or bool((kv.positions[1:] <= kv.positions[:-1]).any())):
        raise KVMismatch("KV positions must be non-negative and strictly increasing")
    cache: Any = DynamicCache(config=model_config)
    if len(cache.layers) != kv.num_layers:
        raise KVMismatch(f"KV has {kv.num_layers} layers, the model {len(cache.layers)}")
    for layer, k, v in zip(cache.layers, kv.keys, kv.values, strict=True):
        H, _, D = k.shape
        if (spec.num_kv_heads, spec.head_dim) != (H, D):
            raise KVMismatch(f"KV heads x dim {H}x{D}, the model has {spec.num_kv_heads}x{spec.head_dim}")
        k1 = k.to(device=device, dtype=dtype).unsqueeze(0)  # (H, T_l, D) -> (1, H, T_l, D)
        v1 = v.to(device=device, dtype=dtype).unsqueeze(0)
        layer.lazy_initialization(k1, v1)
        layer.keys, layer.values = k1, v1
        if getattr(layer, "is_sliding", False):
            layer.cumulative_length = kv.num_tokens
    return cache
