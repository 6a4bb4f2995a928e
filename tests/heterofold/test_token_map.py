"""Maps that also read the receiver's own token features (``TokenMap``): fitting finds what the
sender's cache does not carry, applying reads the same features as fitting and distillation, the
artifact keeps them, and an adapter that needs the embeddings refuses to map without them."""

import dataclasses
from pathlib import Path

import pytest
import torch

from heterofold.adapter import Adapter, LayerMap, Manifest, Side, TokenMap
from heterofold.distill import DistillDoc, LowRankResidual, doc_features
from heterofold.errors import AdapterError
from heterofold.features import token_features
from heterofold.fit import FitPair, fit_adapter, stack_pairs
from heterofold.kv import KVCache
from heterofold.rope import apply_rope

SENDER = Side("s", "fp-s", 2, 1, 8, (1e4, 1e4))
RECEIVER = Side("r", "fp-r", 2, 1, 8, (1e4, 1e6))
VOCAB, DIM = 50, 6


def test_token_features_are_each_token_and_the_one_before_normalised() -> None:
    table = torch.randn(VOCAB, DIM) * 5
    ids = torch.tensor([3, 7, 7, 1])
    feats = token_features(table, ids, 2)
    assert feats.shape == (4, 2 * DIM)
    now, before = feats[:, :DIM], feats[:, DIM:]
    assert torch.allclose(now.pow(2).mean(-1), torch.ones(4), atol=1e-4)  # RMS-normalised rows
    assert torch.equal(before[0], torch.zeros(DIM))  # nothing before the first token
    assert torch.equal(before[1:], now[:-1])
    assert torch.allclose(now[0] * table[3].pow(2).mean().sqrt(), table[3], atol=1e-4)
    with pytest.raises(AdapterError):
        token_features(table, ids, 0)


def _pairs(table: torch.Tensor, proj_k: torch.Tensor, proj_v: torch.Tensor, n: int = 5, T: int = 60) -> list[FitPair]:
    """Receiver KV that is a linear function of its own token features (content the sender's cache,
    here noise, does not hold), keys with RoPE applied at their positions."""
    g = torch.Generator().manual_seed(3)
    pairs = []
    for _ in range(n):
        ids = torch.randint(0, VOCAB, (T,), generator=g)
        feats = token_features(table, ids, 2)
        shape = (SENDER.num_kv_heads, T, SENDER.head_dim)
        s_keys = tuple(torch.randn(*shape, generator=g) for _ in range(SENDER.num_layers))
        s_vals = tuple(torch.randn(*shape, generator=g) for _ in range(SENDER.num_layers))
        sender = KVCache("fp-s", ids, torch.arange(T), s_keys, s_vals, (0, 0))
        k = (feats @ proj_k).reshape(T, 1, -1).transpose(0, 1)  # (H, T, D)
        v = (feats @ proj_v).reshape(T, 1, -1).transpose(0, 1)
        r_keys = tuple(apply_rope(k, torch.arange(T), th) for th in RECEIVER.rope_thetas)
        receiver = KVCache("fp-r", ids, torch.arange(T), r_keys, (v, v), (0, 0))
        pairs.append(FitPair(sender, receiver, torch.arange(T)))
    return pairs


def _fitted(rank: int) -> tuple[Adapter, torch.Tensor, list[FitPair]]:
    g = torch.Generator().manual_seed(0)
    table = torch.randn(VOCAB, DIM, generator=g)
    proj_k, proj_v = torch.randn(2 * DIM, 8, generator=g), torch.randn(2 * DIM, 8, generator=g)
    pairs = _pairs(table, proj_k, proj_v)
    data = stack_pairs(pairs, SENDER, RECEIVER, [0, 1], embeddings=table if rank else None)
    adapter = fit_adapter(data, SENDER, RECEIVER, [0, 1], method="kv-ridge", version="t", width=1, token_rank=rank)
    return adapter, table, pairs


def test_a_token_map_finds_what_the_sender_cache_lacks_and_apply_reproduces_it() -> None:
    plain, _, _ = _fitted(0)
    tok, table, pairs = _fitted(2 * DIM)
    assert plain.manifest.metrics["mean_r2_k"] < 0.2  # the sender's noise explains nothing
    assert tok.manifest.metrics["mean_r2_k"] > 0.99 and tok.manifest.metrics["mean_r2_v"] > 0.99
    assert (tok.manifest.token_lags, tok.manifest.token_rank) == (2, 2 * DIM)
    p = pairs[-1]
    out = tok.apply(p.sender, p.src, p.receiver.token_ids, dtype=torch.float32, embeddings=table)
    for layer in range(RECEIVER.num_layers):
        torch.testing.assert_close(out.keys[layer], p.receiver.keys[layer], atol=1e-2, rtol=1e-2)
        torch.testing.assert_close(out.values[layer], p.receiver.values[layer], atol=1e-2, rtol=1e-2)
    with pytest.raises(AdapterError, match="embeddings"):
        tok.apply(p.sender, p.src, p.receiver.token_ids)


