"""Attention read out of the embedded engine: where a short run of tokens looks in the cache before it.

The selectors that choose by meaning (``engines/selectors.py``) need, for a few query tokens run
over a cached context, each head's attention weights over the keys. SDPA does not return them, so
``probing(model, layers, rows)`` routes the model's attention through ``_probe_sdpa`` for one
pass: it computes the layer's output with the model's own attention function (the engine's SDPA,
``engines/attention.py``) as usual and, on the layers asked for, also ``softmax(q k^T * scaling)``
for the last ``rows`` queries only (a long prompt costs O(rows x S), not O(S^2)) under the pass's
mask over ``cache + new`` keys, averaged over heads, each key/value group's keys read once for the
query heads that share them (not copied out per head).
The probe registers SDPA's mask function too: an attention name with no mask function of its own
gets no mask at all, and SDPA's implicit causal mask is wrong for a pass that continues a cache.
Only full-attention layers are probed: a sliding layer's cache holds the last window only.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from engines.attention import sdpa

PROBE = "heterofold_probe_sdpa"


@dataclass
class _Record:
    rows: int  # the last query rows of each pass to record
    weights: dict[int, torch.Tensor | None]
    kernel: Any = sdpa  # the model's own attention function, which computes every layer's output


_probe: contextvars.ContextVar[_Record | None] = contextvars.ContextVar("heterofold_probe", default=None)


def _probe_sdpa(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    record = _probe.get()
    kernel = record.kernel if record is not None else sdpa
    out, _ = kernel(module, query, key, value, attention_mask, **kwargs)
    layer = getattr(module, "layer_idx", None)
    if record is not None and layer in record.weights:
        n_all = query.shape[2]
        n = min(record.rows, n_all)
        heads, groups = query.shape[1], key.shape[1]  # query heads h // (heads // groups) read key group h
        q = query[0, :, n_all - n :].float().reshape(groups, heads // groups * n, -1)  # (G, H/G * n, D)
        k = key[0].float()  # (G, S, D): each group's keys once, not copied out to its heads
        scaling = kwargs.get("scaling") or getattr(module, "scaling", q.shape[-1] ** -0.5)
        scores = (q @ k.transpose(-1, -2) * scaling).reshape(heads, n, -1)  # (H, n, S)
        softcap = kwargs.get("softcap") or getattr(module, "attn_logit_softcapping", None)
        if softcap:
            scores = torch.tanh(scores / softcap) * softcap
        s = scores.shape[-1]
        if attention_mask is None:  # SDPA's own causal rule, which holds when there is no cache
            allowed = torch.arange(s)[None, :] <= torch.arange(s - n, s)[:, None]
            scores = scores.masked_fill(~allowed.to(scores.device), float("-inf"))
        elif attention_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attention_mask[0, :, n_all - n : n_all, :s], float("-inf"))
        else:
            scores = scores + attention_mask[0, :, n_all - n : n_all, :s].float()
        record.weights[layer] = scores.softmax(-1).mean(0).cpu()  # (n, S)
    return out, None


AttentionInterface.register(PROBE, _probe_sdpa)
AttentionMaskInterface.register(PROBE, sdpa_mask)  # the masks SDPA gets (a cached pass needs one)


@contextmanager
def probing(model: Any, layers: list[int], rows: int = 1) -> Iterator[dict[int, torch.Tensor | None]]:
    """Within the block, the model's forward passes record the head-averaged attention of the
    last ``rows`` query tokens of ``layers`` into the dict yielded (layer -> ``(rows, n_cached +
    n_new)``, fewer rows if the pass has fewer tokens). The engine's single worker thread runs one
    pass at a time, so switching the config is safe."""
    config = model.config
    before = config._attn_implementation
    record = _Record(rows, dict.fromkeys(layers), ALL_ATTENTION_FUNCTIONS.get_interface(before, sdpa))
    token = _probe.set(record)
    config._attn_implementation = PROBE
    try:
        yield record.weights
    finally:
        config._attn_implementation = before
        _probe.reset(token)
