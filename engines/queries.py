"""The receiver's native queries of one forward pass, for HeteroFold's calibration.

``capture_queries(model, spec)`` hooks every layer's query projection (Gemma3: its ``q_norm``)
while it is open and records, per pass, each layer's queries after RoPE. It records whatever runs
through the model while open, so it must be open around one pass only, on the engine's worker
thread, never across awaits: ``LocalEngine.prefill_with_queries`` is the one caller, and a chat
request that the same engine serves meanwhile runs before or after that job, never inside it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from heterofold.rope import apply_rope
from heterofold.spec import ModelSpec


@contextmanager
def capture_queries(model: Any, spec: ModelSpec) -> Iterator[list[tuple[torch.Tensor, ...]]]:
    """Record the model's queries, after RoPE, per layer, for each forward pass run while the
    context is open (one entry per pass, all layers)."""
    raw: list[torch.Tensor] = []
    out: list[tuple[torch.Tensor, ...]] = []

    def hook(module: Any, args: Any, output: torch.Tensor) -> None:
        raw.append(heads_first(output.detach(), spec.num_heads, spec.head_dim))  # (H_q, T, D)
        if len(raw) == spec.num_layers:
            pos = torch.arange(raw[0].shape[1])
            out.append(tuple(apply_rope(q.float(), pos, spec.layers[i].rope_theta) for i, q in enumerate(raw)))
            raw.clear()

    handles = []
    for layer in model.model.layers:
        attn = layer.self_attn
        handles.append((getattr(attn, "q_norm", None) or attn.q_proj).register_forward_hook(hook))
    try:
        yield out
    finally:
        for h in handles:
            h.remove()


def heads_first(x: torch.Tensor, heads: int, head_dim: int) -> torch.Tensor:
    """A projection's output as ``(H, T, D)``: q_proj gives (1, T, H*D); Gemma3's q_norm runs
    after the transpose and gives (1, H, T, D)."""
    if x.dim() == 4:
        return x[0]
    return x[0].reshape(x.shape[1], heads, head_dim).transpose(0, 1)
