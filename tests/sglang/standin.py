"""An HTTP stand-in for an SGLang server, not SGLang: it speaks the endpoints ``engines/sglang.py``
uses (``/health``, ``/server_info``, streaming ``/generate`` with ``input_ids``) with SGLang 0.5.23's
field names, and generates with a real zoo model (``LocalEngine``) on CPU.

Its HiCache L3 is emulated with our real ``HeteroFoldHiCache`` on one host pool stand-in per TP rank,
in the order SGLang's cache controller calls it: before prefill ``batch_exists`` on the prompt's full
pages (all but the last token) and, at or above the prefetch threshold, ``batch_get`` into the host
pool and the KV value imported; after generation, the turn's full pages backed up with ``batch_set``.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
import uvicorn
from fastapi import FastAPI
from fastapi.responses import StreamingResponse

from engines.base import SamplingParams
from engines.local import LocalEngine
from heterofold.kv import KVCache
from store.hicache.backend import HeteroFoldHiCache
from store.hicache.layout import kv_to_pages, pages_to_kv, rank_heads
from store.hicache.page_keys import page_keys
from tests.sglang.host_pool import HostPoolStandIn


@dataclass
class StorageConfigStandIn:
    """The fields of SGLang's ``HiCacheStorageConfig`` the backend reads."""

    tp_rank: int
    tp_size: int
    extra_config: dict[str, Any]
    model_name: str = "standin"
    pp_size: int = 1
    attn_cp_size: int = 1
    is_mla_model: bool = False


@dataclass
class StandIn:
    engine: LocalEngine
    redis_url: str
    namespace: str
    page_size: int = 16
    tp_size: int = 1
    layout: str = "page_first"
    prefetch_threshold: int = 32
    storage: bool = True
    pages: int = 64  # the host pool's size in pages: the longest turn it backs up
    requests: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        spec = self.engine.spec
        heads = [rank_heads(spec.num_kv_heads, self.tp_size, r) for r in range(self.tp_size)]
        self.pools = [HostPoolStandIn(self.layout, spec.num_layers, b - a, spec.head_dim, self.page_size, self.pages)
                      for a, b in heads]  # fmt: skip
        extra = {"namespace": self.namespace, "redis_url": self.redis_url}
        self.backends = [
            HeteroFoldHiCache(StorageConfigStandIn(r, self.tp_size, extra), None) for r in range(self.tp_size)
        ]
        for backend, pool in zip(self.backends, self.pools, strict=True):
            backend.register_mem_pool_host(pool)

    def server_info(self) -> dict[str, Any]:
        return {
            "version": "standin", "model_path": f"standin/{self.engine.spec.name}", "served_model_name": "standin",
            "page_size": self.page_size, "tp_size": self.tp_size, "context_length": self.engine.spec.max_positions,
            "enable_hierarchical_cache": self.storage, "hicache_mem_layout": self.layout,
            "hicache_storage_backend": "dynamic" if self.storage else None, "kv_cache_dtype": "auto",
        }  # fmt: skip

    def load(self, ids: list[int]) -> KVCache | None:
        P = self.page_size
        keys = page_keys(ids[: (len(ids) - 1) // P * P], P)
        hits = min(b.batch_exists(keys) for b in self.backends)
        if hits * P < self.prefetch_threshold:
            return None
        pages: list[list[torch.Tensor]] = [[] for _ in range(hits)]
        for backend, pool in zip(self.backends, self.pools, strict=True):
            got = backend.batch_get(keys[:hits], [pool.get_dummy_flat_data_page() for _ in range(hits)])
            for i, flat in enumerate(got):
                if flat is None:
                    return None
                pool.set_from_flat_data_page(i * P, flat)
                assert backend.geometry is not None
                pages[i].append(backend.geometry.to_canonical(pool.get_data_page(i * P)))
        spec = self.engine.spec
        return pages_to_kv(pages, ids[: hits * P], fingerprint=spec.fingerprint, num_kv_heads=spec.num_kv_heads)

    def back_up(self, kv: KVCache) -> None:
        P = self.page_size
        n = (kv.num_tokens - 1) // P  # the last token's KV would not exist yet in SGLang
        pages = kv_to_pages(kv.truncate(n * P), P, self.tp_size, torch.float32)
        keys = page_keys(kv.token_ids.tolist()[: n * P], P)
        for r, (backend, pool) in enumerate(zip(self.backends, self.pools, strict=True)):
            assert backend.geometry is not None
            for i, page in enumerate(pages):
                pool.set_from_flat_data_page(i * P, backend.geometry.from_canonical(page[r]))
            assert backend.batch_set(keys, [pool.get_data_page(i * P) for i in range(n)])

    async def generate(self, body: dict[str, Any]) -> AsyncIterator[bytes]:
        self.requests.append(body)
        ids, sp = list(body["input_ids"]), body.get("sampling_params", {})
        past = self.load(ids) if self.storage else None
        loaded = 0 if past is None else past.num_tokens
        params = SamplingParams(
            max_tokens=sp.get("max_new_tokens", 16), temperature=sp.get("temperature", 0.0), top_p=sp.get("top_p", 1.0),
            seed=sp.get("sampling_seed"), stop=tuple(sp.get("stop", ())),
        )  # fmt: skip
        done = await self.engine.complete(ids, params, past=past, export="turn" if self.storage else "none")
        out = list(done.token_ids)
        meta: dict[str, Any] = {
            "id": "standin",
            "finish_reason": None,
            "prompt_tokens": len(ids),
            "cached_tokens": loaded,
        }
        if self.storage:
            meta["cached_tokens_details"] = {"device": 0, "host": 0, "storage": loaded,
                                             "storage_backend": "HeteroFoldHiCache"}  # fmt: skip
        for i in range(len(out)):
            last = i == len(out) - 1
            if last:
                if done.kv is not None:
                    self.back_up(done.kv)
                meta = {**meta, "completion_tokens": len(out),
                        "finish_reason": {"type": "length" if done.finish_reason == "length" else "stop"}}  # fmt: skip
            yield b"data: " + json.dumps({"text": "", "output_ids": out[: i + 1], "meta_info": meta}).encode() + b"\n\n"
        yield b"data: [DONE]\n\n"

    def app(self) -> FastAPI:
        app = FastAPI(title="SGLang stand-in (not SGLang)")
        app.get("/health")(lambda: {})
        app.get("/server_info")(self.server_info)

        @app.post("/generate")
        async def generate(body: dict[str, Any]) -> StreamingResponse:
            return StreamingResponse(self.generate(body), media_type="text/event-stream")

        return app


@contextmanager
def serve(standin: StandIn) -> Iterator[str]:
    """Run the stand-in on a loopback port in a thread; yields its base URL."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(standin.app(), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline:
            raise RuntimeError("the SGLang stand-in did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)
