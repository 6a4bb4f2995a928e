"""The engine's SDPA (engines/attention.py): on the CPU a grouped-query pass with a mask hands the
key/value groups to the kernel instead of copying them to every head, with the same output and
gradients as transformers' own SDPA; the zoo models run on it, the probe's attention weights agree
with the plain softmax, and nothing else changes."""

from collections.abc import Callable
from typing import Any

import pytest
import torch
from transformers import AttentionInterface, DynamicCache
from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

import engines.attention as attention
from engines.attention import SDPA, grouped_in_kernel, sdpa
from engines.local import LocalEngine
from engines.probe import probing


class Grouped(torch.nn.Module):
    def __init__(self, groups: int) -> None:
        super().__init__()
        self.num_key_value_groups = groups
        self.is_causal = True


def tensors(heads: int, kv_heads: int, q: int, s: int, d: int = 16) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    query = torch.randn(1, heads, q, d, generator=g, requires_grad=True)
    key = torch.randn(1, kv_heads, s, d, generator=g, requires_grad=True)
    value = torch.randn(1, kv_heads, s, d, generator=g, requires_grad=True)
    mask = torch.ones(1, 1, q, s, dtype=torch.bool).tril(s - q)  # q new tokens after s - q cached
    return query, key, value, mask


def test_a_grouped_masked_pass_goes_to_the_kernel_with_the_same_output_and_gradients(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[bool] = []
    kernel = torch.nn.functional.scaled_dot_product_attention

    def spy(*args: Any, **kwargs: Any) -> torch.Tensor:
        seen.append(bool(kwargs.get("enable_gqa")))
        return kernel(*args, **kwargs)

    monkeypatch.setattr(attention.torch.nn.functional, "scaled_dot_product_attention", spy)
    module = Grouped(3)
    query, key, value, mask = tensors(9, 3, 7, 40)
    ours, _ = sdpa(module, query, key, value, mask, scaling=0.25, dropout=0.0)
    assert seen == [True]
    grads = torch.autograd.grad(ours.square().sum(), (query, key, value))
    stock, _ = sdpa_attention_forward(module, query, key, value, mask, scaling=0.25, dropout=0.0)
    assert seen == [True, False]  # transformers' own: the groups repeated, no enable_gqa
    expected = torch.autograd.grad(stock.square().sum(), (query, key, value))
    assert ours.shape == (1, 7, 9, 16)
    torch.testing.assert_close(ours, stock, rtol=0, atol=1e-6)
    for got, want in zip(grads, expected, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_other_passes_are_transformers_own() -> None:
    query, _, _, mask = tensors(9, 3, 7, 40)
    assert grouped_in_kernel(Grouped(3), query, mask)
    assert not grouped_in_kernel(Grouped(1), query, mask)  # no groups
    assert not grouped_in_kernel(Grouped(3), query[:, :, -1:], mask)  # one query token: transformers packs it
    assert not grouped_in_kernel(Grouped(3), query, None)  # no mask: transformers passes enable_gqa itself
    assert not grouped_in_kernel(Grouped(3), query, mask, position_bias=torch.zeros(1))


@pytest.mark.models
def test_the_zoo_models_run_on_it_and_answer_as_with_stock_sdpa(
    load_engine: Callable[[str], LocalEngine], monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = load_engine("smollm2-135m-instruct")  # 9 query heads over 3 key/value heads
    model = engine.model
    assert model.config._attn_implementation == SDPA
    grouped = []
    kernel = torch.nn.functional.scaled_dot_product_attention

    def spy(*args: Any, **kwargs: Any) -> torch.Tensor:
        grouped.append(bool(kwargs.get("enable_gqa")))
        return kernel(*args, **kwargs)

    monkeypatch.setattr(attention.torch.nn.functional, "scaled_dot_product_attention", spy)
    ids = torch.randint(100, 5000, (1, 300), generator=torch.Generator().manual_seed(1))
    logits = {}
    for name in ("sdpa", SDPA):
        model.config._attn_implementation = name
        try:
            cache = DynamicCache(config=model.config)
            with torch.no_grad():
                model(input_ids=ids[:, :260], position_ids=torch.arange(260)[None], cache=cache)
                grouped.clear()  # a first pass has no mask: transformers gives the kernel the groups itself
                out = model(input_ids=ids[:, 260:], position_ids=torch.arange(260, 300)[None], cache=cache)
            logits[name] = out.logits
            assert grouped and all(grouped) == (name == SDPA), (name, grouped)  # a pass over a cache: ours only
        finally:
            model.config._attn_implementation = SDPA
    torch.testing.assert_close(logits[SDPA], logits["sdpa"], rtol=0, atol=1e-4)


@pytest.mark.models
def test_the_probe_reads_each_key_group_once_and_agrees_with_the_plain_softmax(
    load_engine: Callable[[str], LocalEngine],
) -> None:
    engine = load_engine("smollm2-135m-instruct")
    model = engine.model
    layer = engine.attention_layers()[-1]
    captured: dict[str, torch.Tensor] = {}
    ids = torch.randint(100, 5000, (1, 120), generator=torch.Generator().manual_seed(2))
    with torch.no_grad(), probing(model, [layer], rows=3) as record:
        model(input_ids=ids, position_ids=torch.arange(120)[None], cache=DynamicCache(config=model.config))
    weights = record[layer]
    assert weights is not None and weights.shape == (3, 120)

    def grab(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
             mask: torch.Tensor | None, **kwargs: Any) -> tuple[torch.Tensor, None]:  # fmt: skip
        if getattr(module, "layer_idx", None) == layer:
            captured["q"], captured["k"], captured["scaling"] = query, key, torch.tensor(kwargs["scaling"])
        return sdpa(module, query, key, value, mask, **kwargs)

    AttentionInterface.register("test_grab", grab)  # a plain pass that keeps the layer's queries and keys
    AttentionMaskInterface.register("test_grab", sdpa_mask)
    model.config._attn_implementation = "test_grab"
    try:
        with torch.no_grad():
            model(input_ids=ids, position_ids=torch.arange(120)[None], cache=DynamicCache(config=model.config))
    finally:
        model.config._attn_implementation = SDPA
    q, k = captured["q"][0, :, -3:], repeat_kv(captured["k"], 3)[0]  # every head's keys, copied out
    scores = q @ k.transpose(-1, -2) * captured["scaling"]
    causal = torch.arange(120)[None, :] <= torch.arange(117, 120)[:, None]
    plain = scores.masked_fill(~causal, float("-inf")).softmax(-1).mean(0)
    torch.testing.assert_close(weights, plain, rtol=1e-4, atol=1e-6)
