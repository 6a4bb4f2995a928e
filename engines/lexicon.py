"""Static word vectors for the ``meaning`` selector: a zoo model's input embedding table, read in place.

``Lexicon.from_zoo`` maps the converted model's ``model.safetensors`` into memory (numpy memmap: no
copy of the table is held; a look-up reads the rows it needs) and its ``tokenizer.json``. A word's
vector is the mean of its tokens' rows (the shorter of " word" and "word"), minus the table's mean
row (the direction every token shares), normalised to unit length. ``EMBEDDER`` is gemma3-270m:
its 262k-token vocabulary holds most English words as one token, and its table told a synonym from
20 unrelated words on 22 of 23 of the suite's synonym pairs, against 12 for smollm2's.
"""

from __future__ import annotations

import json
import struct
import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer

from engines.catalog import lookup
from engines.zoo import Zoo

EMBEDDER = "gemma3-270m"
TABLE = "model.embed_tokens.weight"
_DTYPES = {"F32": np.float32, "F16": np.float16}


class LexiconUnavailable(RuntimeError):
    """The embedder's converted model is not in the zoo cache."""


class Lexicon:
    """Unit word vectors from one embedding table (thread-safe; words are cached)."""

    def __init__(self, table: np.ndarray, tokenizer: Tokenizer, name: str) -> None:
        self.name = name
        self._table = table
        self._tok = tokenizer
        self._lock = threading.Lock()
        self._cache: dict[str, torch.Tensor] = {}
        mean = np.zeros(table.shape[1], dtype=np.float64)
        for start in range(0, table.shape[0], 16384):  # in chunks: the memmap is never read whole at once
            mean += table[start : start + 16384].astype(np.float64).sum(0)
        self._mean = torch.from_numpy(mean / table.shape[0]).float()

    @property
    def dim(self) -> int:
        """The width of a word vector."""
        return len(self._mean)

    @classmethod
    def from_zoo(cls, zoo: Zoo | None = None, name: str = EMBEDDER) -> Lexicon:
        zoo = zoo or Zoo()
        entry = lookup(name)
        if not zoo.is_converted(entry):
            raise LexiconUnavailable(
                f"the meaning selector reads {name}'s embeddings; run: heterofold models pull {name}"
            )
        folder = zoo.model_dir(entry)
        table = _mapped_tensor(folder / "model.safetensors", TABLE)
        return cls(table, Tokenizer.from_file(str(folder / "tokenizer.json")), name)

    def __call__(self, words: Sequence[str]) -> torch.Tensor:
        """``(len(words), d)`` unit vectors."""
        with self._lock:
            missing = [w for w in dict.fromkeys(words) if w not in self._cache]
            if missing:
                spaced = self._tok.encode_batch([" " + w for w in missing], add_special_tokens=False)
                bare = self._tok.encode_batch(missing, add_special_tokens=False)
                for w, a, b in zip(missing, spaced, bare, strict=True):
                    ids = a.ids if len(a.ids) <= len(b.ids) else b.ids
                    v = torch.from_numpy(np.asarray(self._table[sorted(ids)], dtype=np.float32)).mean(0) - self._mean
                    self._cache[w] = v / v.norm().clamp(min=1e-12)
            if not words:
                return torch.zeros(0, len(self._mean))
            return torch.stack([self._cache[w] for w in words])


_SHARED: dict[tuple[Path, str], Lexicon] = {}
_SHARED_LOCK = threading.Lock()
_ZOO: list[Zoo] = []  # the zoo ``lexicon()`` reads when given none (``use_zoo``); default: ``Zoo()``


def use_zoo(zoo: Zoo) -> None:
    """Read the embedder from this zoo's cache from now on (the gateway's configured cache_dir)."""
    with _SHARED_LOCK:
        _ZOO[:] = [zoo]


def configured_zoo() -> Zoo:
    """The zoo that ``lexicon()`` (and ``engines.request_kind``) read when given none."""
    with _SHARED_LOCK:
        return _ZOO[0] if _ZOO else Zoo()


def lexicon(zoo: Zoo | None = None, name: str = EMBEDDER) -> Lexicon:
    """The process's one ``Lexicon`` for this zoo cache and model (loaded on first use, about 3 s
    for gemma3's table). Raises ``LexiconUnavailable`` when the model is not converted."""
    zoo = zoo or configured_zoo()
    key = (zoo.cache_dir, name)
    with _SHARED_LOCK:
        if key not in _SHARED:
            _SHARED[key] = Lexicon.from_zoo(zoo, name)
        return _SHARED[key]


def _mapped_tensor(path: Path, name: str) -> np.ndarray:
    """One tensor of a safetensors file as a read-only numpy memmap (2-D, F32 or F16)."""
    with path.open("rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(size))
    if name not in header:
        raise LexiconUnavailable(f"{path} has no tensor {name}")
    meta = header[name]
    if meta["dtype"] not in _DTYPES or len(meta["shape"]) != 2:
        raise LexiconUnavailable(f"{path}: {name} is {meta['dtype']} {meta['shape']}, not a 2-D F32/F16 table")
    start, _ = meta["data_offsets"]
    return np.memmap(path, dtype=_DTYPES[meta["dtype"]], mode="r", offset=8 + size + start, shape=tuple(meta["shape"]))
