"""A receiver attention rule for the mapped context tokens, for probes: an additive logit bias per
layer and query head on the mapped (not recomputed) positions, and extra learned key/value slots
per layer ("sinks") that every query sees.

Importing this module routes the engine's attention (``engines.attention.SDPA``) through
``biased_sdpa``, in this process only; ``MappedAttention.install(model)`` lets it see the
receiver's pass positions. While a ``MappedAttention`` is active (``with rule.active(mapped):``),
every pass of the model (suffix prefill, each decoded token, teacher-forced scoring, a
distillation step with gradients) adds ``bias[layer, head]`` to the logits of every key column
whose position is mapped, and appends the layer's ``slots`` key/value pairs after the cache's
columns with their own logit offset ``slot_bias[layer, head]``. Inactive, it is the engine's own
``engines.attention.sdpa``.

Key columns are matched to positions through the pass's ``position_ids`` (a forward pre-hook on the
model): a layer's keys cover the contiguous positions ending at the pass's last query, all of them on
a full-attention layer and the last ``window - 1`` plus the new ones on a sliding layer (the
engine's caches keep a contiguous tail there), so a sliding layer's bias falls on the right tokens.

Not a product path: the rule lives in this process only. A served version would have to carry the
mapped positions with the cache through the store and every later pass of the engine.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, ClassVar

import torch
from transformers import AttentionInterface, PreTrainedModel

from engines.attention import SDPA, sdpa
from engines.selectors import HopText
from engines.transfer import TransferResult

_HOOKED: set[int] = set()  # models whose pass positions are tracked
SLOT_START = -8.0  # the slots' first logit offset: next to no weight, so step 0 is the plain rule


class MappedAttention(torch.nn.Module):
    """Per layer and query head a logit bias on mapped positions (``bias``, zero at the start), and
    ``slots`` learned key/value pairs per layer and KV head with a logit offset per query head
    (``slot_bias``). ``learn`` names what trains: ``bias``, ``slots`` or both (``bias+slots``)."""

    _current: ClassVar[MappedAttention | None] = None
    _end: ClassVar[list[int]] = [0]  # one past the last query position of the running pass

    def __init__(
        self, layers: int, heads: int, kv_heads: int, head_dim: int, *, slots: int = 0, learn: str = "bias"
    ) -> None:
        super().__init__()
        parts = set(learn.split("+"))
        if not parts <= {"bias", "slots"}:
            raise ValueError(f"learn: 'bias', 'slots' or 'bias+slots', got {learn!r}")
        if "slots" in parts and slots < 1:
            raise ValueError("learning slots needs slots >= 1")
        self.learn, self.heads, self.kv_heads = learn, heads, kv_heads
        self.bias = torch.nn.Parameter(torch.zeros(layers, heads), requires_grad="bias" in parts)
        n = slots if "slots" in parts else 0
        self.slot_k = torch.nn.Parameter(torch.zeros(layers, kv_heads, n, head_dim), requires_grad=n > 0)
        self.slot_v = torch.nn.Parameter(torch.zeros(layers, kv_heads, n, head_dim), requires_grad=n > 0)
        self.slot_bias = torch.nn.Parameter(torch.full((layers, heads), SLOT_START), requires_grad=n > 0)
        self.mapped = torch.zeros(0, dtype=torch.bool)

    @classmethod
    def for_model(cls, model: PreTrainedModel, **kw: Any) -> MappedAttention:
        c = model.config.get_text_config()
        head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        return cls(c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads, head_dim, **kw)

    @staticmethod
    def install(model: PreTrainedModel) -> None:
        """Track ``model``'s pass positions (its attention already runs ``biased_sdpa``, which is
        the engine's rule while no ``MappedAttention`` is active)."""
        if model.config._attn_implementation != SDPA:
            raise ValueError(f"expected the engine's {SDPA!r} attention, got {model.config._attn_implementation!r}")
        if id(model) not in _HOOKED:
            model.register_forward_pre_hook(_track_end, with_kwargs=True)
            _HOOKED.add(id(model))

    @contextlib.contextmanager
    def active(self, mapped: torch.Tensor) -> Iterator[None]:
        """Apply this rule to every pass inside the block; ``mapped``: bool per position of the cache."""
        before, self.mapped = MappedAttention._current, mapped.bool().cpu()
        MappedAttention._current = self
        try:
            yield
        finally:
            MappedAttention._current = before

    def penalty(self) -> torch.Tensor:
        """Mean squared bias and slot value: keeps an underdetermined parameter near the plain rule."""
        total = self.bias.pow(2).mean()
        return total + self.slot_v.pow(2).mean() if self.slot_v.numel() else total

    def summary(self) -> dict[str, Any]:
        b = self.bias.detach()
        out: dict[str, Any] = {"learn": self.learn, "bias_mean": round(float(b.mean()), 3),
                               "bias_min": round(float(b.min()), 3), "bias_max": round(float(b.max()), 3),
                               "bias_by_layer": [round(float(x), 3) for x in b.mean(1)]}  # fmt: skip
        if self.slot_k.shape[2]:
            out |= {"slots": self.slot_k.shape[2], "slot_bias_mean": round(float(self.slot_bias.detach().mean()), 3)}
        return out


