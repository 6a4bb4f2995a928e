"""The embedded engine on the three real zoo models: exact KV export and import, tokenization,
spec extraction, generation. Sizes are small, but Gemma3's prompts pass its 512-token window."""

import asyncio
import itertools
import threading

import pytest
import torch

from engines.base import Completion, SamplingParams, TokenDelta
from engines.errors import BadPrompt, KVMismatch, PromptTooLong
from engines.local import LocalEngine
from engines.selfcheck import TOLERANCE, check_engine
from heterofold.corpus import stdlib_text
from heterofold.errors import KVChecksumError
from heterofold.kv import KVCache

pytestmark = pytest.mark.models


def run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(coro)


def text_ids(engine: LocalEngine, n: int) -> list[int]:
    ids = list(engine.encode(stdlib_text(8 * n)).ids)
    assert len(ids) >= n
    return ids[:n]


def test_imported_cache_reproduces_full_forward_and_generation(engine: LocalEngine) -> None:
    r = run(check_engine(engine, prefix_tokens=560, suffix_tokens=40, generate=12))
    assert r.max_abs_logit_diff <= TOLERANCE, r
    assert r.generation_equal, r


def test_exported_kv_has_the_canonical_shape(engine: LocalEngine) -> None:
    spec = engine.spec
    kv, timings = run(engine.prefill(text_ids(engine, 600)))
    assert kv.fingerprint == spec.fingerprint and kv.num_layers == spec.num_layers
    assert timings.prompt_tokens == 600 and timings.prefill_ms > 0
    for layer, k in zip(spec.layers, kv.keys, strict=True):
        held = 600 if layer.window == 0 else layer.window - 1
        assert k.shape == (spec.num_kv_heads, held, spec.head_dim)


def test_turn_export_equals_prefill_of_prompt_and_reply(engine: LocalEngine) -> None:
    ids = text_ids(engine, 80)
    done = run(engine.complete(ids, SamplingParams(max_tokens=6), export="turn"))
    assert done.kv is not None and done.kv.token_ids.tolist() == ids + list(done.token_ids)
    ref, _ = run(engine.prefill(ids + list(done.token_ids)))
    for a, b in zip(done.kv.keys + done.kv.values, ref.keys + ref.values, strict=True):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


def test_offsets_point_at_each_tokens_text(engine: LocalEngine) -> None:
    text = "Caches make prefill cheap: reuse 4096 tokens, naïvely? Non!"
    enc = engine.encode(text)
    assert len(enc.ids) == len(enc.offsets)
    special = 1 if engine.spec.special.add_bos else 0
    assert enc.offsets[:special] == ((0, 0),) * special
    spans = enc.offsets[special:]
    assert spans[0][0] == 0 and spans[-1][1] == len(text)
    assert all(a[1] <= b[0] + 1 for a, b in itertools.pairwise(spans))  # ordered, at most 1 overlap
    assert engine.decode(enc.ids[special:]) == text


def test_spec_is_read_from_the_model_config(load_engine) -> None:  # type: ignore[no-untyped-def]
    gemma = load_engine("gemma3-270m").spec
    assert gemma.full_attention_layers == (5, 11, 17)
    assert {layer.rope_theta for layer in gemma.layers if layer.attention == "sliding"} == {1e4}
    assert {layer.rope_theta for layer in gemma.layers if layer.attention == "full"} == {1e6}
    assert gemma.special.add_bos and gemma.special.bos == "<bos>" and gemma.template == "plain"
    smol = load_engine("smollm2-135m-instruct").spec
    assert (smol.num_layers, smol.num_heads, smol.num_kv_heads, smol.head_dim) == (30, 9, 3, 64)
    assert not smol.special.add_bos and "<|im_end|>" in smol.special.eos
    assert {layer.rope_theta for layer in smol.layers} == {1e5}
    qwen = load_engine("qwen2.5-coder-0.5b-instruct").spec
    assert (qwen.num_layers, qwen.num_kv_heads, qwen.vocab_size) == (24, 2, 151936)
    assert {layer.rope_theta for layer in qwen.layers} == {1e6}
    assert len({gemma.fingerprint, smol.fingerprint, qwen.fingerprint}) == 3


