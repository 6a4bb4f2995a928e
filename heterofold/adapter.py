"""The adapter: per receiver layer, affine maps from aligned sender KV to receiver KV, in content space.

For receiver layer l with sender layers S_l (see ``align.align_layers``):

    x_k = concat_{s in S_l} strip_rope(K_s[s], p_s, theta_s[s])    # (N, |S_l| * H_s * D_s)
    k_r = apply_rope(x_k @ Wk_l + bk_l, p_r, theta_r[l])            # (N, H_r * D_r) -> (H_r, N, D_r)
    v_r = concat_{s in S_l} V_s[s] @ Wv_l + bv_l                   # values carry no RoPE

Each output column block is one receiver KV head, so the map is per layer and KV head. Whatever
the fitting method (KV Ridge, HeteroFold), the artifact is these affine maps: applying one costs
the same, two matmuls per layer. Artifact: ``adapter.safetensors`` plus ``manifest.json``.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from heterofold.errors import AdapterError, FingerprintMismatch
from heterofold.features import SenderFeatures
from heterofold.kv import KVCache
from heterofold.rope import rope_tables, rotate
from heterofold.spec import ModelSpec

FORMAT = "heterofold-adapter/1"
WEIGHTS, MANIFEST = "adapter.safetensors", "manifest.json"


@dataclass(frozen=True)
class Side:
    """What applying an adapter needs to know of one model."""

    name: str
    fingerprint: str
    num_layers: int
    num_kv_heads: int
    head_dim: int
    rope_thetas: tuple[float, ...]

    @classmethod
    def of(cls, spec: ModelSpec) -> Side:
        thetas = tuple(layer.rope_theta for layer in spec.layers)
        return cls(spec.name, spec.fingerprint, spec.num_layers, spec.num_kv_heads, spec.head_dim, thetas)


@dataclass(frozen=True)
class Manifest:
    method: str  # "kv-ridge" or "heterofold"
    version: str
    sender: Side
    receiver: Side
    sender_layers: tuple[tuple[int, ...], ...]  # per receiver layer
    fit: dict[str, Any] = field(default_factory=dict)  # data hash, tokens, seconds, seed, ...
    metrics: dict[str, Any] = field(default_factory=dict)  # held-out fidelity
    format: str = FORMAT

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Manifest:
        if data.get("format") != FORMAT:
            raise AdapterError(f"adapter format {data.get('format')!r}, this build reads {FORMAT}")
        side = {k: Side(**{**data[k], "rope_thetas": tuple(data[k]["rope_thetas"])}) for k in ("sender", "receiver")}
        layers = tuple(tuple(s) for s in data["sender_layers"])
        return cls(**{**data, **side, "sender_layers": layers})


@dataclass(frozen=True)
class LayerMap:
    k_weight: torch.Tensor  # (F_k, H_r * D_r)
    k_bias: torch.Tensor  # (H_r * D_r,)
    v_weight: torch.Tensor  # (F_v, H_r * D_r)
    v_bias: torch.Tensor  # (H_r * D_r,)


class Adapter:
    def __init__(self, manifest: Manifest, maps: list[LayerMap]) -> None:
        m = manifest
        if len(maps) != m.receiver.num_layers or len(m.sender_layers) != m.receiver.num_layers:
            raise AdapterError(f"{len(maps)} layer maps for {m.receiver.num_layers} receiver layers")
        out = m.receiver.num_kv_heads * m.receiver.head_dim
        for layer, (mp, src) in enumerate(zip(maps, m.sender_layers, strict=True)):
            f_in = len(src) * m.sender.num_kv_heads * m.sender.head_dim
            if mp.k_weight.shape != (f_in, out) or mp.v_weight.shape != (f_in, out):
                raise AdapterError(f"layer {layer}: weights {tuple(mp.k_weight.shape)}, expected {(f_in, out)}")
        self.manifest = manifest
        self.maps = maps
        self._cast: dict[torch.dtype, list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]]] = {}

    @classmethod
    def identity(cls, side: Side, version: str = "identity") -> Adapter:
        """A model to itself: each layer read from itself, unchanged. Applying it reproduces the
        sender's cache (RoPE stripped and re-applied at the same positions)."""
        n = side.num_kv_heads * side.head_dim
        # Separate tensors per layer: safetensors refuses to save tensors that share memory.
        maps = [LayerMap(torch.eye(n), torch.zeros(n), torch.eye(n), torch.zeros(n)) for _ in range(side.num_layers)]
        layers = tuple((i,) for i in range(side.num_layers))
        return cls(Manifest("identity", version, side, side, layers), maps)

    def check(self, sender_fingerprint: str, receiver_fingerprint: str) -> None:
        """Raise FingerprintMismatch unless this adapter was fitted for exactly these two models."""
        for role, want, got in (
            ("sender", self.manifest.sender, sender_fingerprint),
            ("receiver", self.manifest.receiver, receiver_fingerprint),
        ):
            if want.fingerprint != got:
                raise FingerprintMismatch(
                    f"adapter fitted for {role} {want.name} ({want.fingerprint[:12]}), given {got[:12]}"
                )

    @torch.inference_mode()
    def apply(
        self,
        sender: KVCache,
        src: torch.Tensor,
        receiver_ids: torch.Tensor,
        rows: Sequence[torch.Tensor | None] | None = None,
        *,
        dtype: torch.dtype | None = None,
    ) -> KVCache:
        """Map ``sender`` onto receiver tokens ``receiver_ids`` ``(T_r,)``, where ``src`` ``(T_r,)``
        gives each receiver token's sender token, or -1 (left zero: the receiver must recompute
        those natively). ``rows[l]``, a bool mask ``(T_r,)``, limits layer l to the positions that
        will be read (a sliding layer needs only its windows); other rows stay zero. Returns a
        dense receiver value at positions 0..T_r-1, in the sender cache's dtype.

        ``dtype`` is the matmul dtype (default :func:`map_dtype`): bfloat16 where the hardware
        multiplies it natively, float32 otherwise and always for the identity map (exact reuse).
        Cost: the sender's features are built once (RoPE stripped per distinct theta in one
        batched op), each receiver layer reads its sender layers as a column slice of them, rows
        are gathered once per distinct ``rows`` mask, and RoPE tables are built once per theta."""
        m = self.manifest
        if sender.fingerprint != m.sender.fingerprint:
            raise FingerprintMismatch(f"sender KV from {sender.fingerprint[:12]}, adapter wants {m.sender.name}")
        compute = dtype or (torch.float32 if m.method == "identity" else map_dtype(sender.keys[0].device))
        out_dtype = sender.keys[0].dtype
        (T_r,) = receiver_ids.shape
        H, D = m.receiver.num_kv_heads, m.receiver.head_dim
        bank = self.features(sender, src, compute)
        aligned = bank.at  # (N,) receiver positions, receiver token j at position j
        weights = self._weights(compute)
        # Per distinct rows mask: which of the N aligned rows to compute, their receiver positions,
        # and RoPE tables per theta (the sliding layers share one mask and one theta).
        groups: dict[int, tuple[torch.Tensor | None, torch.Tensor, dict[float, tuple[torch.Tensor, torch.Tensor]]]] = {}
        keys, values = [], []
        for layer, src_layers in enumerate(m.sender_layers):
            keep = rows[layer] if rows is not None else None
            if id(keep) not in groups:
                sel = keep[aligned].nonzero().squeeze(1) if keep is not None else None  # rows of (N,)
                groups[id(keep)] = (sel, aligned if sel is None else aligned[sel], {})
            sel, at, tables = groups[id(keep)]
            theta = m.receiver.rope_thetas[layer]
            if theta not in tables:
                tables[theta] = rope_tables(at, D, theta, out_dtype)
            xk, xv = bank.get(src_layers, sel)
            wk, bk, wv, bv = weights[layer]
            k = torch.addmm(bk, xk, wk).to(out_dtype).reshape(-1, H, D).transpose(0, 1)  # (H, n, D)
            v = torch.addmm(bv, xv, wv).to(out_dtype).reshape(-1, H, D).transpose(0, 1)
            k_full = k.new_zeros(H, T_r, D)
            v_full = v.new_zeros(H, T_r, D)
            k_full.index_copy_(1, at, rotate(k, *tables[theta]))
            v_full.index_copy_(1, at, v)
            keys.append(k_full)
            values.append(v_full)
        return KVCache(
            fingerprint=m.receiver.fingerprint,
            token_ids=receiver_ids.to(torch.int64),
            positions=torch.arange(T_r, dtype=torch.int64),
            keys=tuple(keys),
            values=tuple(values),
            windows=(0,) * m.receiver.num_layers,
        )

    def features(self, sender: KVCache, src: torch.Tensor, dtype: torch.dtype | None = None) -> SenderFeatures:
        """The sender features ``apply`` maps: every sender layer this adapter reads, at the aligned
        receiver tokens of ``src``, in ``dtype`` (default: the cache's). Fitting reads the same."""
        layers = sorted({s for group in self.manifest.sender_layers for s in group})
        return SenderFeatures(sender, src, self.manifest.sender.rope_thetas, layers, dtype)

    def _weights(self, dtype: torch.dtype) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]]:
        """The maps in the matmul dtype, converted once per dtype and kept."""
        if dtype not in self._cast:
            self._cast[dtype] = [
                (mp.k_weight.to(dtype), mp.k_bias.to(dtype), mp.v_weight.to(dtype), mp.v_bias.to(dtype))
                for mp in self.maps
            ]
        return self._cast[dtype]

    # ---- artifact ----------------------------------------------------------------------------

    def save(self, folder: Path) -> str:
        """Write the artifact; returns the sha256 of its weights file."""
        folder.mkdir(parents=True, exist_ok=True)
        tensors = {}
        for i, mp in enumerate(self.maps):
            for name in ("k_weight", "k_bias", "v_weight", "v_bias"):
                tensors[f"{i}.{name}"] = getattr(mp, name).contiguous()
        save_file(tensors, str(folder / WEIGHTS))
        digest = hashlib.sha256((folder / WEIGHTS).read_bytes()).hexdigest()
        manifest = {**asdict(self.manifest), "weights_sha256": digest}
        (folder / MANIFEST).write_text(json.dumps(manifest, indent=2))
        return digest

    @classmethod
    def load(cls, folder: Path, *, sender_fingerprint: str, receiver_fingerprint: str) -> Adapter:
        """Load and verify an artifact for this sender and receiver. Raises AdapterError on a
        missing or tampered artifact, FingerprintMismatch for other models."""
        try:
            data = json.loads((folder / MANIFEST).read_text())
            blob = (folder / WEIGHTS).read_bytes()
        except (OSError, json.JSONDecodeError) as exc:
            raise AdapterError(f"cannot read adapter at {folder}: {exc}") from exc
        if hashlib.sha256(blob).hexdigest() != data.pop("weights_sha256", None):
            raise AdapterError(f"adapter weights at {folder} do not match their manifest's sha256")
        manifest = Manifest.from_json(data)
        tensors = load_file(str(folder / WEIGHTS))
        maps = [
            LayerMap(*(tensors[f"{i}.{n}"] for n in ("k_weight", "k_bias", "v_weight", "v_bias")))
            for i in range(manifest.receiver.num_layers)
        ]
        adapter = cls(manifest, maps)
        adapter.check(sender_fingerprint, receiver_fingerprint)
        return adapter


def map_dtype(device: torch.device) -> torch.dtype:
    """The matmul dtype of a map on ``device``: bfloat16 on CUDA and on CPUs with native bfloat16
    dot products (AVX512-BF16 or AMX), float32 elsewhere. A map's own error (held-out R² 0.5-0.7)
    dwarfs bfloat16's rounding (8 bits of mantissa); ``HETEROFOLD_MAP_DTYPE=float32`` forces fp32."""
    forced = os.environ.get("HETEROFOLD_MAP_DTYPE")
    if forced:
        if forced not in ("float32", "bfloat16"):
            raise AdapterError(f"HETEROFOLD_MAP_DTYPE must be float32 or bfloat16, not {forced!r}")
        return torch.float32 if forced == "float32" else torch.bfloat16
    if device.type == "cuda":
        return torch.bfloat16
    if device.type == "cpu" and torch.cpu._is_avx512_bf16_supported():
        return torch.bfloat16
    return torch.float32
