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
import math
import struct
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch

from heterofold.errors import KVChecksumError, KVFormatError

MAGIC = b"HFKV"
FORMAT_VERSION = 2
# magic, format version, 2 bytes of padding, sha256 of the body. 40 bytes, so that in a buffer
# that starts aligned the body, and every tensor in it, starts 8-byte aligned: readable in place.
_HEADER = struct.Struct("<4sH2x32s")
HEADER_SIZE = _HEADER.size
_DTYPES: dict[torch.dtype, str] = {  # safetensors' names
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.float8_e4m3fn: "F8_E4M3", torch.float8_e5m2: "F8_E5M2", torch.int64: "I64",
    torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8", torch.bool: "BOOL",
}  # fmt: skip
_TORCH_DTYPES = {name: dtype for dtype, name in _DTYPES.items()}


class KVParts(NamedTuple):
    """A value's serialized form in pieces, with no tensor bytes copied. The payload is
    ``pack_header(sha256(body)) + body``, where the body, a safetensors file, is ``prelude``
    (its u64 header length and JSON header) followed by each tensor's bytes."""

    prelude: bytes
    tensors: tuple[memoryview, ...]  # flat byte views of the value's CPU tensors, in body order

    @property
    def body(self) -> tuple[bytes | memoryview, ...]:
        return (self.prelude, *self.tensors)

    @property
    def nbytes(self) -> int:
        """Size of the whole payload, header included."""
        return HEADER_SIZE + len(self.prelude) + sum(t.nbytes for t in self.tensors)

    def sha256(self) -> bytes:
        h = hashlib.sha256()
        for part in self.body:
            h.update(part)
        return h.digest()


def pack_header(body_sha256: bytes) -> bytes:
    return _HEADER.pack(MAGIC, FORMAT_VERSION, body_sha256)


def header_digest(data: bytes | memoryview | bytearray) -> bytes:
    """The body sha256 a payload's header carries. KVFormatError when ``data`` does not start
    with a header of this format version."""
    if len(data) < HEADER_SIZE:
        raise KVFormatError(f"payload of {len(data)} bytes is shorter than the header")
    magic, version, digest = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise KVFormatError("payload does not start with the KV magic")
    if version != FORMAT_VERSION:
        raise KVFormatError(f"KV format version {version}, this build reads {FORMAT_VERSION}")
    return bytes(digest)


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

    def to_parts(self) -> KVParts:
        """The serialized form as parts, for writing without a copy. Tensors go contiguous and
        on CPU (a copy only for those that are not), the int64 ones first, so that when the
        layers share a dtype every tensor is aligned to its element size and ``from_buffer``
        reads it in place. The JSON header is written in a fixed order: the same value always
        gives the same bytes."""
        tensors = {
            "token_ids": self.token_ids.to("cpu", torch.int64),
            "positions": self.positions.to("cpu", torch.int64),
        }
        for i, (k, v) in enumerate(zip(self.keys, self.values, strict=True)):
            tensors[f"k.{i}"], tensors[f"v.{i}"] = k.detach().to("cpu"), v.detach().to("cpu")
        meta = {"fingerprint": self.fingerprint, "windows": json.dumps(list(self.windows))}
        header: dict[str, object] = {"__metadata__": meta}
        views, offset = [], 0
        for name, t in tensors.items():
            if t.dtype not in _DTYPES:
                raise KVFormatError(f"{name}: dtype {t.dtype} cannot be serialized")
            header[name] = {
                "dtype": _DTYPES[t.dtype],
                "shape": list(t.shape),
                "data_offsets": [offset, offset + t.nbytes],
            }
            views.append(t.contiguous().reshape(-1).view(torch.uint8).numpy().data)  # (numel * itemsize,)
            offset += t.nbytes
        text = json.dumps(header, separators=(",", ":")).encode()
        text += b" " * (-(HEADER_SIZE + 8 + len(text)) % 8)  # safetensors' padding: the data starts aligned
        return KVParts(struct.pack("<Q", len(text)) + text, tuple(views))

    def to_bytes(self) -> bytes:
        """The whole payload: a header carrying the sha256 of the safetensors body, then the body."""
        parts = self.to_parts()
        return b"".join((pack_header(parts.sha256()), *parts.body))

    @classmethod
    def from_bytes(cls, data: bytes | bytearray | memoryview) -> KVCache:
        """Inverse of :meth:`to_bytes`; the value owns a copy of ``data``. Raises KVChecksumError
        on any corruption, KVFormatError on a payload that is not a KV value of this format."""
        header_digest(data)  # a foreign payload fails before it is copied
        return cls.from_buffer(torch.from_numpy(np.frombuffer(data, dtype=np.uint8).copy()))

    @classmethod
    def from_buffer(cls, data: torch.Tensor, *, body_sha256: bytes | None = None) -> KVCache:
        """Inverse of :meth:`to_bytes` without a copy: ``data`` is a 1-D uint8 CPU tensor holding
        a payload, and the value's tensors are views of it, so the caller hands it over and
        never writes to it again. ``body_sha256`` is the sha256 of ``data[HEADER_SIZE:]`` when
        the caller computed it while reading the bytes (the SSD tier overlaps it with I/O);
        without it the body is hashed here. Either way the digest must match the header's
        before anything else is read. Raises as :meth:`from_bytes`."""
        if data.dtype != torch.uint8 or data.dim() != 1 or data.device.type != "cpu" or not data.is_contiguous():
            raise KVFormatError("from_buffer takes a contiguous 1-D uint8 CPU tensor")
        raw = data.numpy()  # (N,) shares memory with data
        digest = header_digest(raw[:HEADER_SIZE].tobytes())
        body = data[HEADER_SIZE:]
        if body_sha256 is None:
            body_sha256 = hashlib.sha256(raw[HEADER_SIZE:].data).digest()
        if body_sha256 != digest:
            raise KVChecksumError("KV payload checksum mismatch")
        try:
            meta, tensors = _parse_safetensors(body)
            windows = tuple(int(w) for w in json.loads(meta["windows"]))
            n = len(windows)
            return cls(
                fingerprint=str(meta["fingerprint"]),
                token_ids=tensors["token_ids"],
                positions=tensors["positions"],
                keys=tuple(tensors[f"k.{i}"] for i in range(n)),
                values=tuple(tensors[f"v.{i}"] for i in range(n)),
                windows=windows,
            )
        except (ValueError, KeyError, TypeError) as exc:  # json.JSONDecodeError is a ValueError
            raise KVFormatError(f"KV payload is not readable: {exc!r}") from exc