def test_a_token_map_is_kept_by_the_artifact(tmp_path: Path) -> None:
    tok, table, pairs = _fitted(4)
    tok.save(tmp_path / "a")
    loaded = Adapter.load(tmp_path / "a", sender_fingerprint="fp-s", receiver_fingerprint="fp-r")
    p = pairs[0]
    a = tok.apply(p.sender, p.src, p.receiver.token_ids, dtype=torch.float32, embeddings=table)
    b = loaded.apply(p.sender, p.src, p.receiver.token_ids, dtype=torch.float32, embeddings=table)
    for x, y in zip(a.keys + a.values, b.keys + b.values, strict=True):  # same weights (memory layout aside)
        torch.testing.assert_close(x, y, atol=1e-5, rtol=1e-5)
    with pytest.raises(AdapterError, match="token map"):  # a manifest naming a token map needs its tensors
        Adapter(loaded.manifest, [LayerMap(m.k_weight, m.k_bias, m.v_weight, m.v_bias) for m in loaded.maps])
    with pytest.raises(AdapterError, match="wide"):
        loaded.apply(p.sender, p.src, p.receiver.token_ids, embeddings=torch.randn(VOCAB, DIM + 1))


def test_a_plain_adapter_ignores_embeddings_and_refuses_token_weights() -> None:
    plain, table, pairs = _fitted(0)
    p = pairs[0]
    a = plain.apply(p.sender, p.src, p.receiver.token_ids, dtype=torch.float32)
    b = plain.apply(p.sender, p.src, p.receiver.token_ids, dtype=torch.float32, embeddings=table)
    assert torch.equal(a.keys[0], b.keys[0])
    extra = [dataclasses.replace(m, k_token=torch.zeros(3, 8), v_token=torch.zeros(3, 8)) for m in plain.maps]
    with pytest.raises(AdapterError, match="k_token"):
        Adapter(plain.manifest, extra)
    with pytest.raises(AdapterError, match="kv-ridge"):
        fit_adapter(stack_pairs(pairs, SENDER, RECEIVER, [0, 1], embeddings=table), SENDER, RECEIVER, [0, 1],
                    method="heterofold", version="t", token_rank=2)  # fmt: skip


@pytest.mark.parametrize("token", [False, True])
def test_distillation_maps_a_token_adapter_as_apply_does_and_folds_it_back(token: bool) -> None:
    tok, table, pairs = _fitted(4)
    p = pairs[0]
    T = len(p.src)
    x_k, x_v, at, z = doc_features(tok, p.sender, p.src, p.receiver.token_ids, table)
    assert z is not None and z.shape == (T, 4)
    zeros = tuple(torch.zeros(1, T, 8) for _ in range(RECEIVER.num_layers))
    doc = DistillDoc(x_k, x_v, at, zeros, zeros, p.receiver.token_ids, torch.arange(3), slice(0, 2),
                     torch.zeros(2, 5), z=z)  # fmt: skip
    param = LowRankResidual(tok, rank=2, gates=True, token=token)
    assert len(param.d_k) == (RECEIVER.num_layers if token else 0)
    with torch.no_grad():
        for q in param.parameters():
            q.add_(0.05 * torch.randn_like(q))
    keys, values = param.context_kv(doc)
    folded = param.fold("distilled", "v", {}, {})
    assert folded.token is tok.token and folded.manifest.token_rank == 4
    out = folded.apply(p.sender, p.src, p.receiver.token_ids, dtype=torch.float32, embeddings=table)
    for layer in range(RECEIVER.num_layers):
        torch.testing.assert_close(out.keys[layer], keys[layer].detach(), atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(out.values[layer], values[layer].detach(), atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError, match="embeddings"):
        doc_features(tok, p.sender, p.src)
    if token:  # the token weights moved, and the folded adapter carries them
        assert tok.maps[0].k_token is not None and folded.maps[0].k_token is not None
        assert not torch.allclose(folded.maps[0].k_token, tok.maps[0].k_token * param.g_k[0].exp().repeat_interleave(8))


def test_a_token_residual_starts_at_the_fitted_map_and_needs_a_token_map() -> None:
    tok, _, _ = _fitted(4)
    param = LowRankResidual(tok, rank=2, token=True)
    for layer, mp in enumerate(tok.maps):
        assert mp.k_token is not None and mp.v_token is not None
        assert torch.equal(param.layer(layer).k_token, mp.k_token)
        assert torch.equal(param.layer(layer).v_token, mp.v_token)
    assert float(param.penalty().detach()) == 0.0
    with torch.no_grad():
        param.d_k[0].add_(1.0)
    assert float(param.penalty().detach()) > 0.0  # the token residual is penalised like the others
    k0 = tok.maps[0].k_token
    assert k0 is not None  # one unit of the residual is the token weights' RMS, not 1.0
    rms = float(k0.pow(2).mean().sqrt())
    torch.testing.assert_close(param.layer(0).k_token.detach() - k0, torch.full_like(k0, rms))
    plain, _, _ = _fitted(0)
    with pytest.raises(ValueError, match="token map"):
        LowRankResidual(plain, rank=2, token=True)


def test_token_map_shape_must_match_the_manifest() -> None:
    tok, _, _ = _fitted(4)
    assert tok.token is not None
    wrong = TokenMap(3, tok.token.mean, tok.token.proj)
    with pytest.raises(AdapterError, match="lags"):
        Adapter(tok.manifest, tok.maps, wrong)
    manifest = dataclasses.replace(tok.manifest, token_rank=0, token_lags=0)
    assert isinstance(manifest, Manifest)
    with pytest.raises(AdapterError):
        Adapter(manifest, tok.maps, tok.token)
