"""Sender features: fitting (ridge, calibration, distillation) and applying an adapter read the same
ones, for the same layers in the same order, up to the apply path's matmul dtype."""

import pytest
import torch

from heterofold.adapter import Adapter, LayerMap, Manifest, Side
from heterofold.distill import doc_features
from heterofold.errors import AdapterError
from heterofold.features import SenderFeatures
from heterofold.fit import FitPair, _calib_doc, stack_pairs
from heterofold.kv import KVCache
from heterofold.rope import apply_rope

SENDER = Side("s", "fp-s", 4, 2, 8, (1e4, 1e6, 5e5, 1e4))
RECEIVER = Side("r", "fp-r", 3, 1, 16, (1e4, 1e6, 1e4))
LAYERS = ((0, 1), (1, 3), (3, 2))  # consecutive, a gap, and out of order
SRC = torch.tensor([-1, 4, 5, 0, 1, -1, 2, 7, 8, 9, 11])  # receiver token -> sender token


def _kv(side: Side, fp: str, T: int, positions: torch.Tensor, seed: int) -> KVCache:
    g = torch.Generator().manual_seed(seed)
    shape = (side.num_kv_heads, T, side.head_dim)
    keys = tuple(torch.randn(*shape, generator=g) for _ in range(side.num_layers))
    values = tuple(torch.randn(*shape, generator=g) for _ in range(side.num_layers))
    return KVCache(fp, torch.arange(T), positions, keys, values, (0,) * side.num_layers)


def _adapter() -> Adapter:
    g = torch.Generator().manual_seed(2)
    f, o = 2 * SENDER.num_kv_heads * SENDER.head_dim, RECEIVER.num_kv_heads * RECEIVER.head_dim
    maps = [LayerMap(*(torch.randn(*shape, generator=g) for shape in ((f, o), (o,), (f, o), (o,)))) for _ in LAYERS]
    return Adapter(Manifest("kv-ridge", "t", SENDER, RECEIVER, LAYERS), maps)


def _pair() -> FitPair:
    sender = _kv(SENDER, "fp-s", 12, torch.arange(12) * 3 + 7, seed=0)  # sparse RoPE positions
    T_r = len(SRC)
    receiver = _kv(RECEIVER, "fp-r", T_r, torch.arange(T_r), seed=1)
    queries = tuple(torch.randn(2, T_r, RECEIVER.head_dim) for _ in range(RECEIVER.num_layers))
    return FitPair(sender, receiver, SRC, queries)


def test_fit_and_apply_read_the_same_sender_features() -> None:
    adapter, pair = _adapter(), _pair()
    data = stack_pairs([pair], SENDER, RECEIVER, range(SENDER.num_layers))
    applied = adapter.features(pair.sender, SRC, torch.float32)
    in_bf16 = adapter.features(pair.sender, SRC, torch.bfloat16)
    distilled_k, distilled_v, at, _ = doc_features(adapter, pair.sender, SRC)
    assert torch.equal(applied.at, at) and torch.equal(at, (SRC >= 0).nonzero().squeeze(1))
    for layer, layers in enumerate(LAYERS):
        fit_k, fit_v = data.features(layers)
        calib = _calib_doc(pair, layer, layers, SENDER)
        for x_k, x_v in (applied.get(layers), (calib.x_k, calib.x_v), (distilled_k[layer], distilled_v[layer])):
            assert torch.equal(x_k, fit_k) and torch.equal(x_v, fit_v)
        k16, v16 = in_bf16.get(layers)
        assert k16.dtype == torch.bfloat16
        assert torch.equal(k16, fit_k.to(torch.bfloat16)) and torch.equal(v16, fit_v.to(torch.bfloat16))


def test_apply_maps_the_features_the_fit_saw() -> None:
    adapter, pair = _adapter(), _pair()
    data = stack_pairs([pair], SENDER, RECEIVER, range(SENDER.num_layers))
    out = adapter.apply(pair.sender, SRC, pair.receiver.token_ids, dtype=torch.float32)
    at = (SRC >= 0).nonzero().squeeze(1)
    H, D = RECEIVER.num_kv_heads, RECEIVER.head_dim
    for layer, (layers, mp) in enumerate(zip(LAYERS, adapter.maps, strict=True)):
        x_k, x_v = data.features(layers)
        k = (x_k @ mp.k_weight + mp.k_bias).reshape(-1, H, D).transpose(0, 1)  # (N, H*D) -> (H, N, D)
        v = (x_v @ mp.v_weight + mp.v_bias).reshape(-1, H, D).transpose(0, 1)
        torch.testing.assert_close(out.keys[layer][:, at], apply_rope(k, at, RECEIVER.rope_thetas[layer]))
        torch.testing.assert_close(out.values[layer][:, at], v)


def test_features_refuse_a_sliding_sender_layer() -> None:
    kv = _pair().sender
    keys, values = (*kv.keys[:3], kv.keys[3][:, -4:]), (*kv.values[:3], kv.values[3][:, -4:])
    sliding = KVCache(kv.fingerprint, kv.token_ids, kv.positions, keys, values, (0, 0, 0, 5))  # last 4 tokens
    with pytest.raises(AdapterError, match="sliding window"):
        SenderFeatures(sliding, SRC, SENDER.rope_thetas, (0, 3))
