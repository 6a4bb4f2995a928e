"""The SGLang engine client against the HTTP stand-in (tests/sglang/standin.py, not SGLang), backed by
smollm2-135m on CPU, with the HiCache backend and page store on a real Redis; and the gateway's
confirmation of a storage hit or miss."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from engines.base import Completion, SamplingParams, Timings, TokenDelta
from engines.catalog import lookup
from engines.errors import KVMismatch
from engines.local import LocalEngine
from engines.sglang import SGLangEngine, Unsupported
from engines.zoo import Zoo
from gateway.background import Background
from gateway.engine_pool import EnginePool
from gateway.hop import Fallbacks, Hop, HopPlan, StorageImports
from gateway.metrics import Metrics
from gateway.settings import EngineSettings, TransferPolicy
from store.config import StoreConfig
from store.connection import connect
from store.hicache.page_keys import PageKeys
from store.hicache.page_store import PageStore
from store.kv_store import KVStore
from tests.sglang.standin import StandIn, serve

pytestmark = pytest.mark.models
MODEL = "smollm2-135m-instruct"
GREEDY = SamplingParams(max_tokens=6)


@pytest.fixture(scope="module")
def local(load_engine: Callable[[str], LocalEngine]) -> LocalEngine:
    return load_engine(MODEL)


@pytest.fixture(scope="module")
def model_dir(zoo: Zoo) -> Path:
    return zoo.pull(lookup(MODEL))


def prompt(local: LocalEngine, n_words: int) -> list[int]:
    """A prompt no earlier test sent, so no page of it is stored yet."""
    words = " ".join(f"w{uuid.uuid4().hex[:6]}" for _ in range(n_words))
    return list(local.encode(local.render([{"role": "user", "content": f"Repeat: {words}"}])).ids)


def run(coro: Any) -> Any:
    return asyncio.run(coro)


async def collect(engine: SGLangEngine, ids: list[int], **kw: Any) -> tuple[str, Completion]:
    text = ""
    async for event in engine.stream(ids, GREEDY, **kw):
        if isinstance(event, TokenDelta):
            text += event.text
        else:
            return text, event
    raise AssertionError("no completion")


@pytest.fixture(params=[1, 3], ids=["tp1", "tp3"], scope="module")
def served(request: pytest.FixtureRequest, local: LocalEngine, redis_url: str) -> Iterator[tuple[StandIn, str]]:
    """The stand-in at TP 1 and at TP 3 (smollm2's 3 KV heads, one per rank)."""
    standin = StandIn(local, redis_url, f"smollm2-tp{request.param}", tp_size=request.param)
    with serve(standin) as url:
        yield standin, url


def with_engine(url: str, model_dir: Path, standin: StandIn, redis_url: str,
                body: Callable[[SGLangEngine], Awaitable[None]]) -> None:  # fmt: skip
    """Connect, run ``body``, close: all on one event loop, as the client's connections need."""

    async def go() -> None:
        pages = PageStore(connect(redis_url, 1.0, 5.0), PageKeys("hf", standin.namespace, 0, standin.tp_size))
        engine = await SGLangEngine.connect(url, name=MODEL, model_dir=model_dir, template="chatml", pages=pages,
                                            fingerprint=standin.engine.spec.fingerprint)  # fmt: skip
        try:
            await body(engine)
        finally:
            await engine.aclose()

    asyncio.run(go())


def test_connect_reads_server_info_and_the_tokenizer(served: tuple[StandIn, str], model_dir: Path,
                                                     local: LocalEngine, redis_url: str) -> None:  # fmt: skip
    standin, url = served

    async def body(engine: SGLangEngine) -> None:
        assert (engine.info.page_size, engine.info.tp_size, engine.info.hicache_layout) == (16, standin.tp_size,
                                                                                            "page_first")  # fmt: skip
        assert engine.info.serves_storage and engine.spec.num_layers == 30 and engine.spec.num_kv_heads == 3
        text = local.render([{"role": "user", "content": "Héllo, wörld"}])
        assert engine.encode(text) == local.encode(text)
        assert isinstance(engine.pages, PageStore) and engine.pages.tp_size == standin.tp_size
        published = engine.pages.geometry(0)
        assert published is not None and published.heads == 3 // standin.tp_size

    with_engine(url, model_dir, standin, redis_url, body)


def test_stream_generates_the_models_tokens_and_exports_the_turn(
    served: tuple[StandIn, str], model_dir: Path, local: LocalEngine, redis_url: str
) -> None:
    standin, url = served

    async def body(engine: SGLangEngine) -> None:
        ids = prompt(local, 30)
        native = await local.complete(ids, GREEDY)
        text, done = await collect(engine, ids, export="turn")
        assert done.token_ids == native.token_ids and text == native.text == done.text
        assert done.timings.storage_tokens == 0 and done.timings.ttft_ms > 0 and done.timings.completion_tokens == 6
        assert done.kv is not None  # the pages SGLang (the stand-in) backed up, read back
        n = done.kv.num_tokens
        assert n == (len(ids) + 6 - 1) // 16 * 16 and done.kv.token_ids.tolist() == [*ids, *done.token_ids][:n]
        want, _ = await local.prefill(done.kv.token_ids.tolist())
        for a, b in zip(done.kv.keys + done.kv.values, want.keys + want.values, strict=True):
            torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)

    with_engine(url, model_dir, standin, redis_url, body)


