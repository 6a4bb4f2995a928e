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
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from heterofold.errors import AdapterError, FingerprintMismatch
from heterofold.kv import KVCache
from heterofold.rope import apply_rope, strip_rope
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
    ) -> KVCache:
        """Map ``sender`` onto receiver tokens ``receiver_ids`` ``(T_r,)``, where ``src`` ``(T_r,)``
        gives each receiver token's sender token, or -1 (left zero: the receiver must recompute
        those natively). ``rows[l]``, a bool mask ``(T_r,)``, limits layer l to the positions that
        will be read (a sliding layer needs only its windows); other rows stay zero. Returns a
        dense receiver value at positions 0..T_r-1."""
        m = self.manifest
        if sender.fingerprint != m.sender.fingerprint:
            raise FingerprintMismatch(f"sender KV from {sender.fingerprint[:12]}, adapter wants {m.sender.name}")
        (T_r,) = receiver_ids.shape
        aligned = (src >= 0).nonzero().squeeze(1)  # (N,)
        s_idx = src[aligned]  # (N,) sender token indices
        s_pos = sender.positions[s_idx]
        r_pos = aligned  # receiver token j sits at position j
        H, D = m.receiver.num_kv_heads, m.receiver.head_dim
        feats = SenderFeatures(sender, s_idx, s_pos, m.sender.rope_thetas)
        keys, values = [], []
        for layer, (mp, src_layers) in enumerate(zip(self.maps, m.sender_layers, strict=True)):
            xk, xv = feats.get(src_layers)  # (N, F) each
            keep = rows[layer] if rows is not None else None
            sel = keep[aligned].nonzero().squeeze(1) if keep is not None else None  # rows of (N,) to compute
            if sel is not None:
                xk, xv = xk[sel], xv[sel]
            at = aligned if sel is None else aligned[sel]
            k = (xk @ mp.k_weight + mp.k_bias).reshape(-1, H, D).transpose(0, 1)  # (n, H*D) -> (H, n, D)
            v = (xv @ mp.v_weight + mp.v_bias).reshape(-1, H, D).transpose(0, 1)
            k_full = torch.zeros(H, T_r, D, dtype=k.dtype)
            v_full = torch.zeros(H, T_r, D, dtype=v.dtype)
            k_full[:, at] = apply_rope(k, r_pos if sel is None else r_pos[sel], m.receiver.rope_thetas[layer])
            v_full[:, at] = v
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


class SenderFeatures:
    """Content-space sender features at the tokens ``idx`` (positions ``pos``), per sender layer,
    computed once and shared by the receiver layers that read the same sender layer."""

    def __init__(self, sender: KVCache, idx: torch.Tensor, pos: torch.Tensor, thetas: tuple[float, ...]) -> None:
        self.sender, self.idx, self.pos, self.thetas = sender, idx, pos, thetas
        self._k: dict[int, torch.Tensor] = {}
        self._v: dict[int, torch.Tensor] = {}

    def layer(self, s: int) -> tuple[torch.Tensor, torch.Tensor]:
        if s not in self._k:
            kv = self.sender
            if kv.stored_length(s) != kv.num_tokens:
                raise AdapterError(f"sender layer {s} does not hold every token (sliding window)")
            k = strip_rope(kv.keys[s][:, self.idx], self.pos, self.thetas[s])  # (H_s, N, D_s)
            self._k[s] = k.transpose(0, 1).reshape(len(self.idx), -1)  # (N, H_s * D_s)
            self._v[s] = kv.values[s][:, self.idx].transpose(0, 1).reshape(len(self.idx), -1)
        return self._k[s], self._v[s]

    def get(self, layers: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        pairs = [self.layer(s) for s in layers]
        return torch.cat([k for k, _ in pairs], dim=1), torch.cat([v for _, v in pairs], dim=1)