def mapped_positions(hop: HopText, tr: TransferResult, tail: int) -> torch.Tensor:
    """Bool per position of ``tr``'s cache: True where the value came from the map (aligned, not
    in the tail window, not chosen for recompute), as ``engines.transfer.transfer`` builds it."""
    prefix = tr.prefix
    mask = hop.source(prefix) >= 0
    mask[max(prefix - tail, 0) : prefix] = False
    if tr.chosen:
        mask[torch.tensor(tr.chosen)] = False
    return mask


def _track_end(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    pos = kwargs.get("position_ids")
    if pos is not None:
        MappedAttention._end[0] = int(pos.max()) + 1


def biased_sdpa(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """``engines.attention.sdpa`` with the active rule's bias and slots (module docstring)."""
    rule = MappedAttention._current
    if rule is None:
        return sdpa(module, query, key, value, attention_mask, **kwargs)
    layer = int(getattr(module, "layer_idx"))  # noqa: B009 (a module attribute mypy cannot see)
    B, H, q_len, _ = query.shape
    k_len, dtype, dev = key.shape[2], query.dtype, query.device
    low = torch.finfo(dtype).min
    if attention_mask is None:  # causal over the new rows (one row when decoding)
        rows, cols = torch.arange(q_len)[:, None], torch.arange(k_len)[None, :]
        base = torch.zeros(q_len, k_len, dtype=dtype).masked_fill_(cols > k_len - q_len + rows, low)[None, None]
    elif attention_mask.dtype == torch.bool:
        base = torch.zeros(attention_mask.shape, dtype=dtype).masked_fill_(~attention_mask.cpu(), low)
    else:
        base = attention_mask.to(dtype).cpu()
    base = base[..., :k_len].to(dev)
    first = MappedAttention._end[0] - k_len  # the position of key column 0
    positions = torch.arange(first, first + k_len)
    mapped = torch.zeros(k_len, dtype=torch.bool)
    inside = (positions >= 0) & (positions < rule.mapped.shape[0])
    mapped[inside] = rule.mapped[positions[inside]]
    bias = rule.bias[layer].to(dtype)[:, None, None] * mapped.to(dtype)[None, None, :]  # (H, 1, k)
    mask = torch.maximum(base + bias.to(dev)[None], torch.tensor(low, dtype=dtype))  # (B|1, H, q, k)
    n = rule.slot_k.shape[2]
    if n:
        sk = rule.slot_k[layer].to(dtype)[None].expand(B, -1, -1, -1).to(dev)
        sv = rule.slot_v[layer].to(dtype)[None].expand(B, -1, -1, -1).to(dev)
        key, value = torch.cat([key, sk], 2), torch.cat([value, sv], 2)
        sb = rule.slot_bias[layer].to(dtype).to(dev)[None, :, None, None].expand(mask.shape[0], H, q_len, n)
        mask = torch.cat([mask.expand(-1, H, q_len, -1), sb], -1)
    return sdpa(module, query, key, value, mask, **kwargs)


# The engine's attention name now runs the rule: identical to ``sdpa`` while none is active, and
# recompute's blocked kernel (which calls ``sdpa`` itself) is untouched.
AttentionInterface.register(SDPA, biased_sdpa)
