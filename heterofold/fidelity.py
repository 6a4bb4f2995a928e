"""Fidelity of a transferred cache against native prefill, from teacher-forced logits."""

from __future__ import annotations

import torch


def first_token_kl(native: torch.Tensor, other: torch.Tensor) -> float:
    """KL(native || other) in nats between next-token distributions from logits ``(V,)``."""
    p = torch.log_softmax(native.double(), -1)
    q = torch.log_softmax(other.double(), -1)
    return float((p.exp() * (p - q)).sum())


def top1_agreement(native: torch.Tensor, other: torch.Tensor) -> float:
    """Share of positions ``(T, V)`` where both argmaxes agree (teacher-forced on native's answer)."""
    if native.shape != other.shape or native.shape[0] == 0:
        raise ValueError(f"logit shapes {tuple(native.shape)} and {tuple(other.shape)} must match and be non-empty")
    return float((native.argmax(-1) == other.argmax(-1)).double().mean())


def mean_kl(native: torch.Tensor, other: torch.Tensor) -> float:
    """Mean over positions of KL(native || other), in nats, from logits ``(T, V)`` teacher-forced
    on the same tokens."""
    if native.shape != other.shape or native.shape[0] == 0:
        raise ValueError(f"logit shapes {tuple(native.shape)} and {tuple(other.shape)} must match and be non-empty")
    p = torch.log_softmax(native.double(), -1)
    q = torch.log_softmax(other.double(), -1)
    return float((p.exp() * (p - q)).sum(-1).mean())
