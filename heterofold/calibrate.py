"""Output-aware calibration of a receiver layer's map, on the receiver's own native queries.

Both corrections change only the affine map's weights, so applying a calibrated adapter costs
exactly what applying an uncalibrated one does.

- Keys: a few Adam steps on ``W_k, b_k`` minimising KL(native attention || mapped attention) for
  native receiver queries at sampled positions (causal, and windowed on sliding layers). Tokens
  without a sender token keep their native keys, as the transfer recomputes them natively.
- Values: closed form. With the native attention rows ``P`` (per query head), the value map
  minimises ``sum ||P X W - P Y||^2 + lam ||W - W0||^2`` per KV head: the error that matters is
  the attention output, not each value row.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from heterofold.rope import apply_rope


@dataclass(frozen=True)
class CalibDoc:
    """One fit document for one receiver layer."""

    x_k: torch.Tensor  # (N, F) content-space sender key features at aligned tokens
    x_v: torch.Tensor  # (N, F) sender value features
    idx: torch.Tensor  # (N,) receiver positions of the aligned tokens
    queries: torch.Tensor  # (H_q, T, D) native receiver queries, after RoPE
    keys: torch.Tensor  # (H_kv, T, D) native receiver keys, after RoPE
    values: torch.Tensor  # (H_kv, T, D) native receiver values


def _mask(T: int, qpos: torch.Tensor, window: int) -> torch.Tensor:
    """``(M, T)`` bool: query at ``qpos`` may see key j."""
    j = torch.arange(T)
    ok = j[None, :] <= qpos[:, None]
    if window:
        ok &= qpos[:, None] - j[None, :] < window
    return ok


def _attention(q: torch.Tensor, k: torch.Tensor, ok: torch.Tensor, scale: float) -> torch.Tensor:
    """Log-probabilities ``(H_q, M, T)`` for queries ``(H_q, M, D)`` over keys ``(H_q, T, D)``."""
    logits = (q @ k.transpose(1, 2)) * scale
    return torch.log_softmax(logits.masked_fill(~ok, float("-inf")), dim=-1)


def calibrate_keys(
    docs: Sequence[CalibDoc],
    weight: torch.Tensor,
    bias: torch.Tensor,
    *,
    theta: float,
    window: int,
    scale: float,
    steps: int = 60,
    queries_per_doc: int = 96,
    lr: float = 1e-3,
    seed: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, float, float]:
    """Returns the calibrated ``(W_k, b_k)`` and the mean attention KL before and after."""
    g = torch.Generator().manual_seed(seed)
    batches = []
    for d in docs:
        H_q, T, _ = d.queries.shape
        group = H_q // d.keys.shape[0]
        qpos = torch.randint(T // 4, T, (queries_per_doc,), generator=g)  # later positions see more context
        ok = _mask(T, qpos, window)
        q = d.queries[:, qpos]  # (H_q, M, D)
        native = _attention(q, d.keys.repeat_interleave(group, 0), ok, scale).detach()
        batches.append((d, q, ok, native, group))
    w = weight.clone().requires_grad_(True)
    b = bias.clone().requires_grad_(True)
    opt = torch.optim.Adam([w, b], lr=lr * float(weight.abs().mean()))

    def loss() -> torch.Tensor:
        total = torch.zeros(())
        for d, q, ok, native, group in batches:
            H_kv, _, D = d.keys.shape
            mapped = (d.x_k @ w + b).reshape(-1, H_kv, D).transpose(0, 1)  # (N, H*D) -> (H, N, D)
            k = d.keys.clone()
            k[:, d.idx] = apply_rope(mapped, d.idx, theta)
            logp = _attention(q, k.repeat_interleave(group, 0), ok, scale)
            kl = (native.exp() * (native - logp)).masked_fill(~ok, 0.0).sum(-1)  # (H_q, M)
            total = total + kl.mean()
        return total / len(batches)

    with torch.no_grad():
        before = float(loss())
    for _ in range(steps):
        opt.zero_grad()
        value = loss()
        value.backward()
        opt.step()
    with torch.no_grad():
        after = float(loss())
    if after >= before:  # calibration must never make the map worse on its own objective
        return weight, bias, before, before
    return w.detach(), b.detach(), before, after


def calibrate_values(
    docs: Sequence[CalibDoc],
    weight: torch.Tensor,
    bias: torch.Tensor,
    *,
    window: int,
    scale: float,
    queries_per_doc: int = 96,
    strength: float = 1e-2,
    seed: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Closed-form output-aware value map per KV head, pulled toward ``(weight, bias)``."""
    g = torch.Generator().manual_seed(seed + 1)
    F = weight.shape[0]
    H_kv, _, D = docs[0].values.shape
    gram = torch.zeros(H_kv, F + 1, F + 1, dtype=torch.float64)
    cross = torch.zeros(H_kv, F + 1, D, dtype=torch.float64)
    for d in docs:
        H_q, T, _ = d.queries.shape
        group = H_q // H_kv
        qpos = torch.randint(T // 4, T, (queries_per_doc,), generator=g)
        ok = _mask(T, qpos, window)
        p = _attention(d.queries[:, qpos], d.keys.repeat_interleave(group, 0), ok, scale).exp().double()
        p = p[:, :, d.idx]  # (H_q, M, N): the attention that lands on mapped tokens
        x = torch.cat([d.x_v.double(), torch.ones(len(d.idx), 1, dtype=torch.float64)], 1)  # (N, F + 1)
        for h in range(H_kv):
            y = d.values[h, d.idx].double()  # (N, D)
            for qh in range(h * group, (h + 1) * group):
                px = p[qh] @ x  # (M, F + 1)
                gram[h] += px.T @ px
                cross[h] += px.T @ (p[qh] @ y)
    w0 = torch.cat([weight, bias[None]], 0).double().reshape(F + 1, H_kv, D)  # (F + 1, H*D) per head
    out = torch.empty_like(w0)
    for h in range(H_kv):
        lam = strength * float(gram[h].diagonal().mean())
        eye = torch.eye(F + 1, dtype=torch.float64)
        out[:, h] = torch.linalg.solve(gram[h] + lam * eye, cross[h] + lam * w0[:, h])
    out2 = out.reshape(F + 1, H_kv * D).float()
    return out2[:F], out2[F]
