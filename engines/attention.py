"""The embedded engine's attention: transformers' SDPA, with grouped-query attention left to the
kernel on the CPU.

transformers' ``sdpa_attention_forward`` copies a grouped-query model's keys and values out to every
query head (``repeat_kv``) whenever a pass has a mask and more than one query token, because CUDA's
fast kernels take no mask together with ``enable_gqa``. Every pass of the embedded engine has a
mask (it always runs over an explicit cache), so a suffix prefill over a 4K cache copied the whole
cache 3x (smollm2) or 7x (qwen2.5) in every layer, and so did the sender's attention pass that a
selector reads. On the CPU, torch's SDPA takes ``enable_gqa`` with a mask and gives the same output
and gradients (``tests/engines/test_attention.py``); there ``sdpa`` below does that, and everywhere
else (CUDA, a single query token, a position bias) it is transformers' function unchanged.

``SDPA`` is the name the loader gives the models (``engines.loader.load_converted``); the probe and
the recompute's blocked kernel call ``sdpa`` too, so every pass of the engine runs one kernel rule.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

SDPA = "heterofold_sdpa"
STOCK = ("sdpa", SDPA)  # the names under which a model runs plain SDPA (recompute's blocks need one)


def grouped_in_kernel(module: torch.nn.Module, query: torch.Tensor, mask: torch.Tensor | None, **kwargs: Any) -> bool:
    """Whether ``sdpa`` hands the key/value groups to the kernel instead of repeating them."""
    return (
        getattr(module, "num_key_value_groups", 1) > 1
        and query.device.type == "cpu"
        and query.shape[2] > 1
        and mask is not None
        and kwargs.get("position_bias") is None
        and not kwargs.get("softcap")
    )


def sdpa(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """``sdpa_attention_forward``'s contract: query ``(B, H, q, D)``, key and value ``(B, H_kv, S, D)``,
    returns ``(B, q, H, D)``."""
    if not grouped_in_kernel(module, query, attention_mask, **kwargs):
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    out = torch.nn.functional.scaled_dot_product_attention(
        query,
        key,
        value,
        attn_mask=attention_mask,
        dropout_p=kwargs.get("dropout", 0.0),
        scale=kwargs.get("scaling"),
        enable_gqa=True,
    )
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register(SDPA, sdpa)
AttentionMaskInterface.register(SDPA, sdpa_mask)  # the masks SDPA gets