def _parse_safetensors(body: torch.Tensor) -> tuple[dict[str, str], dict[str, torch.Tensor]]:
    """The metadata and tensors of a safetensors file held in ``body``, (N,) uint8; the tensors
    are views of it. Layout: u64 little-endian header length n, n bytes of JSON header
    ``{"__metadata__": {...}, name: {"dtype", "shape", "data_offsets": [begin, end]}, ...}`` with
    offsets counted from the end of the header, then the tensor data."""
    raw = body.numpy()
    if len(raw) < 8:
        raise ValueError("no safetensors header length")
    (n,) = struct.unpack_from("<Q", raw.data)
    if n > len(raw) - 8:
        raise ValueError(f"safetensors header of {n} bytes runs past the end")
    header = json.loads(raw[8 : 8 + n].tobytes())
    if not isinstance(header, dict):
        raise ValueError("safetensors header is not a JSON object")
    meta = header.pop("__metadata__", {})
    data = body[8 + n :]
    tensors = {}
    for name, entry in header.items():
        dtype = _TORCH_DTYPES[entry["dtype"]]
        shape = [int(d) for d in entry["shape"]]
        begin, end = (int(x) for x in entry["data_offsets"])
        fits = 0 <= begin <= end <= len(data) and end - begin == math.prod(shape) * dtype.itemsize
        if not fits or min(shape, default=0) < 0:
            raise ValueError(f"{name}: data_offsets {begin}..{end} do not hold {shape} {dtype}")
        tensors[name] = _view(data[begin:end], dtype, shape)
    return meta, tensors


def _view(raw: torch.Tensor, dtype: torch.dtype, shape: list[int]) -> torch.Tensor:
    """``raw``, (numel * itemsize,) uint8, as a tensor of ``dtype`` and ``shape``; a view unless
    it is empty or not aligned to the element size (then a copy)."""
    if raw.numel() == 0:
        return torch.empty(shape, dtype=dtype)
    if raw.data_ptr() % dtype.itemsize or raw.storage_offset() % dtype.itemsize:
        raw = raw.clone()
    return raw.view(dtype).view(shape)
