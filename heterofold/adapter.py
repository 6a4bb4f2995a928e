"""The adapter: per receiver layer, affine maps from aligned sender KV to receiver KV, in content space.

For receiver layer l with sender layers S_l (see ``align.align_layers``):

    x_k = concat_{s in S_l} strip_rope(K_s[s], p_s, theta_s[s])    # (N, |S_l| * H_s * D_s)
    k_r = apply_rope(x_k @ Wk_l + bk_l, p_r, theta_r[l])            # (N, H_r * D_r) -> (H_r, N, D_r)
    v_r = concat_{s in S_l} V_s[s] @ Wv_l + bv_l                   # values carry no RoPE

A map may also read the receiver's own view of each token (``TokenMap``: its input embedding and
the previous tokens', RMS-normalised, projected once onto ``r`` shared components ``z``), which
the sender's cache cannot give it exactly; then ``x_k @ Wk_l + z @ Tk_l`` and ``x_v @ Wv_l + z @ Tv_l``.
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
from heterofold.features import SenderFeatures, token_features
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
    token_lags: int = 0  # tokens of receiver token features per position (0: the map reads none)
    token_rank: int = 0  # their shared components (TokenMap)
    format: str = FORMAT

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Manifest:
        if data.get("format") != FORMAT:
            raise AdapterError(f"adapter format {data.get('format')!r}, this build reads {FORMAT}")
        side = {k: Side(**{**data[k], "rope_thetas": tuple(data[k]["rope_thetas"])}) for k in ("sender", "receiver")}
        layers = tuple(tuple(s) for s in data["sender_layers"])
        return cls(**{**data, **side, "sender_layers": layers})


Weights = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]


@dataclass(frozen=True)
class LayerMap:
    k_weight: torch.Tensor  # (F_k, H_r * D_r)
    k_bias: torch.Tensor  # (H_r * D_r,)
    v_weight: torch.Tensor  # (F_v, H_r * D_r)
    v_bias: torch.Tensor  # (H_r * D_r,)
    k_token: torch.Tensor | None = None  # (r, H_r * D_r): weights of the token components (TokenMap)
    v_token: torch.Tensor | None = None


@dataclass(frozen=True)
class TokenMap:
    """The receiver token features a map reads (``heterofold.features.token_features``), projected
    once for every layer: ``z = (token_features(E, ids, lags) - mean) @ proj`` ``(T, r)``."""

    lags: int
    mean: torch.Tensor  # (lags * d_r,)
    proj: torch.Tensor  # (lags * d_r, r)

    def project(self, embeddings: torch.Tensor, ids: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """``z`` ``(T, r)`` of the receiver tokens ``ids`` ``(T,)``, given the receiver's input
        embedding table ``embeddings`` ``(V, d_r)``."""
        if embeddings.shape[1] * self.lags != self.mean.shape[0]:
            raise AdapterError(
                f"token map wants {self.mean.shape[0] // self.lags}-wide embeddings, given {embeddings.shape[1]}"
            )
        # Gather the rows where the table lives (a CUDA table is never copied whole), then map here.
        feats = token_features(embeddings.detach(), ids.to(embeddings.device), self.lags).to(self.mean.device)
        return self.components(feats).to(dtype)

    def components(self, feats: torch.Tensor) -> torch.Tensor:
        """``z`` ``(N, r)`` of token features ``(N, lags * d_r)`` already read."""
        return (feats - self.mean) @ self.proj


class Adapter:
    def __init__(self, manifest: Manifest, maps: list[LayerMap], token: TokenMap | None = None) -> None:
        m = manifest
        if len(maps) != m.receiver.num_layers or len(m.sender_layers) != m.receiver.num_layers:
            raise AdapterError(f"{len(maps)} layer maps for {m.receiver.num_layers} receiver layers")
        out = m.receiver.num_kv_heads * m.receiver.head_dim
        for layer, (mp, src) in enumerate(zip(maps, m.sender_layers, strict=True)):
            f_in = len(src) * m.sender.num_kv_heads * m.sender.head_dim
            if mp.k_weight.shape != (f_in, out) or mp.v_weight.shape != (f_in, out):
                raise AdapterError(f"layer {layer}: weights {tuple(mp.k_weight.shape)}, expected {(f_in, out)}")
            want = (m.token_rank, out) if token is not None else None
            for name, w in (("k_token", mp.k_token), ("v_token", mp.v_token)):
                got = None if w is None else tuple(w.shape)
                if got != want:
                    raise AdapterError(f"layer {layer}: {name} {got}, expected {want}")
        if token is not None and (token.lags, token.proj.shape[1]) != (m.token_lags, m.token_rank):
            raise AdapterError(f"token map of {token.lags} lags, rank {token.proj.shape[1]}; manifest says "
                               f"{m.token_lags}, {m.token_rank}")  # fmt: skip
        if token is None and m.token_rank:
            raise AdapterError(f"the manifest names a rank-{m.token_rank} token map, none given")
        self.manifest = manifest
        self.maps = maps
        self.token = token
        self._cast: dict[torch.dtype, list[Weights]] = {}

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
        embeddings: torch.Tensor | None = None,
    ) -> KVCache:
        """Map ``sender`` onto receiver tokens ``receiver_ids`` ``(T_r,)``, where ``src`` ``(T_r,)``
        gives each receiver token's sender token, or -1 (left zero: the receiver must recompute
        those natively). ``rows[l]``, a bool mask ``(T_r,)``, limits layer l to the positions that
        will be read (a sliding layer needs only its windows); other rows stay zero. Returns a
        dense receiver value at positions 0..T_r-1, in the sender cache's dtype.

        ``embeddings``, the receiver's input embedding table ``(V, d_r)``, is needed by an adapter
        with a token map (``self.token``; AdapterError without it) and ignored otherwise.

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
        z_all = None
        if self.token is not None:
            if embeddings is None:
                raise AdapterError(f"adapter {m.version} reads the receiver's token embeddings: none given")
            z_all = self.token.project(embeddings, receiver_ids, compute)  # (T_r, r)
        # Per distinct rows mask: which of the N aligned rows to compute, their receiver positions,
        # and RoPE tables per theta (the sliding layers share one mask and one theta).
        Tables = dict[float, tuple[torch.Tensor, torch.Tensor]]
        groups: dict[int, tuple[torch.Tensor | None, torch.Tensor, Tables, torch.Tensor | None]] = {}
        keys, values = [], []
        for layer, src_layers in enumerate(m.sender_layers):
            keep = rows[layer] if rows is not None else None
            if id(keep) not in groups:
                sel = keep[aligned].nonzero().squeeze(1) if keep is not None else None  # rows of (N,)
                at_rows = aligned if sel is None else aligned[sel]
                groups[id(keep)] = (sel, at_rows, {}, None if z_all is None else z_all[at_rows])
            sel, at, tables, z = groups[id(keep)]
            theta = m.receiver.rope_thetas[layer]
            if theta not in tables:
                tables[theta] = rope_tables(at, D, theta, out_dtype)
            xk, xv = bank.get(src_layers, sel)
            wk, bk, wv, bv, tk, tv = weights[layer]
            k, v = torch.addmm(bk, xk, wk), torch.addmm(bv, xv, wv)  # (n, H * D)
            if z is not None and tk is not None and tv is not None:
                k, v = k.addmm_(z, tk), v.addmm_(z, tv)
            k = k.to(out_dtype).reshape(-1, H, D).transpose(0, 1)  # (H, n, D)
            v = v.to(out_dtype).reshape(-1, H, D).transpose(0, 1)
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

    def _weights(self, dtype: torch.dtype) -> list[Weights]:
        """The maps in the matmul dtype, converted once per dtype and kept."""
        if dtype not in self._cast:

            def cast(t: torch.Tensor | None) -> torch.Tensor | None:
                return None if t is None else t.to(dtype)

            self._cast[dtype] = [
                (mp.k_weight.to(dtype), mp.k_bias.to(dtype), mp.v_weight.to(dtype), mp.v_bias.to(dtype),
                 cast(mp.k_token), cast(mp.v_token))
                for mp in self.maps
            ]  # fmt: skip
        return self._cast[dtype]

    # ---- artifact ----------------------------------------------------------------------------

    def save(self, folder: Path) -> str:
        """Write the artifact; returns the sha256 of its weights file."""
        folder.mkdir(parents=True, exist_ok=True)
        tensors = {}
        for i, mp in enumerate(self.maps):
            for name in ("k_weight", "k_bias", "v_weight", "v_bias", "k_token", "v_token"):
                if getattr(mp, name) is not None:
                    tensors[f"{i}.{name}"] = getattr(mp, name).contiguous()
        if self.token is not None:
            tensors["token.mean"], tensors["token.proj"] = self.token.mean.contiguous(), self.token.proj.contiguous()
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
        try:
            maps = [
                LayerMap(
                    tensors[f"{i}.k_weight"], tensors[f"{i}.k_bias"], tensors[f"{i}.v_weight"], tensors[f"{i}.v_bias"],
                    tensors.get(f"{i}.k_token"), tensors.get(f"{i}.v_token"),
                )
                for i in range(manifest.receiver.num_layers)
            ]  # fmt: skip
        except KeyError as exc:
            raise AdapterError(f"adapter at {folder} lacks tensor {exc}") from exc
        token = None
        if manifest.token_rank:
            if "token.mean" not in tensors or "token.proj" not in tensors:
                raise AdapterError(f"adapter at {folder} names a token map and lacks its tensors")
            token = TokenMap(manifest.token_lags, tensors["token.mean"], tensors["token.proj"])
        adapter = cls(manifest, maps, token)
        adapter.check(sender_fingerprint, receiver_fingerprint)
        return adapter


MAP_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}  # HETEROFOLD_MAP_DTYPE's values


def map_dtype(device: torch.device) -> torch.dtype:
    """The matmul dtype of a map on ``device``: bfloat16 on CUDA and on CPUs with native bfloat16
    dot products (AVX512-BF16 or AMX), float32 elsewhere. A map's own error (held-out R² 0.5-0.7)
    dwarfs bfloat16's rounding (8 bits of mantissa); ``HETEROFOLD_MAP_DTYPE=float32`` forces fp32."""
    forced = os.environ.get("HETEROFOLD_MAP_DTYPE")
    if forced:
        if forced not in MAP_DTYPES:
            raise AdapterError(f"HETEROFOLD_MAP_DTYPE must be float32 or bfloat16, not {forced!r}")
        return MAP_DTYPES[forced]
    if device.type == "cuda":
        return torch.bfloat16
    if device.type == "cpu" and torch.cpu._is_avx512_bf16_supported():
        return torch.bfloat16
    return torch.float32
