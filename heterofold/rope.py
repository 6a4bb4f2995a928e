"""Rotary position embedding, applied and removed at arbitrary positions.

Cached keys carry RoPE: ``K = rope(k, p)``. A key moves between models in content space: strip
the sender's RoPE at the sender's positions with that layer's own theta, map, then apply the
receiver's RoPE at the receiver's positions with the receiver layer's theta. Values carry none.
This is the "default" RoPE of Llama, Qwen2 and Gemma3 (rotate-half layout, no scaling).
"""

from __future__ import annotations

import torch


def rope_tables(
    positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """``cos, sin`` ``(T, D)`` of the rotation to ``positions``, for :func:`rotate`."""
    # Angles in float64 (position * frequency loses digits in float32 at long contexts); the
    # rotation itself runs in the tensor's dtype.
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))  # (D/2,)
    freqs = positions.to(torch.float64)[:, None] * inv_freq[None, :]  # (T, D/2)
    emb = torch.cat((freqs, freqs), dim=-1)  # (T, D)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` ``(..., T, D)`` by precomputed tables; ``-sin`` rotates back. The same as
    ``x * cos + rotate_half(x) * sin``, without the concatenated temporary."""
    half = x.shape[-1] // 2
    out = x * cos
    out[..., :half].addcmul_(x[..., half:], sin[..., :half], value=-1)
    out[..., half:].addcmul_(x[..., :half], sin[..., half:])
    return out


def apply_rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotate ``x`` ``(..., T, D)`` to ``positions`` ``(T,)``."""
    return rotate(x, *rope_tables(positions, x.shape[-1], theta, x.dtype))


def strip_rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Inverse of :func:`apply_rope`: rotate ``x`` ``(..., T, D)`` back by ``positions``."""
    cos, sin = rope_tables(positions, x.shape[-1], theta, x.dtype)
    return rotate(x, cos, -sin)
