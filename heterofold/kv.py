"""The canonical KV value: one model's attention cache for one token sequence, engine-independent.

Engines export it after a prefill and import it to continue; the store keeps it as bytes; the
HeteroFold adapters map one model's value into another's. It holds exactly what the model stores:

- keys and values per layer, ``[kv_heads, tokens, head_dim]``, keys *after* RoPE;
- a sliding-window layer (window ``w``) keeps only its last ``min(T, w - 1)`` tokens, as the
  model does, while its true length is always ``T``, the number of tokens in the value;
- the token ids and the position of each token, and the fingerprint of the model that made it.
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass

import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from heterofold.errors import KVChecksumError, KVFormatError

MAGIC = b"HFKV"
FORMAT_VERSION = 1
_HEADER = struct.Struct("<4sH32s")  # magic, format version, sha256 of the safetensors body


@dataclass(frozen=True, eq=False)
class KVCache:
    """A model's KV cache for ``token_ids``. Tensors are never mutated after construction."""

    fingerprint: str
    token_ids: torch.Tensor  # (T,) int64
    positions: torch.Tensor  # (T,) int64, the RoPE position of each token
    keys: tuple[torch.Tensor, ...]  # per layer (H_kv, T_l, D), after RoPE
    values: tuple[torch.Tensor, ...]  # per layer (H_kv, T_l, D)
    windows: tuple[int, ...]  # per layer sliding window, 0 for full attention

    def __post_init__(self) -> None:
        (T,) = self.token_ids.shape
        if self.positions.shape != (T,):
            raise KVFormatError(f"positions shape {tuple(self.positions.shape)} != ({T},)")
        if not (len(self.keys) == len(self.values) == len(self.windows)):
            raise KVFormatError("keys, values and windows must have one entry per layer")
        for i, (k, v) in enumerate(zip(self.keys, self.values, strict=True)):
            if k.dim() != 3 or k.shape != v.shape:
                raise KVFormatError(f"layer {i}: K {tuple(k.shape)} and V {tuple(v.shape)} differ or not 3-D")
            if k.shape[1] != self.stored_length(i):
                raise KVFormatError(f"layer {i}: holds {k.shape[1]} tokens, expected {self.stored_length(i)}")

    @property
    def num_tokens(self) -> int:
        return int(self.token_ids.shape[0])

    @property
    def num_layers(self) -> int:
        return len(self.keys)

    def stored_length(self, layer: int) -> int:
        """Tokens layer ``layer`` holds: all of them, or the last ``window - 1`` for a sliding layer."""
        w = self.windows[layer]
        return self.num_tokens if w == 0 else min(self.num_tokens, w - 1)

    def _stored_after(self, n: int, layer: int) -> int:
        w = self.windows[layer]
        return n if w == 0 else min(n, w - 1)

    def can_truncate(self, n: int) -> bool:
        """Whether the value for the first ``n`` tokens can be cut out of this one: a sliding
        layer must still hold every token the shorter value keeps."""
        if not 0 <= n <= self.num_tokens:
            return False
        T = self.num_tokens
        return all(n - self._stored_after(n, i) >= T - self.stored_length(i) for i in range(self.num_layers))

    def truncate(self, n: int) -> KVCache:
        """The value for the first ``n`` tokens, sharing storage with this one."""
        if not self.can_truncate(n):
            raise KVFormatError(f"cannot truncate {self.num_tokens} tokens to {n}: a sliding layer lacks them")
        T = self.num_tokens
        keys, values = [], []
        for i, (k, v) in enumerate(zip(self.keys, self.values, strict=True)):
            first = T - self.stored_length(i)  # token index of k[:, 0]
            lo, hi = n - self._stored_after(n, i) - first, n - first
            keys.append(k[:, lo:hi])
            values.append(v[:, lo:hi])
        return KVCache(
            fingerprint=self.fingerprint,
            token_ids=self.token_ids[:n],
            positions=self.positions[:n],
            keys=tuple(keys),
            values=tuple(values),
            windows=self.windows,
        )

    @property
    def is_dense(self) -> bool:
        """Every layer holds every token (a sliding layer's full history, as fitting needs)."""
        return all(w == 0 for w in self.windows)

    def windowed(self, windows: tuple[int, ...]) -> KVCache:
        """This dense value in a model's layout: each sliding layer keeps its last ``window - 1``."""
        if not self.is_dense or len(windows) != self.num_layers:
            raise KVFormatError("windowed() needs a dense value with one window per layer")
        T = self.num_tokens
        keep = [T if w == 0 else min(T, w - 1) for w in windows]
        return KVCache(
            fingerprint=self.fingerprint,
            token_ids=self.token_ids,
            positions=self.positions,
            keys=tuple(k[:, T - n :] for k, n in zip(self.keys, keep, strict=True)),
            values=tuple(v[:, T - n :] for v, n in zip(self.values, keep, strict=True)),
            windows=windows,
        )

    @property
    def nbytes(self) -> int:
        return sum(k.nbytes + v.nbytes for k, v in zip(self.keys, self.values, strict=True))

    def to_bytes(self) -> bytes:
        """Safetensors body behind a header carrying its sha256. Tensors are saved contiguous, on CPU."""
        tensors: dict[str, torch.Tensor] = {
            "token_ids": self.token_ids.to("cpu", torch.int64).contiguous(),
            "positions": self.positions.to("cpu", torch.int64).contiguous(),
        }
        for i, (k, v) in enumerate(zip(self.keys, self.values, strict=True)):
            tensors[f"k.{i}"] = k.detach().to("cpu").contiguous()
            tensors[f"v.{i}"] = v.detach().to("cpu").contiguous()
        meta = {"fingerprint": self.fingerprint, "windows": json.dumps(list(self.windows))}
        body = st_save(tensors, metadata=meta)
        return _HEADER.pack(MAGIC, FORMAT_VERSION, hashlib.sha256(body).digest()) + body

    @classmethod
    def from_bytes(cls, data: bytes | memoryview) -> KVCache:
        """Inverse of :meth:`to_bytes`. Raises KVChecksumError on any corruption, KVFormatError on
        a payload that is not a KV value of this format."""
        data = bytes(data)
        if len(data) < _HEADER.size:
            raise KVFormatError(f"payload of {len(data)} bytes is shorter than the header")
        magic, version, digest = _HEADER.unpack_from(data)
        if magic != MAGIC:
            raise KVFormatError("payload does not start with the KV magic")
        if version != FORMAT_VERSION:
            raise KVFormatError(f"KV format version {version}, this build reads {FORMAT_VERSION}")
        body = data[_HEADER.size :]
        if hashlib.sha256(body).digest() != digest:
            raise KVChecksumError("KV payload checksum mismatch")
        try:
            tensors = st_load(body)
            meta = _read_metadata(body)
            windows = tuple(int(w) for w in json.loads(meta["windows"]))
        except (ValueError, KeyError, json.JSONDecodeError) as exc:
            raise KVFormatError(f"KV payload is not readable: {exc}") from exc
        n = len(windows)
        return cls(
            fingerprint=meta["fingerprint"],
            token_ids=tensors["token_ids"],
            positions=tensors["positions"],
            keys=tuple(tensors[f"k.{i}"] for i in range(n)),
            values=tuple(tensors[f"v.{i}"] for i in range(n)),
            windows=windows,
        )


def _read_metadata(body: bytes) -> dict[str, str]:
    # safetensors layout: u64 little-endian header length, then a JSON header with "__metadata__".
    (n,) = struct.unpack_from("<Q", body)
    header = json.loads(body[8 : 8 + n])
    meta: dict[str, str] = header.get("__metadata__", {})
    return meta
