"""The SGLang engine: a running SGLang server (sglang 0.5.23, pinned as ``SGLANG_VERSION``) behind the
engine interface, with KV moving in and out through HiCache storage: a page sink
(``engines.page_sink.PageSink``) the gateway hands in.

    GET  /health          liveness
    GET  /server_info     page size, TP size, HiCache layout and storage backend, served model
    POST /generate        ``input_ids``, ``stream``: SSE chunks ``data: {"output_ids", "meta_info"}``,
                          then ``data: [DONE]``; ``meta_info.cached_tokens_details.storage`` counts
                          the prompt tokens SGLang loaded from HiCache storage

Text work (encode with offsets, decode, chat template) uses the served model's HF tokenizer from a
local folder; the spec comes from that folder's ``config.json``.

KV in: ``stream(past=...)`` writes every full page of ``past`` under the receiver's SGLang page keys
for every TP rank, then generates; SGLang finds the pages through ``batch_exists``/``batch_get`` and
skips their prefill. It always recomputes the last prompt token, and skips storage for spans under
its prefetch threshold (256 tokens by default). ``Timings.storage_tokens`` reports what it loaded:
0 is a miss, and SGLang prefilled natively. KV out: the pages SGLang backed up (write-through) are
read back as a canonical KV value for ``export``; only full pages are ever backed up.

Differences from the embedded engine, each raising ``Unsupported`` or stated here:
- ``recompute`` cannot run chosen positions inside an imported prefix: it cuts the value at the page
  boundary before the first position to recompute, and SGLang prefills everything after natively
  (a superset of the chosen positions). A cut at 0 raises ``KVMismatch`` (the hop falls back).
- ``score`` (full logits) and dense ``prefill`` (adapter fitting) are not available over HTTP.
- ``Timings.prefill_ms`` and ``queue_ms`` are not separable from outside: prefill_ms is the TTFT.

Errors: ``SGLangError`` (HTTP failure or an error answer), ``Unsupported``; both are EngineErrors.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import torch

from engines.base import (
    Completion,
    Engine,
    Export,
    FinishReason,
    SamplingParams,
    StreamEvent,
    Timings,
    TokenDelta,
)
from engines.detok import Detokenizer
from engines.errors import EngineBusy, EngineError, KVMismatch, PromptTooLong
from engines.page_sink import PageSink
from engines.templates import TokenizerText, default_stops
from heterofold.kv import KVCache
from heterofold.spec import ModelSpec

SGLANG_VERSION = "0.5.23"
EXPORT_POLL_S = 0.05


class SGLangError(EngineError):
    """The server could not be reached, or answered with an error."""


class Unsupported(EngineError):
    """An engine-interface method an SGLang server cannot serve over HTTP."""


@dataclass(frozen=True)
class ServerInfo:
    """What the engine reads from ``/server_info`` (SGLang's resolved server args)."""

    version: str
    model_path: str
    served_model_name: str
    page_size: int
    tp_size: int
    context_length: int | None
    hierarchical_cache: bool
    hicache_layout: str
    storage_backend: str | None
    kv_cache_dtype: str
    incremental_stream: bool

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ServerInfo:
        try:
            return cls(
                version=str(data.get("version", "")),
                model_path=str(data["model_path"]),
                served_model_name=str(data.get("served_model_name") or data["model_path"]),
                page_size=int(data.get("page_size") or 1),
                tp_size=int(data.get("tp_size") or 1),
                context_length=int(data["context_length"]) if data.get("context_length") else None,
                hierarchical_cache=bool(data.get("enable_hierarchical_cache", False)),
                hicache_layout=str(data.get("hicache_mem_layout") or "page_first"),
                storage_backend=data.get("hicache_storage_backend"),
                kv_cache_dtype=str(data.get("kv_cache_dtype") or "auto"),
                incremental_stream=bool(data.get("incremental_streaming_output", False)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise SGLangError(f"/server_info is not an SGLang server's answer: {exc!r}") from exc

    @property
    def serves_storage(self) -> bool:
        return self.hierarchical_cache and self.storage_backend is not None


def config_fingerprint(config: Mapping[str, Any], model_path: str) -> str:
    """An SGLang model's identity when none is configured: its config and the served path (the
    weights stay on the GPU node). Configure ``fingerprint`` to share adapters across engines."""
    h = hashlib.sha256(b"sglang\x00")
    h.update(json.dumps(dict(config), sort_keys=True, default=str).encode())
    h.update(b"\x00" + model_path.encode())
    return h.hexdigest()


class SGLangEngine(TokenizerText, Engine):
    recomputes_in_place = False  # recompute cuts the prefix at the first chosen position (module docstring)

    def __init__(
        self, *, client: httpx.AsyncClient, info: ServerInfo, tokenizer: Any, spec: ModelSpec,
        pages: PageSink | None = None, capacity: int = 8, export_wait_s: float = 2.0, model_dtype: str = "bfloat16",
    ) -> None:  # fmt: skip
        self.client = client
        self.info = info
        self.tokenizer = tokenizer
        self.spec = spec
        self.pages = pages
        self.capacity = capacity
        self.export_wait_s = export_wait_s
        self.model_dtype = model_dtype
        self._running = 0

    @classmethod
    async def connect(
        cls, url: str, *, name: str, model_dir: Path, template: str, pages: PageSink | None = None,
        fingerprint: str | None = None, capacity: int = 8, export_wait_s: float = 2.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> SGLangEngine:  # fmt: skip
        """Check the server, read its info, and load the tokenizer and config from ``model_dir``."""
        client = httpx.AsyncClient(base_url=url, transport=transport, timeout=httpx.Timeout(30.0, read=600.0))
        try:
            engine = await cls._connect(client, name, model_dir, template, pages, fingerprint, capacity, export_wait_s)
        except BaseException:
            await client.aclose()
            raise
        return engine

    @staticmethod
    async def probe(url: str, transport: httpx.AsyncBaseTransport | None = None) -> ServerInfo:
        """The server's ``/server_info``, without connecting an engine."""
        async with httpx.AsyncClient(base_url=url, transport=transport, timeout=30.0) as client:
            return ServerInfo.from_json(await _get_json(client, "/server_info"))

    @classmethod
    async def _connect(
        cls, client: httpx.AsyncClient, name: str, model_dir: Path, template: str, pages: PageSink | None,
        fingerprint: str | None, capacity: int, export_wait_s: float,
    ) -> SGLangEngine:  # fmt: skip
        info = ServerInfo.from_json(await _get_json(client, "/server_info"))
        tokenizer, config = await asyncio.to_thread(_load_text_side, model_dir)
        from engines.loader import special_tokens  # transformers is imported with the loader

        spec = ModelSpec.from_hf(
            name=name, config=config, template=template, special=special_tokens(tokenizer, template),
            fingerprint=fingerprint or config_fingerprint(config.to_dict(), info.model_path),
        )  # fmt: skip
        if pages is not None and pages.tp_size != info.tp_size:
            raise SGLangError(f"the page sink is set up for TP {pages.tp_size}, the server runs TP {info.tp_size}")
        dtype = str(getattr(config, "dtype", None) or getattr(config, "torch_dtype", None) or "bfloat16")
        engine = cls(client=client, info=info, tokenizer=tokenizer, spec=spec, pages=pages, capacity=capacity,
                     export_wait_s=export_wait_s, model_dtype=dtype.removeprefix("torch."))  # fmt: skip
        if not await engine.health():
            raise SGLangError(f"{client.base_url} is not healthy")
        return engine

    async def health(self) -> bool:
        try:
            return (await self.client.get("/health")).status_code == 200
        except httpx.HTTPError:
            return False

    # text (encode, decode, render): TokenizerText

    # ---- KV in and out -------------------------------------------------------------------

    async def _import(self, ids: Sequence[int], past: KVCache) -> int:
        """Write ``past`` under this server's page keys; returns the tokens written (whole pages)."""
        n = past.num_tokens
        if past.fingerprint != self.spec.fingerprint:
            raise KVMismatch(f"a KV value of model {past.fingerprint[:12]}, this engine serves {self.spec.name}")
        if n > len(ids) or past.token_ids.tolist() != list(ids[:n]):
            raise KVMismatch(f"the KV value's {n} tokens are not a prefix of the {len(ids)} prompt tokens")
        if self.pages is None or not self.info.serves_storage:
            raise KVMismatch(f"{self.spec.name}: SGLang serves no HiCache storage here, so KV cannot be imported")
        dtype = self.model_dtype if self.info.kv_cache_dtype == "auto" else self.info.kv_cache_dtype
        try:
            return await asyncio.to_thread(self.pages.put_kv, past, layout=self.info.hicache_layout,
                                           page_size=self.info.page_size, dtype=dtype)  # fmt: skip
        except self.pages.errors as exc:  # the hop falls back to native prefill
            raise KVMismatch(f"KV import into HiCache storage failed: {exc}") from exc

    async def export(self, tokens: Sequence[int]) -> KVCache | None:
        """The value for the longest prefix of ``tokens`` SGLang has backed up, waiting up to
        ``export_wait_s`` for its write-through; None without a page sink or a page."""
        if self.pages is None:
            return None
        P = self.info.page_size
        want = (len(tokens) - 1) // P  # the last token's KV is never computed
        deadline = time.monotonic() + self.export_wait_s
        kv = None
        while True:
            try:
                kv = await asyncio.to_thread(self.pages.get_kv, list(tokens), P, fingerprint=self.spec.fingerprint,
                                             num_kv_heads=self.spec.num_kv_heads)  # fmt: skip
            except self.pages.errors:
                kv = None
            if (kv is not None and kv.num_tokens >= want * P) or time.monotonic() >= deadline:
                return kv
            await asyncio.sleep(EXPORT_POLL_S)

    # ---- inference -----------------------------------------------------------------------

    async def prefill(
        self, ids: Sequence[int], *, past: KVCache | None = None, dense: bool = False
    ) -> tuple[KVCache, Timings]:
        """One generated token, then the prompt's pages read back (a page-aligned prefix of ``ids``)."""
        if dense:
            raise Unsupported("dense export (adapter fitting) needs the embedded engine")
        done = await self.complete(ids, SamplingParams(max_tokens=1), past=past, export="prompt")
        if done.kv is None:
            raise SGLangError(f"{self.spec.name}: no page of the prompt was backed up to storage")
        return done.kv, done.timings

    async def recompute(self, dense: KVCache, positions: Sequence[int]) -> KVCache:
        P = self.info.page_size
        first = min(positions, default=dense.num_tokens)
        cut = first // P * P
        if cut == 0:
            raise KVMismatch(f"recompute from position {first} leaves no whole page of {P} tokens to import")
        return dense.windowed(self.spec.windows).truncate(cut)

    async def score(self, ids: Sequence[int], *, past: KVCache | None = None) -> torch.Tensor:
        raise Unsupported("full logits are not served over SGLang's HTTP API")

    async def stream(
        self,
        ids: Sequence[int],
        params: SamplingParams,
        *,
        past: KVCache | None = None,
        export: Export = "none",
    ) -> AsyncIterator[StreamEvent]:
        ids = list(ids)
        limit = self.info.context_length or self.spec.max_positions
        if not ids or len(ids) + params.max_tokens > limit:
            raise PromptTooLong(f"{len(ids)} prompt tokens plus max_tokens {params.max_tokens} exceed {limit}")
        if self._running >= self.capacity:
            raise EngineBusy(f"{self.spec.name}: {self._running} requests running")
        self._running += 1
        try:
            t_submit = time.perf_counter()
            if past is not None:
                await self._import(ids, past)
            timings = Timings(prompt_tokens=len(ids))
            detok = Detokenizer(self.decode, (*params.stop, *default_stops(self.spec.template)))
            out: list[int] = []
            meta: dict[str, Any] = {}
            t_first = t_submit
            async for chunk in self._generate(ids, params):
                meta = chunk.get("meta_info") or meta
                got = [int(t) for t in chunk.get("output_ids") or []]
                for token in got if self.info.incremental_stream else got[len(out) :]:
                    if not out:
                        t_first = time.perf_counter()
                        timings.ttft_ms = timings.prefill_ms = (t_first - t_submit) * 1000
                    out.append(token)
                    delta = detok.push(token)
                    if delta:
                        yield TokenDelta(delta, token)
                if detok.stopped:
                    break  # leaving the stream closes it, and SGLang aborts the request
            tail = detok.flush()
            if tail and out:
                yield TokenDelta(tail, out[-1])
            timings.decode_ms = (time.perf_counter() - t_first) * 1000
            timings.completion_tokens = len(out)
            timings.cached_tokens = int(meta.get("cached_tokens") or 0)
            details = meta.get("cached_tokens_details") or {}
            if self.info.serves_storage:
                timings.storage_tokens = int(details.get("storage") or 0)
            kv = None
            if export != "none":
                kv = await self.export(ids + out if export == "turn" else ids)
            yield Completion(detok.text, tuple(out), _finish_reason(meta, detok.stopped), timings, kv)
        finally:
            self._running -= 1

    async def _generate(self, ids: list[int], params: SamplingParams) -> AsyncIterator[dict[str, Any]]:
        sampling: dict[str, Any] = {"max_new_tokens": params.max_tokens, "temperature": params.temperature,
                                    "top_p": params.top_p}  # fmt: skip
        if params.stop:
            sampling["stop"] = list(params.stop)
        if params.seed is not None:
            sampling["sampling_seed"] = params.seed
        body = {"input_ids": ids, "sampling_params": sampling, "stream": True}
        try:
            async with self.client.stream("POST", "/generate", json=body) as resp:
                if resp.status_code != 200:
                    raise SGLangError(f"/generate answered {resp.status_code}: {(await resp.aread())[:300]!r}")
                async for line in resp.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        return
                    chunk = json.loads(data)
                    if "error" in chunk:
                        raise SGLangError(f"/generate failed: {chunk['error']}")
                    yield chunk
        except (httpx.HTTPError, json.JSONDecodeError) as exc:
            raise SGLangError(f"/generate: {exc!r}") from exc

    async def aclose(self) -> None:
        await self.client.aclose()


def _finish_reason(meta: Mapping[str, Any], stopped: bool) -> FinishReason:
    reason = meta.get("finish_reason") or {}
    kind = reason.get("type") if isinstance(reason, Mapping) else None
    if stopped or kind == "stop":
        return "stop"
    if kind == "abort":
        return "cancelled"
    return "length"


async def _get_json(client: httpx.AsyncClient, path: str) -> Mapping[str, Any]:
    try:
        resp = await client.get(path)
    except httpx.HTTPError as exc:
        raise SGLangError(f"{client.base_url}{path}: {exc!r}") from exc
    if resp.status_code != 200:
        raise SGLangError(f"{path} answered {resp.status_code}")
    data = resp.json()
    if not isinstance(data, Mapping):
        raise SGLangError(f"{path} did not answer a JSON object")
    return data


def _load_text_side(model_dir: Path) -> tuple[Any, Any]:
    """The fast tokenizer and the config of the served model, from local files only: a model folder,
    or a hub cache folder whose ``refs/main`` names the snapshot (what the engines downloaded)."""
    from transformers import AutoConfig, AutoTokenizer

    ref = model_dir / "refs" / "main"  # a hub cache folder (models--org--name): its current snapshot
    if ref.is_file():
        model_dir = model_dir / "snapshots" / ref.read_text().strip()
    tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    config = AutoConfig.from_pretrained(model_dir, local_files_only=True)
    return tokenizer, config
