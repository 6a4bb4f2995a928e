"""The transfer path on the real zoo models: RoPE as the models apply it, selective recompute,
identity transfer, and fitting a small adapter end to end."""

import asyncio
from pathlib import Path
from typing import Any

import pytest
import torch

from engines.attention import SDPA
from engines.local import LocalEngine
from engines.queries import heads_first
from engines.selectors import HopText
from engines.transfer import transfer
from harness.fit_on_engines import fit_direction
from heterofold.adapter import Adapter, Side
from heterofold.align import shared_sections
from heterofold.corpus import stdlib_text
from heterofold.errors import FingerprintMismatch
from heterofold.kv import KVCache
from heterofold.rope import strip_rope

pytestmark = pytest.mark.models


def run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(coro)


def test_stripping_rope_recovers_the_models_own_unrotated_keys(engine: LocalEngine) -> None:
    ids = list(engine.encode(stdlib_text(3000)).ids)[:300]
    seen: list[torch.Tensor] = []
    for layer in (0, engine.spec.full_attention_layers[-1]):
        attn = engine.model.model.layers[layer].self_attn
        module = getattr(attn, "k_norm", None) or attn.k_proj  # the last step before RoPE
        hook = module.register_forward_hook(lambda m, i, o: seen.append(o.detach()))
        try:
            kv, _ = run(engine.prefill(ids, dense=True))
        finally:
            hook.remove()
        raw = heads_first(seen.pop(), engine.spec.num_kv_heads, engine.spec.head_dim)
        stripped = strip_rope(kv.keys[layer], kv.positions, engine.spec.layers[layer].rope_theta)
        torch.testing.assert_close(stripped, raw, atol=2e-4, rtol=1e-4)


def test_recompute_of_every_token_over_noise_is_native(engine: LocalEngine) -> None:
    ids = list(engine.encode(stdlib_text(5000)).ids)[:560]  # past Gemma3's window
    dense, _ = run(engine.prefill(ids, dense=True))
    native, _ = run(engine.prefill(ids))
    g = torch.Generator().manual_seed(0)
    noise = tuple(t + torch.randn(t.shape, generator=g) for t in dense.keys)
    noisy = KVCache(dense.fingerprint, dense.token_ids, dense.positions, noise, dense.values, dense.windows)
    before = [t.clone() for t in noise]
    for positions in (range(len(ids)), range(0, len(ids), 9)):
        start = noisy if len(positions) == len(ids) else dense  # a subset is exact on native KV only
        out = run(engine.recompute(start, list(positions)))
        for a, b in zip(out.keys + out.values, native.keys + native.values, strict=True):
            torch.testing.assert_close(a, b, atol=5e-4, rtol=1e-3)
    assert all(torch.equal(a, b) for a, b in zip(noise, before, strict=True))  # the given value is not written


