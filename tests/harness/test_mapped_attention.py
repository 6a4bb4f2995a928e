"""The probes' attention rule for mapped tokens (``bench.mapped_attention``) on real receivers."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import torch

from bench.mapped_attention import MappedAttention
from engines.hf_cache import import_kv
from engines.local import LocalEngine
from heterofold.kv import KVCache

TEXT = "The quick brown fox jumps over the lazy dog near the river bank at dawn. " * 80


def _ids(engine: LocalEngine, n: int) -> list[int]:
    ids = list(engine.encode(TEXT).ids)
    assert len(ids) >= n
    return ids[:n]


def test_a_large_negative_bias_equals_removing_the_mapped_tokens(load_engine: Callable[[str], LocalEngine]) -> None:
    """smollm2 (full attention only): a -1e4 bias on positions 20..299 gives the suffix the
    logits of a cache that lacks those positions; a zero rule changes nothing."""
    r = load_engine("smollm2-135m-instruct")
    MappedAttention.install(r.model)
    ids = _ids(r, 360)

    async def run() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        kv, _ = await r.prefill(ids[:340])
        plain = await r.score(ids, past=kv)
        mapped = torch.zeros(340, dtype=torch.bool)
        mapped[20:300] = True
        rule = MappedAttention.for_model(r.model)
        with rule.active(mapped):
            zero = await r.score(ids, past=kv)
        with torch.no_grad():
            rule.bias.fill_(-1e4)
        with rule.active(mapped):
            dropped = await r.score(ids, past=kv)
        keep = (~mapped).nonzero().squeeze(1)
        sub = KVCache(kv.fingerprint, kv.token_ids[keep], kv.positions[keep],
                      tuple(k[:, keep] for k in kv.keys), tuple(v[:, keep] for v in kv.values), kv.windows)  # fmt: skip
        reference = await r.score([ids[j] for j in keep.tolist()] + ids[340:], past=sub)
        return plain, zero, dropped, reference

    plain, zero, dropped, reference = asyncio.run(run())
    assert torch.allclose(plain, zero, atol=1e-4)
    assert (plain - dropped).abs().max() > 1.0  # the bias does something
    assert torch.allclose(dropped, reference, atol=1e-3)


def test_the_bias_follows_positions_on_sliding_layers(load_engine: Callable[[str], LocalEngine]) -> None:
    """gemma3 (sliding layers keep the last 511 positions): a bias on sliding layers only changes
    nothing when the mapped positions lie before every window, and changes the logits when they
    lie inside it; a column-for-position rule would bias the window's first columns instead."""
    r = load_engine("gemma3-270m")
    MappedAttention.install(r.model)
    ids = _ids(r, 760)
    sliding = torch.tensor([w > 0 for w in r.spec.windows])
    assert sliding.any() and (r.spec.windows[int(sliding.nonzero()[0])] - 1) < 700

    async def run(lo: int, hi: int) -> float:
        kv, _ = await r.prefill(ids[:700])
        plain = await r.score(ids, past=kv)
        mapped = torch.zeros(700, dtype=torch.bool)
        mapped[lo:hi] = True
        rule = MappedAttention.for_model(r.model)
        with torch.no_grad():
            rule.bias[sliding] = -1e4
        with rule.active(mapped):
            biased = await r.score(ids, past=kv)
        return float((plain - biased).abs().max())

    assert asyncio.run(run(0, 150)) < 1e-4
    assert asyncio.run(run(620, 690)) > 0.1


def test_a_step_on_the_rule_lowers_a_fixed_loss(load_engine: Callable[[str], LocalEngine]) -> None:
    """Gradients reach the bias and the slots through the receiver's attention; steps lower the KL
    of the biased receiver to a target that down-weights the mapped block."""
    r = load_engine("smollm2-135m-instruct")
    MappedAttention.install(r.model)
    ids = _ids(r, 300)
    mapped = torch.zeros(280, dtype=torch.bool)
    mapped[10:250] = True
    rule = MappedAttention.for_model(r.model, slots=2, learn="bias+slots")
    kv, _ = asyncio.run(r.prefill(ids[:280]))
    target_rule = MappedAttention.for_model(r.model)
    with torch.no_grad():
        target_rule.bias.fill_(-3.0)
    pos = torch.arange(280, 300)[None]

    def logits(rule_: MappedAttention) -> torch.Tensor:
        cache = import_kv(kv, r.model.config, r.spec, r.device, r.dtype)
        with rule_.active(mapped):
            out = r.model(input_ids=torch.tensor([ids[280:]]), position_ids=pos, cache=cache, use_cache=True,
                          logits_to_keep=0)  # fmt: skip
        return torch.log_softmax(out.logits[0].float(), -1)

    def train() -> list[float]:
        with torch.no_grad():
            target = logits(target_rule)
        opt = torch.optim.Adam([p for p in rule.parameters() if p.requires_grad], lr=0.1)
        losses = []
        with torch.enable_grad():
            for _ in range(4):
                opt.zero_grad()
                lp = logits(rule)
                loss = (target.exp() * (target - lp)).sum(-1).mean()
                loss.backward()
                assert rule.bias.grad is not None and rule.bias.grad.abs().sum() > 0
                assert rule.slot_v.grad is not None and rule.slot_v.grad.abs().sum() > 0
                opt.step()
                losses.append(float(loss.detach()))
        return losses

    losses = asyncio.run(r.run_exclusive(train))
    assert losses[-1] < 0.8 * losses[0]


def test_the_probe_table_counts_every_kind_of_the_suite() -> None:
    """``bench.learned_bias.table`` reads the suite's own item ids: all look-ups right and every
    other answer wrong give 1.00 and 0.00, and the whole-context columns come from the summary."""
    from bench.learned_bias import LOOKUPS, table
    from heterofold.suite import builtin_suite

    items = builtin_suite(lengths=(1024,), per_cell=1)
    per_item = {i.id: [None if i.metric != "answer" else i.kind in LOOKUPS, 0.1] for i in items}
    assert sum(1 for c, _ in per_item.values() if c) == 20
    row = {"per_item": per_item, "fidelity_kl": 0.25, "fidelity_top1": 0.9, "ttft_ms": 12.0}
    assert "| p | 1.00 | 0.00 | 0.250 | 0.90 | 12 |" in table({"paths": {"p": row}}).splitlines()
