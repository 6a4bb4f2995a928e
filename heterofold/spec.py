"""ModelSpec: the frozen facts about a model that the KV value, the engines and the adapters rely on.

``ModelSpec.from_hf`` turns a transformers config (read by attribute, nothing imported) into one
record, so quirks such as Gemma3's two RoPE thetas and sliding layers are resolved in one place.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import torch

from heterofold.errors import HeteroFoldError

Attention = Literal["full", "sliding"]

# Config keys that change with the tool that wrote the file, not with the model.
_VOLATILE_CONFIG_KEYS = frozenset({"transformers_version", "_commit_hash", "_name_or_path"})


@dataclass(frozen=True)
class LayerSpec:
    index: int
    attention: Attention
    window: int  # sliding window in tokens, 0 for full attention
    rope_theta: float
    rope_type: str


@dataclass(frozen=True)
class SpecialTokens:
    bos: str | None  # the BOS token, if the model has one
    add_bos: bool  # whether the tokenizer prepends it when encoding a prompt
    eos: tuple[str, ...]  # tokens that end a generation
    eos_ids: tuple[int, ...]


@dataclass(frozen=True)
class ModelSpec:
    name: str
    family: str
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    vocab_size: int
    max_positions: int
    layers: tuple[LayerSpec, ...]
    template: str  # "chatml" or "plain", see engines/templates.py
    special: SpecialTokens
    fingerprint: str
    attn_scale: float = 0.0  # softmax scale of q.k; from_hf fills it in

    def __post_init__(self) -> None:
        if len(self.layers) != self.num_layers:
            raise HeteroFoldError(f"{self.name}: {len(self.layers)} layer specs for {self.num_layers} layers")
        if self.num_heads % self.num_kv_heads:
            raise HeteroFoldError(f"{self.name}: {self.num_heads} heads not a multiple of {self.num_kv_heads}")

    @property
    def windows(self) -> tuple[int, ...]:
        return tuple(layer.window for layer in self.layers)

    @property
    def full_attention_layers(self) -> tuple[int, ...]:
        return tuple(layer.index for layer in self.layers if layer.attention == "full")

    def kv_bytes_per_token(self, dtype_bytes: int = 4) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * dtype_bytes

    @classmethod
    def from_hf(cls, *, name: str, config: Any, template: str, special: SpecialTokens, fingerprint: str) -> ModelSpec:
        n_layers = int(config.num_hidden_layers)
        n_heads = int(config.num_attention_heads)
        hidden = int(config.hidden_size)
        head_dim = int(getattr(config, "head_dim", None) or hidden // n_heads)
        layer_types = list(getattr(config, "layer_types", None) or ["full_attention"] * n_layers)
        window = int(getattr(config, "sliding_window", None) or 0)
        layers = []
        for i, kind in enumerate(layer_types):
            theta, rope_type = _rope_for(config, kind)
            sliding = kind == "sliding_attention"
            if sliding and window <= 0:
                raise HeteroFoldError(f"{name}: layer {i} slides but the config has no sliding_window")
            layers.append(
                LayerSpec(
                    index=i,
                    attention="sliding" if sliding else "full",
                    window=window if sliding else 0,
                    rope_theta=theta,
                    rope_type=rope_type,
                )
            )
        return cls(
            name=name,
            family=str(config.model_type).removesuffix("_text"),
            num_layers=n_layers,
            num_heads=n_heads,
            num_kv_heads=int(getattr(config, "num_key_value_heads", None) or n_heads),
            head_dim=head_dim,
            hidden_size=hidden,
            vocab_size=int(config.vocab_size),
            max_positions=int(config.max_position_embeddings),
            layers=tuple(layers),
            template=template,
            special=special,
            fingerprint=fingerprint,
            attn_scale=float(getattr(config, "query_pre_attn_scalar", None) or head_dim) ** -0.5,
        )


def _rope_for(config: Any, layer_type: str) -> tuple[float, str]:
    """RoPE theta and type of one layer type. transformers 5 keeps them in ``rope_parameters``,
    either flat or keyed by layer type (Gemma3); older configs have ``rope_theta``."""
    params = getattr(config, "rope_parameters", None)
    if isinstance(params, Mapping) and layer_type in params:
        params = params[layer_type]
    if isinstance(params, Mapping) and "rope_theta" in params:
        return float(params["rope_theta"]), str(params.get("rope_type", "default"))
    theta = getattr(config, "rope_theta", None)
    if theta is None:
        raise HeteroFoldError(f"config has no RoPE theta for {layer_type} layers")
    return float(theta), "default"


def fingerprint(tensors: Iterable[tuple[str, torch.Tensor]], config: Mapping[str, Any]) -> str:
    """sha256 over every weight (name, dtype, shape, bytes, in name order) and the config JSON.

    Keys that only record the writing tool are left out, so the same weights and config give the
    same fingerprint whichever transformers release saved them.
    """
    h = hashlib.sha256()
    cfg = {k: v for k, v in config.items() if k not in _VOLATILE_CONFIG_KEYS}
    h.update(json.dumps(cfg, sort_keys=True, default=str).encode())
    for name, t in sorted(tensors, key=lambda item: item[0]):
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}".encode())
        h.update(t.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy().data)
    return h.hexdigest()
