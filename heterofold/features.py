"""Sender features: what an adapter's maps read, built one way for fitting and for applying.

For the receiver tokens that have a sender token (``src >= 0``), the features of sender layer s are

    x_k[s] = strip_rope(K_s[s][:, idx], p_s[idx], theta_s[s])    # (H_s, N, D_s) -> (N, H_s * D_s)
    x_v[s] = V_s[s][:, idx]                                       # (H_s, N, D_s) -> (N, H_s * D_s)

with ``idx = src[at]`` the sender tokens of the receiver positions ``at``. A receiver layer reads
the concatenation over its sender layers, in their order. The RoPE strip runs in the cache's dtype;
the result is stored in the requested one (the adapter's matmul dtype when applying).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import torch

from heterofold.errors import AdapterError
from heterofold.kv import KVCache
from heterofold.rope import rope_tables, rotate


class SenderFeatures:
    """Content-space features of ``sender`` at the aligned receiver tokens of ``src`` ``(T_r,)``,
    for the sender ``layers`` (each complete: no sliding window), as one ``(N, L * H_s * D_s)``
    matrix per K and V in ``dtype`` (default: the cache's). ``at`` ``(N,)`` holds the receiver
    positions of the rows. A set of layers is the columns of those layers: a view when they are
    consecutive in ``layers``, which ``align_layers`` windows are."""

    def __init__(
        self,
        sender: KVCache,
        src: torch.Tensor,
        thetas: Sequence[float],
        layers: Sequence[int],
        dtype: torch.dtype | None = None,
    ) -> None:
        if not layers:
            raise AdapterError("sender features need at least one sender layer")
        for s in layers:
            if sender.stored_length(s) != sender.num_tokens:
                raise AdapterError(f"sender layer {s} does not hold every token (sliding window)")
        self.at = (src >= 0).nonzero().squeeze(1)  # (N,) receiver positions with a sender token
        idx = src[self.at]  # (N,) their sender tokens
        pos = sender.positions[idx]  # (N,) RoPE positions of those tokens in the sender
        N, (H, _, D) = len(idx), sender.keys[layers[0]].shape
        if dtype is None:
            dtype = sender.keys[layers[0]].dtype
        k = torch.empty(N, len(layers), H, D, dtype=dtype)  # filled layer by layer: one copy each
        v = torch.empty(N, len(layers), H, D, dtype=dtype)
        tables: dict[float, tuple[torch.Tensor, torch.Tensor]] = {}
        for i, s in enumerate(layers):
            if thetas[s] not in tables:
                cos, sin = rope_tables(pos, D, thetas[s], sender.keys[s].dtype)
                tables[thetas[s]] = cos, -sin  # strip: rotate back by the same angle
            k[:, i] = rotate(sender.keys[s].index_select(1, idx), *tables[thetas[s]]).transpose(0, 1)
            v[:, i] = sender.values[s].index_select(1, idx).transpose(0, 1)
        self.width = H * D
        self.k, self.v = k.reshape(N, -1), v.reshape(N, -1)  # (N, L * H * D), views
        self._column = {s: i * self.width for i, s in enumerate(layers)}
        self._rows: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def get(self, layers: Sequence[int], sel: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V features ``(n, len(layers) * H_s * D_s)`` of ``layers``, in that order, at rows
        ``sel`` of ``at`` (all rows if None; gathered once per ``sel`` object, which the caller
        keeps alive while it reuses it)."""
        k, v = self.k, self.v
        if sel is not None:
            if id(sel) not in self._rows:
                self._rows[id(sel)] = (k[sel], v[sel])
            k, v = self._rows[id(sel)]
        starts = [self._column[s] for s in layers]
        if all(b - a == self.width for a, b in itertools.pairwise(starts)):
            span = slice(starts[0], starts[0] + len(layers) * self.width)
            return k[:, span], v[:, span]
        cols = torch.cat([torch.arange(c, c + self.width) for c in starts])
        return k[:, cols], v[:, cols]


def token_features(embeddings: torch.Tensor, ids: torch.Tensor, lags: int) -> torch.Tensor:
    """The receiver's own view of its tokens ``ids`` ``(T,)``, for maps that read it (``TokenMap``):
    per position its input embedding (a row of ``embeddings`` ``(V, d)``) and those of the
    ``lags - 1`` tokens before it, each row RMS-normalised as a model's input norm does, as one
    ``(T, lags * d)`` float32 matrix (zeros before the first token). Reading it costs an embedding
    lookup: no pass of the receiver."""
    if lags < 1:
        raise AdapterError(f"token features need at least one lag, got {lags}")
    e = embeddings[ids.to(torch.int64)].float()  # (T, d)
    e = e * torch.rsqrt(e.pow(2).mean(-1, keepdim=True) + 1e-6)
    out = e.new_zeros(len(ids), lags, e.shape[1])
    for lag in range(lags):
        out[lag:, lag] = e[: len(ids) - lag]
    return out.reshape(len(ids), -1)