def test_corrupted_payload_is_refused(load_engine) -> None:  # type: ignore[no-untyped-def]
    engine = load_engine("smollm2-135m-instruct")
    kv, _ = run(engine.prefill(text_ids(engine, 40)))
    blob = bytearray(kv.to_bytes())
    blob[len(blob) // 2] ^= 0xFF
    with pytest.raises(KVChecksumError):
        KVCache.from_bytes(bytes(blob))


def test_kv_from_another_model_or_prompt_is_refused(load_engine) -> None:  # type: ignore[no-untyped-def]
    smol, qwen = load_engine("smollm2-135m-instruct"), load_engine("qwen2.5-coder-0.5b-instruct")
    ids = text_ids(smol, 30)
    kv, _ = run(smol.prefill(ids))
    with pytest.raises(KVMismatch):
        run(qwen.score(ids, past=kv))
    with pytest.raises(KVMismatch):
        run(smol.score([ids[0] + 1, *ids[1:]], past=kv))


def test_prompt_longer_than_context_is_refused_before_any_work(load_engine) -> None:  # type: ignore[no-untyped-def]
    engine = load_engine("smollm2-135m-instruct")
    too_long = [1] * engine.spec.max_positions
    with pytest.raises(PromptTooLong):
        run(engine.complete(too_long, SamplingParams(max_tokens=1)))
    with pytest.raises(PromptTooLong):
        run(engine.prefill([*too_long, 1]))
    with pytest.raises(BadPrompt):
        SamplingParams(max_tokens=0)


def test_stream_deltas_add_up_and_stop_sequences_cut(load_engine) -> None:  # type: ignore[no-untyped-def]
    engine = load_engine("smollm2-135m-instruct")
    ids = engine.encode(engine.render([{"role": "user", "content": "Count from 1 to 20, comma separated."}])).ids

    async def collect(params: SamplingParams) -> tuple[str, Completion]:
        parts = []
        async for event in engine.stream(ids, params):
            if isinstance(event, TokenDelta):
                parts.append(event.text)
            else:
                return "".join(parts), event
        raise AssertionError("no completion")

    streamed, done = run(collect(SamplingParams(max_tokens=40)))
    assert streamed == done.text and "5" in done.text
    cut = done.text[done.text.index("5") :][:3]  # a stop sequence we know the model produces
    streamed, stopped = run(collect(SamplingParams(max_tokens=40, stop=(cut,))))
    assert stopped.finish_reason == "stop" and cut not in stopped.text and streamed == stopped.text
    assert done.text.startswith(stopped.text)
    _, short = run(collect(SamplingParams(max_tokens=3)))
    assert short.finish_reason == "length" and short.timings.completion_tokens == 3


def test_sampling_is_reproducible_with_a_seed(load_engine) -> None:  # type: ignore[no-untyped-def]
    engine = load_engine("gemma3-270m")
    ids = engine.encode(engine.render([{"role": "user", "content": "Name a colour."}])).ids
    p = SamplingParams(max_tokens=12, temperature=1.0, top_p=0.9, seed=7)
    a, b = run(engine.complete(ids, p)), run(engine.complete(ids, p))
    assert a.token_ids == b.token_ids
    greedy = run(engine.complete(ids, SamplingParams(max_tokens=12)))
    others = {
        run(engine.complete(ids, SamplingParams(max_tokens=12, temperature=1.5, seed=s))).token_ids for s in range(4)
    }
    assert len(others | {greedy.token_ids}) > 1


def test_event_loop_stays_responsive_during_inference(load_engine) -> None:  # type: ignore[no-untyped-def]
    engine = load_engine("qwen2.5-coder-0.5b-instruct")
    ids = text_ids(engine, 400)
    started, released = threading.Event(), threading.Event()
    waited: list[bool] = []

    def hold(module, args):  # type: ignore[no-untyped-def]
        # the forward pass waits inside the worker until the event loop proves it runs meanwhile
        started.set()
        waited.append(released.wait(timeout=30))

    async def main() -> int:
        job = asyncio.ensure_future(engine.prefill(ids))
        ticks = 0
        while not started.is_set():
            await asyncio.sleep(0.001)
        for _ in range(5):  # the loop keeps turning while the model is mid-forward
            await asyncio.sleep(0)
            ticks += 1
        assert not job.done()
        released.set()
        await job
        return ticks

    handle = engine.model.model.layers[0].register_forward_pre_hook(hold)
    try:
        ticks = run(main())
    finally:
        handle.remove()
    assert ticks == 5 and waited == [True]  # released by the loop, not by the timeout
