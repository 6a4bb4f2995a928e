"""The distilled map's parameterisation: it starts at the map it distils, it computes the mapped
KV exactly as applying the adapter does, and folding it gives a plain adapter."""

import dataclasses

import torch

from heterofold.adapter import Adapter, LayerMap, Manifest, Side
from heterofold.distill import DistillDoc, LowRankResidual, doc_features, kl_loss, split_docs
from heterofold.kv import KVCache

SENDER = Side("s", "fp-s", 3, 2, 8, (1e4, 1e4, 1e4))
RECEIVER = Side("r", "fp-r", 2, 1, 16, (1e4, 1e6))


def _adapter(seed: int = 0) -> Adapter:
    g = torch.Generator().manual_seed(seed)
    layers = ((0, 1), (1, 2))
    f, o = 2 * SENDER.num_kv_heads * SENDER.head_dim, RECEIVER.num_kv_heads * RECEIVER.head_dim
    maps = [LayerMap(*(torch.randn(*shape, generator=g) for shape in ((f, o), (o,), (f, o), (o,)))) for _ in layers]
    return Adapter(Manifest("kv-ridge", "t", SENDER, RECEIVER, layers), maps)


def _sender_kv(T: int) -> KVCache:
    g = torch.Generator().manual_seed(1)
    shape = (SENDER.num_kv_heads, T, SENDER.head_dim)
    keys = tuple(torch.randn(*shape, generator=g) for _ in range(SENDER.num_layers))
    values = tuple(torch.randn(*shape, generator=g) for _ in range(SENDER.num_layers))
    return KVCache("fp-s", torch.arange(T), torch.arange(T), keys, values, (0,) * SENDER.num_layers)


def _doc(adapter: Adapter, T: int = 12) -> tuple[DistillDoc, torch.Tensor]:
    src = torch.arange(T)
    src[0] = -1  # a receiver token without a sender token (BOS)
    x_k, x_v, at, _ = doc_features(adapter, _sender_kv(T), src)
    zeros = tuple(torch.zeros(RECEIVER.num_kv_heads, T, RECEIVER.head_dim) for _ in range(RECEIVER.num_layers))
    doc = DistillDoc(x_k, x_v, at, zeros, zeros, torch.arange(T), torch.arange(3), slice(0, 2), torch.zeros(2, 5))
    return doc, src


def test_the_residual_starts_at_the_adapter_and_maps_as_apply_does() -> None:
    adapter = _adapter()
    doc, src = _doc(adapter)
    keys, values = LowRankResidual(adapter, rank=4).context_kv(doc)
    applied = adapter.apply(_sender_kv(12), src, torch.arange(12), dtype=torch.float32)
    for k, v, ak, av in zip(keys, values, applied.keys, applied.values, strict=True):
        torch.testing.assert_close(k, ak, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(v, av, atol=1e-4, rtol=1e-4)


def test_folding_gives_the_trained_maps_as_a_plain_adapter() -> None:
    adapter = _adapter()
    param = LowRankResidual(adapter, rank=4)
    with torch.no_grad():
        for p in param.parameters():
            p.add_(0.1 * torch.randn_like(p))
    doc, src = _doc(adapter)
    keys, _ = param.context_kv(doc)
    folded = param.fold("distilled", "v", {}, {"x": 1})
    assert folded.manifest.method == "distilled" and folded.manifest.sender_layers == adapter.manifest.sender_layers
    applied = folded.apply(_sender_kv(12), src, torch.arange(12), dtype=torch.float32)
    torch.testing.assert_close(applied.keys[1], keys[1].detach(), atol=1e-4, rtol=1e-4)
    assert not torch.equal(folded.maps[0].k_weight, adapter.maps[0].k_weight)
    assert param.penalty() > 0


def test_native_rows_stay_native_and_only_mapped_rows_move() -> None:
    adapter = _adapter()
    doc, _ = _doc(adapter)
    native = tuple(torch.full_like(k, 7.0) for k in doc.native_k)
    doc = dataclasses.replace(doc, native_k=native, native_v=native)
    keys, values = LowRankResidual(adapter, rank=2).context_kv(doc)
    assert torch.equal(keys[0][:, 0], native[0][:, 0]) and torch.equal(values[1][:, 0], native[1][:, 0])
    assert not torch.equal(keys[0][:, 1], native[0][:, 1])


def test_kl_loss_is_zero_on_the_target_and_positive_elsewhere() -> None:
    logits = torch.randn(3, 7)
    target = torch.log_softmax(logits, -1)
    assert float(kl_loss(logits, target)) < 1e-6
    assert float(kl_loss(torch.zeros(3, 7), target)) > 0.01


def test_split_holds_out_the_last_documents_and_always_trains_on_one() -> None:
    assert (list(split_docs(10, 3)[0]), list(split_docs(10, 3)[1])) == (list(range(7)), [7, 8, 9])
    assert list(split_docs(2, 3)[0]) == [0] and list(split_docs(1, 3)[1]) == []


def test_gates_scale_each_heads_mapped_keys_and_values_and_fold_into_the_map() -> None:
    receiver = Side("r", "fp-r", 2, 2, 8, (1e4, 1e6))  # two KV heads, to tell the heads apart
    g = torch.Generator().manual_seed(0)
    f, o = 2 * SENDER.num_kv_heads * SENDER.head_dim, receiver.num_kv_heads * receiver.head_dim
    maps = [LayerMap(*(torch.randn(*s, generator=g) for s in ((f, o), (o,), (f, o), (o,)))) for _ in range(2)]
    adapter = Adapter(Manifest("kv-ridge", "t", SENDER, receiver, ((0, 1), (1, 2))), maps)
    src = torch.arange(12)
    x_k, x_v, at, _ = doc_features(adapter, _sender_kv(12), src)
    zeros = tuple(torch.zeros(2, 12, 8) for _ in range(2))
    doc = DistillDoc(x_k, x_v, at, zeros, zeros, torch.arange(12), torch.arange(3), slice(0, 2), torch.zeros(2, 5))
    plain = LowRankResidual(adapter, rank=2)
    gated = LowRankResidual(adapter, rank=2, gates=True)
    assert not plain.g_k.requires_grad and gated.g_k.requires_grad
    with torch.no_grad():
        gated.g_k[1, 0] = torch.log(torch.tensor(2.0))  # layer 1, head 0: keys twice as large
        gated.g_v[0, 1] = torch.log(torch.tensor(0.5))  # layer 0, head 1: values halved
    (pk, pv), (gk, gv) = plain.context_kv(doc), gated.context_kv(doc)
    torch.testing.assert_close(gk[1][0], 2 * pk[1][0])  # RoPE is linear: the scale survives it
    torch.testing.assert_close(gk[1][1], pk[1][1])
    torch.testing.assert_close(gv[0][1], 0.5 * pv[0][1])
    torch.testing.assert_close(gv[0][0], pv[0][0])
    folded = gated.fold("distilled", "v", {}, {})
    applied = folded.apply(_sender_kv(12), src, torch.arange(12), dtype=torch.float32)
    torch.testing.assert_close(applied.keys[1], gk[1].detach(), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(applied.values[0], gv[0].detach(), atol=1e-4, rtol=1e-4)