def _counting(kernel, calls: list[int]):  # type: ignore[no-untyped-def]
    def wrapper(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(args[1].shape[2])  # query rows
        return kernel(*args, **kwargs)

    return wrapper


def test_blocked_sliding_attention_equals_the_masked_pass(load_engine, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The recompute pass's sliding layers attend block by block over the keys their mask allows;
    the result must equal one masked pass over all keys, for clustered and scattered choices."""
    import contextlib

    import engines.recompute as rc

    engine = load_engine("gemma3-270m")
    window = max(engine.spec.windows)
    ids = list(engine.encode(stdlib_text(12000)).ids)[: 2 * window + 300]
    dense, _ = run(engine.prefill(ids, dense=True))
    g = torch.Generator().manual_seed(3)
    noisy = KVCache(
        dense.fingerprint,
        dense.token_ids,
        dense.positions,
        tuple(t + 0.5 * torch.randn(t.shape, generator=g) for t in dense.keys),
        dense.values,
        dense.windows,
    )
    T = len(ids)
    clustered = [*range(40, 70), *range(window + 10, window + 30), *range(T - 50, T - 35), T - 1]
    scattered = sorted(torch.randperm(T, generator=g)[:60].tolist())
    for positions in (clustered, scattered):
        chosen = torch.tensor(positions)
        blocks = rc.sliding_blocks(rc.recompute_allowed(T, chosen, window), chosen, window)
        assert len(blocks) > 1 and all(len(cols) < T for _, cols in blocks)
        calls: list[int] = []
        with monkeypatch.context() as m:
            m.setattr(rc, "sdpa", _counting(rc.sdpa, calls))
            blocked = run(engine.recompute(noisy, positions))
        sliding = sum(1 for w in engine.spec.windows if w)
        assert len(calls) == engine.spec.num_layers - sliding + sliding * len(blocks)  # the blocked kernel ran
        with monkeypatch.context() as m:
            m.setattr(rc, "_blocked", lambda model, blocks: contextlib.nullcontext())
            plain = run(engine.recompute(noisy, positions))
        for a, b in zip(blocked.keys + blocked.values, plain.keys + plain.values, strict=True):
            torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
        assert engine.model.config._attn_implementation == SDPA  # restored after the pass


def test_identity_transfer_through_templates_reproduces_native_logits(load_engine) -> None:  # type: ignore[no-untyped-def]
    engine = load_engine("smollm2-135m-instruct")
    context = stdlib_text(1500)
    s_text = engine.render([{"role": "user", "content": context}])
    r_text = engine.render([{"role": "user", "content": context + "\n\nQuestion: what does it do?"}])
    s_enc, r_enc = engine.encode(s_text), engine.encode(r_text)
    s_kv, _ = run(engine.prefill(s_enc.ids, dense=True))
    sections = shared_sections(s_text, r_text, [context])
    identity = Adapter.identity(Side.of(engine.spec))
    hop = HopText(s_kv, s_text, s_enc.offsets, r_text, r_enc.ids, r_enc.offsets, sections, "what does it do?")
    tr = run(transfer(identity, hop, engine))
    assert tr.recomputed < 40 and tr.mapped > 300
    got = run(engine.score(r_enc.ids, past=tr.kv))
    want = run(engine.score(r_enc.ids))[tr.prefix :]
    assert float((got - want).abs().max()) < 1e-3


def test_fit_save_load_apply_round_trip(load_engine, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    sender, receiver = load_engine("smollm2-135m-instruct"), load_engine("gemma3-270m")
    texts = [stdlib_text(1200, start=i * 7) for i in range(5)]
    adapter = run(fit_direction(sender, receiver, method="kv-ridge", texts=texts, seed=0, version="t", max_tokens=200))
    m = adapter.manifest
    assert m.sender.fingerprint == sender.spec.fingerprint and len(m.sender_layers) == receiver.spec.num_layers
    assert 0.0 < m.metrics["mean_r2_k"] < 1.0 and m.fit["tokens"] > 500
    adapter.save(tmp_path / "a")
    fps = {"sender_fingerprint": sender.spec.fingerprint, "receiver_fingerprint": receiver.spec.fingerprint}
    loaded = Adapter.load(tmp_path / "a", **fps)
    text = stdlib_text(800, start=50)
    s_enc, r_enc = sender.encode(text), receiver.encode(text)
    s_kv, _ = run(sender.prefill(s_enc.ids))
    from heterofold.align import Section

    sections = [Section(0, 0, len(text))]
    hop = HopText(s_kv, text, s_enc.offsets, text, r_enc.ids, r_enc.offsets, sections, "")
    tr = run(transfer(loaded, hop, receiver))
    assert tr.kv.fingerprint == receiver.spec.fingerprint and tr.kv.windows == receiver.spec.windows
    assert tr.recomputed == 1  # only Gemma's BOS has no sender token
    with pytest.raises(FingerprintMismatch):
        Adapter.load(tmp_path / "a", **{**fps, "receiver_fingerprint": sender.spec.fingerprint})
    again = run(fit_direction(sender, receiver, method="kv-ridge", texts=texts, seed=0, version="t", max_tokens=200))
    assert all(torch.equal(a.k_weight, b.k_weight) for a, b in zip(adapter.maps, again.maps, strict=True))
    # The same fit reading the receiver's own token features too (64 components): closer to the
    # receiver's KV on held-out text, most on layer 0, whose values are a function of the token
    # alone (measured: 0.38 against 0.34 on these 5 short texts), and the hop passes the
    # receiver's embeddings to it.
    tok = run(fit_direction(sender, receiver, method="kv-ridge", texts=texts, seed=0, version="t", max_tokens=200,
                            token_rank=64))  # fmt: skip
    assert (tok.manifest.token_rank, tok.manifest.token_lags) == (64, 2)
    assert tok.manifest.metrics["mean_r2_v"] > m.metrics["mean_r2_v"]
    assert tok.manifest.metrics["held_out_r2_v"][0] > m.metrics["held_out_r2_v"][0] + 0.03
    tr_tok = run(transfer(tok, hop, receiver))
    assert tr_tok.recomputed == 1 and not torch.equal(tr_tok.kv.values[0], tr.kv.values[0])


def test_a_fit_while_the_receiver_serves_chat_equals_a_fit_on_an_idle_receiver(load_engine) -> None:  # type: ignore[no-untyped-def]
    """Calibration reads the receiver's queries: chat requests streamed through the same engine
    during the fit must neither reach the fit's captured queries nor change what it fits."""
    from engines.base import SamplingParams

    sender, receiver = load_engine("smollm2-135m-instruct"), load_engine("gemma3-270m")
    texts = [stdlib_text(900, start=i * 11) for i in range(3)]

    def fit() -> Any:
        return fit_direction(sender, receiver, method="heterofold", texts=texts, seed=0, version="t", max_tokens=160)

    idle = run(fit())
    chat = list(receiver.encode(receiver.render([{"role": "user", "content": "Name three colours."}])).ids)

    async def busy() -> tuple[Any, int]:
        task = asyncio.ensure_future(fit())
        served = 0
        while not task.done():
            async for _ in receiver.stream(chat, SamplingParams(max_tokens=4)):
                pass
            served += 1
        return await task, served

    loaded, served = run(busy())
    assert served >= 3  # requests really ran on the receiver while the fit did
    assert loaded.manifest.metrics == idle.manifest.metrics
    for a, b in zip(idle.maps, loaded.maps, strict=True):
        torch.testing.assert_close(a.k_weight, b.k_weight, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(a.v_weight, b.v_weight, atol=1e-5, rtol=1e-5)


def test_bench_transfer_times_every_path_from_one_run(load_engine) -> None:  # type: ignore[no-untyped-def]
    from bench.transfer_bench import bench_transfer

    engine = load_engine("smollm2-135m-instruct")
    identity = Adapter.identity(Side.of(engine.spec))
    result = run(
        bench_transfer(engine, engine, context=512, heterofold=identity, kv_ridge=identity, budget=0.05, repeats=1)
    )
    hf, ridge, both = result["heterofold"], result["kv_ridge"], result["kv_ridge_recompute"]
    assert hf["tokens_recomputed"] == both["tokens_recomputed"] > ridge["tokens_recomputed"]
    for path in (hf, ridge, both):
        assert path["ttft_ms"] > 0
        assert path["speedup_vs_native"] == pytest.approx(result["native_ttft_ms"] / path["ttft_ms"], rel=0.01)
    assert result["heterofold_speedup_vs_kv_ridge_recompute"] == pytest.approx(
        both["ttft_ms"] / hf["ttft_ms"], rel=0.01
    )
    assert result["memory_floor_ms"] > 0 and result["receiver_bytes_written"] > 0
