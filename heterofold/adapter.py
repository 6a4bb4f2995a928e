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
import itertools
import json
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from heterofold.errors import AdapterError, FingerprintMismatch
from heterofold.kv import KVCache
from heterofold.rope import rope_tables, rotate, strip_rope
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
        aligned = (src >= 0).nonzero().squeeze(1)  # (N,) receiver positions, receiver token j at position j
        s_idx = src[aligned]  # (N,) sender token indices
        H, D = m.receiver.num_kv_heads, m.receiver.head_dim
        bank = _FeatureBank(sender, s_idx, sender.positions[s_idx], m.sender.rope_thetas, self._used_layers(), compute)
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

    def _used_layers(self) -> tuple[int, ...]:
        return tuple(sorted({s for layers in self.manifest.sender_layers for s in layers}))

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


class _FeatureBank:
    """All sender layers an adapter reads, as one ``(N, L * H_s * D_s)`` feature matrix per K and
    V (keys with RoPE stripped), in the matmul dtype. A receiver layer's features are the columns of
    its sender layers: a view when they are consecutive, which ``align_layers`` windows are."""

    def __init__(
        self,
        sender: KVCache,
        idx: torch.Tensor,
        pos: torch.Tensor,
        thetas: tuple[float, ...],
        layers: tuple[int, ...],
        dtype: torch.dtype,
    ) -> None:
        for s in layers:
            if sender.stored_length(s) != sender.num_tokens:
                raise AdapterError(f"sender layer {s} does not hold every token (sliding window)")
        N, (H, _, D) = len(idx), sender.keys[layers[0]].shape
        k = torch.empty(N, len(layers), H, D, dtype=dtype)  # filled layer by layer: one copy each
        v = torch.empty(N, len(layers), H, D, dtype=dtype)
        tables: dict[float, tuple[torch.Tensor, torch.Tensor]] = {}
        for i, s in enumerate(layers):
            if thetas[s] not in tables:
                cos, sin = rope_tables(pos, D, thetas[s], sender.keys[s].dtype)
                tables[thetas[s]] = cos, -sin  # strip: rotate back by the same angle
            k[:, i] = rotate(sender.keys[s].index_select(1, idx), *tables[thetas[s]]).transpose(0, 1)
            v[:, i] = sender.values[s].index_select(1, idx).transpose(0, 1)
        width = H * D
        self.k, self.v = k.reshape(N, -1), v.reshape(N, -1)  # (N, L * H * D), views
        self.column = {s: i * width for i, s in enumerate(layers)}
        self.width = width
        self._rows: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def get(self, layers: tuple[int, ...], sel: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """Features of ``layers`` at rows ``sel`` (all rows if None), gathered once per ``sel``."""
        k, v = self.k, self.v
        if sel is not None:
            if id(sel) not in self._rows:
                self._rows[id(sel)] = (k[sel], v[sel])
            k, v = self._rows[id(sel)]
        starts = [self.column[s] for s in layers]
        if all(b - a == self.width for a, b in itertools.pairwise(starts)):
            span = slice(starts[0], starts[0] + len(layers) * self.width)
            return k[:, span], v[:, span]
        cols = torch.cat([torch.arange(c, c + self.width) for c in starts])
        return k[:, cols], v[:, cols]