def test_imported_kv_is_loaded_from_storage_instead_of_prefilled(
    served: tuple[StandIn, str], model_dir: Path, local: LocalEngine, redis_url: str
) -> None:
    standin, url = served

    async def body(engine: SGLangEngine) -> None:
        ids = prompt(local, 40)
        past, _ = await local.prefill(ids[:-5])
        native = await local.complete(ids, GREEDY)
        _, done = await collect(engine, ids, past=past)
        loaded = (len(ids) - 5) // 16 * 16
        assert done.timings.storage_tokens == loaded == done.timings.cached_tokens and loaded >= 32
        assert done.token_ids == native.token_ids

    with_engine(url, model_dir, standin, redis_url, body)


def test_a_short_import_is_a_storage_miss_and_native_prefill(
    served: tuple[StandIn, str], model_dir: Path, local: LocalEngine, redis_url: str
) -> None:
    standin, url = served

    async def body(engine: SGLangEngine) -> None:
        ids = prompt(local, 2)
        past, _ = await local.prefill(ids[:20])  # one page: under the prefetch threshold of 32 tokens
        _, done = await collect(engine, ids, past=past)
        assert done.timings.storage_tokens == 0 and done.timings.cached_tokens == 0

    with_engine(url, model_dir, standin, redis_url, body)


def test_a_value_of_another_prompt_is_refused(
    served: tuple[StandIn, str], model_dir: Path, local: LocalEngine, redis_url: str
) -> None:
    standin, url = served

    async def body(engine: SGLangEngine) -> None:
        ids = prompt(local, 20)
        past, _ = await local.prefill(ids[:40])
        with pytest.raises(KVMismatch):
            await collect(engine, [ids[0] + 1, *ids[1:]], past=past)

    with_engine(url, model_dir, standin, redis_url, body)


def test_recompute_cuts_at_the_page_before_the_first_position(
    served: tuple[StandIn, str], model_dir: Path, local: LocalEngine, redis_url: str
) -> None:
    standin, url = served

    async def body(engine: SGLangEngine) -> None:
        dense, _ = await local.prefill(prompt(local, 20)[:50])
        assert (await engine.recompute(dense, [47, 35])).num_tokens == 32
        with pytest.raises(KVMismatch):
            await engine.recompute(dense, [3, 40])
        with pytest.raises(Unsupported):
            await engine.score([1, 2, 3])

    with_engine(url, model_dir, standin, redis_url, body)


def test_engine_pool_connects_sglang_engines_from_settings(
    served: tuple[StandIn, str], model_dir: Path, redis_url: str
) -> None:
    standin, url = served
    s = EngineSettings(kind="sglang", model=MODEL, url=url, model_dir=model_dir, hicache_redis_url=redis_url,
                       hicache_namespace=standin.namespace, fingerprint=standin.engine.spec.fingerprint)  # fmt: skip

    async def check() -> None:
        pool = await EnginePool.load({"smol": s}, Zoo())
        engine = pool["smol"].engine
        assert isinstance(engine, SGLangEngine) and engine.pages is not None
        assert engine.pages.keys.tp_size == standin.tp_size
        await pool.aclose()

    run(check())
    with pytest.raises(ValueError, match="url and model_dir"):
        EngineSettings(kind="sglang", model=MODEL)


def test_gateway_records_a_storage_hit_and_turns_a_miss_native(tmp_path: Path, local: LocalEngine) -> None:
    async def check() -> None:
        store = KVStore(StoreConfig(data_dir=tmp_path))
        metrics, background = Metrics(), Background()
        imports = StorageImports(Fallbacks(store, metrics, background))
        kv, _ = await local.prefill(list(range(1, 40)))
        hop = Hop("executor", "smol", local, TransferPolicy(), 0, list(range(1, 50)), [], "", [], "", "", None)
        plan = HopPlan("transfer", kv)
        hit = imports.confirm(hop, plan, Timings(cached_tokens=32, storage_tokens=32))
        assert hit is plan
        miss = imports.confirm(hop, plan, Timings(storage_tokens=0))
        assert (miss.path, miss.past, miss.fallback) == ("native", None, "StorageMiss")
        assert imports.confirm(hop, plan, Timings()) is plan  # not an engine that imports through storage
        for _ in range(100):  # the events are emitted off the request path
            kinds = [(e.kind, e.fields.get("tier", "")) for e in store.events.read("0-0", 100)]
            if ("kv.hit", "hicache") in kinds and ("transfer.fallback", "") in kinds:
                break
            await asyncio.sleep(0.05)
        await background.aclose()
        text = metrics.render().decode()
        assert 'heterofold_storage_hits_total{engine="smol"} 1.0' in text
        assert 'heterofold_storage_hit_tokens_total{engine="smol"} 32.0' in text
        assert 'heterofold_transfer_fallbacks_total{reason="StorageMiss",stage="import"} 1.0' in text
        assert ("kv.hit", "hicache") in kinds and ("transfer.fallback", "") in kinds
        store.close()

    run(check())
