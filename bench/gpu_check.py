"""The GPU check's measurement (bench/gpu_check.sh starts the servers): a cross-family hop between two
running SGLang engines through our HiCache storage backend.

1. A KV Ridge adapter sender -> receiver is fitted from both engines' KV as SGLang backed it up
   (page-aligned exports read from the page store), on generated texts.
2. On a fresh long context: the sender prefills it (its pages are written through to the store).
3. Native: the receiver answers the context with a cold cache; TTFT.
4. Transfer: the sender's KV is read back, aligned, mapped and cut before the last ``--tail`` tokens
   (SGLang recomputes that suffix natively), written under the receiver's page keys, and the receiver
   answers the same prompt (again after /flush_cache); TTFT and ``cached_tokens_details.storage``.

Prints one JSON object. Quality is not measured here (bench/transfer_bench.py does that on CPU).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
from pathlib import Path

import torch

from engines.base import SamplingParams
from engines.selectors import HopText
from engines.sglang import SGLangEngine
from engines.transfer import transfer
from heterofold.adapter import Side
from heterofold.align import Section, align_tokens
from heterofold.corpus import stdlib_text
from heterofold.fit import FitPair, fit_adapter, stack_pairs
from store.connection import connect
from store.hicache.page_keys import PageKeys
from store.hicache.page_store import PageStore


async def engine(url: str, name: str, model_dir: str, redis_url: str) -> SGLangEngine:
    info = await SGLangEngine.probe(url)
    pages = PageStore(connect(redis_url, 1.0, 5.0), PageKeys("hf", name, 0, info.tp_size))
    return await SGLangEngine.connect(url, name=name, model_dir=Path(model_dir), template="chatml", pages=pages,
                                      export_wait_s=10.0)  # fmt: skip


async def flush(e: SGLangEngine) -> None:
    await e.client.post("/flush_cache")  # drop the device and host caches: only storage can serve


async def pair(sender: SGLangEngine, receiver: SGLangEngine, text: str) -> FitPair:
    s_enc = sender.encode(text, add_special_tokens=False)
    r_enc = receiver.encode(text, add_special_tokens=False)
    s_kv, _ = await sender.prefill(s_enc.ids)
    r_kv, _ = await receiver.prefill(r_enc.ids)
    src = align_tokens(s_enc.offsets, r_enc.offsets[: r_kv.num_tokens], [Section(0, 0, len(text))])
    src[src >= s_kv.num_tokens] = -1
    return FitPair(s_kv, r_kv, src)


async def main(args: argparse.Namespace) -> dict[str, object]:
    sender = await engine(args.sender_url, args.sender_name, args.sender_dir, args.redis_url)
    receiver = await engine(args.receiver_url, args.receiver_name, args.receiver_dir, args.redis_url)
    texts = [stdlib_text(args.fit_chars, start=i * 50) for i in range(args.fit_docs)]
    pairs = [await pair(sender, receiver, t) for t in texts]
    s_side, r_side = Side.of(sender.spec), Side.of(receiver.spec)
    eligible = list(range(sender.spec.num_layers))
    adapter = fit_adapter(stack_pairs(pairs, s_side, r_side, eligible), s_side, r_side, eligible,
                          method="kv-ridge", version="gpu-check")  # fmt: skip

    context = stdlib_text(args.context_chars, start=random.Random().randrange(600, 1200))  # unseen by the fit
    question = "\n\nQuestion: in one sentence, what is the text above about?\nAnswer:"
    s_enc = sender.encode(context, add_special_tokens=False)
    sender_kv, _ = await sender.prefill(s_enc.ids)
    r_enc = receiver.encode(context + question, add_special_tokens=False)
    params = SamplingParams(max_tokens=16)

    await flush(receiver)
    native = await receiver.complete(r_enc.ids, params)
    await flush(receiver)
    await flush(sender)
    sender_kv = await sender.export(s_enc.ids) or sender_kv  # as the gateway would: from storage
    tail = args.tail
    hop = HopText(sender_kv, context, s_enc.offsets[: sender_kv.num_tokens], context + question, r_enc.ids,
                  r_enc.offsets, [Section(0, 0, len(context))], question)  # fmt: skip
    result = await transfer(adapter, hop, receiver, tail=tail)
    moved = await receiver.complete(r_enc.ids, params, past=result.kv)
    await sender.aclose()
    await receiver.aclose()
    return {
        "sender": sender.spec.name, "receiver": receiver.spec.name, "context_tokens": len(r_enc.ids),
        "page_size": receiver.info.page_size, "fit_tokens": sum(p.receiver.num_tokens for p in pairs),
        "ttft_native_ms": round(native.timings.ttft_ms, 1), "ttft_transfer_ms": round(moved.timings.ttft_ms, 1),
        "transfer_ms": round(result.total_ms, 1), "imported_tokens": result.kv.num_tokens,
        "storage_hit_tokens": moved.timings.storage_tokens, "cached_tokens": moved.timings.cached_tokens,
        "speedup": round(native.timings.ttft_ms / max(moved.timings.ttft_ms + result.total_ms, 1e-3), 2),
        "native_text": native.text, "transfer_text": moved.text,
    }  # fmt: skip


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sender-url", default="http://127.0.0.1:30001")
    p.add_argument("--receiver-url", default="http://127.0.0.1:30002")
    p.add_argument("--sender-name", default="qwen2.5-0.5b")
    p.add_argument("--receiver-name", default="smollm2-360m")
    p.add_argument("--sender-dir", required=True)
    p.add_argument("--receiver-dir", required=True)
    p.add_argument("--redis-url", default="redis://127.0.0.1:6390/0")
    p.add_argument("--context-chars", type=int, default=24000)
    p.add_argument("--fit-docs", type=int, default=8)
    p.add_argument("--fit-chars", type=int, default=8000)
    p.add_argument("--tail", type=int, default=64)
    torch.set_grad_enabled(False)
    print(json.dumps(asyncio.run(main(p.parse_args())), indent=2))
