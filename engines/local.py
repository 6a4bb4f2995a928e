"""The embedded engine: a zoo model run with torch and transformers, on CUDA when present, else CPU."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, TypeVar

import torch
from transformers import DynamicCache

from engines.allocator import tune_allocator
from engines.base import Completion, Engine, Export, SamplingParams, StreamEvent, Timings, TokenDelta
from engines.catalog import lookup
from engines.detok import Detokenizer
from engines.errors import KVMismatch, PromptTooLong
from engines.hf_cache import dense_cache, export_kv, import_kv
from engines.loader import LoadedModel, load_converted
from engines.probe import probing
from engines.queries import capture_queries
from engines.recompute import recompute_sync
from engines.templates import TokenizerText, default_stops
from engines.worker import Worker
from engines.zoo import Zoo
from heterofold.kv import KVCache

R = TypeVar("R")
Emit = Callable[[StreamEvent | BaseException], None]


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


class LocalEngine(TokenizerText, Engine):
    def __init__(self, loaded: LoadedModel, *, capacity: int = 8) -> None:
        tune_allocator()  # process-wide, once: fresh large tensors reuse freed memory (engines/allocator.py)
        self.model = loaded.model
        self.model.requires_grad_(False)  # frozen: fits take gradients of their own tensors only
        self.tokenizer = loaded.tokenizer
        self.spec = loaded.spec
        self.load_s = loaded.load_s
        self.device = next(self.model.parameters()).device
        self.dtype = next(self.model.parameters()).dtype
        self._worker = Worker(self.spec.name, capacity)

    @classmethod
    def from_zoo(
        cls, name: str, *, zoo: Zoo | None = None, device: str | None = None, capacity: int = 8
    ) -> LocalEngine:
        """Load a zoo model, fetching and converting it first if this cache lacks it."""
        zoo = zoo or Zoo()
        entry = lookup(name)
        folder = zoo.pull(entry)
        return cls(load_converted(folder, zoo.manifest(entry), device or default_device()), capacity=capacity)

    # text (encode, decode, render): TokenizerText

    # ---- inference (async front, runs on the worker thread) ------------------------------

    async def prefill(
        self, ids: Sequence[int], *, past: KVCache | None = None, dense: bool = False
    ) -> tuple[KVCache, Timings]:
        t_submit = time.perf_counter()
        return await self._worker.submit(lambda: self._prefill_sync(list(ids), past, t_submit, dense))

    async def prefill_at(self, ids: Sequence[int], positions: Sequence[int]) -> KVCache:
        """Native prefill of ``ids`` at the RoPE ``positions`` given (strictly increasing): each
        token sees only the earlier ones of ``ids``, every other position is absent. The value keeps
        those positions; continuing from it puts the next token at ``positions[-1] + 1``."""
        return await self._worker.submit(lambda: self._prefill_at_sync(list(ids), list(positions)))

    async def prefill_with_queries(self, ids: Sequence[int]) -> tuple[KVCache, tuple[torch.Tensor, ...]]:
        """A dense prefill of ``ids`` and the model's queries after RoPE in that pass, per layer
        ``(heads, len(ids), head_dim)`` (``engines.queries``). The capture is open inside this one
        job on the worker thread, so requests the engine serves meanwhile are never recorded."""

        def job() -> tuple[KVCache, tuple[torch.Tensor, ...]]:
            with capture_queries(self.model, self.spec) as passes:
                kv, _ = self._prefill_sync(list(ids), None, time.perf_counter(), dense=True)
            if len(passes) != 1:
                raise RuntimeError(f"expected one captured pass, got {len(passes)}")
            return kv, passes[0]

        return await self._worker.submit(job)

    async def run_exclusive(self, fn: Callable[[], R]) -> R:
        """Run ``fn`` on the engine's worker thread, one job among the others (a fit's passes
        with gradients use ``self.model`` there, never concurrently with a request)."""
        return await self._worker.submit(fn)

    async def recompute(self, dense: KVCache, positions: Sequence[int]) -> KVCache:
        return await self._worker.submit(
            lambda: recompute_sync(self.model, self.spec, dense, positions, device=self.device, dtype=self.dtype)
        )

    async def score(self, ids: Sequence[int], *, past: KVCache | None = None) -> torch.Tensor:
        return await self._worker.submit(lambda: self._score_sync(list(ids), past))

    async def attention(self, ids: Sequence[int], *, past: KVCache | None = None, rows: int = 1) -> torch.Tensor:
        """Where the last ``rows`` of ``ids`` look: their attention weights over all of ``ids``
        (cached or not), averaged over heads, ``(layers, rows, len(ids))`` for the full-attention
        layers from a third of the depth up (``attention_layers``). ``past`` as in ``score``."""
        return await self._worker.submit(lambda: self._attention_sync(list(ids), past, rows))

    def token_embeddings(self) -> torch.Tensor:
        """The input embedding table ``(V, d)`` (the model's own tensor: read it, never write it)."""
        return self.model.get_input_embeddings().weight.detach()

    def attention_layers(self) -> list[int]:
        """The layers ``attention`` reads: full-attention ones, from a third of the depth up."""
        n = self.spec.num_layers
        return [i for i, w in enumerate(self.spec.windows) if w == 0 and i >= n // 3]

    async def stream(
        self,
        ids: Sequence[int],
        params: SamplingParams,
        *,
        past: KVCache | None = None,
        export: Export = "none",
    ) -> AsyncIterator[StreamEvent]:
        self._check_length(len(ids), params.max_tokens)
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[StreamEvent | BaseException] = asyncio.Queue()
        cancel = threading.Event()
        t_submit = time.perf_counter()

        def emit(event: StreamEvent | BaseException) -> None:
            loop.call_soon_threadsafe(events.put_nowait, event)

        def work() -> None:
            try:
                self._generate_sync(list(ids), params, past, export, emit, cancel, t_submit)
            except BaseException as exc:
                emit(exc)

        job = asyncio.ensure_future(self._worker.submit(work))
        try:
            while True:
                get = asyncio.ensure_future(events.get())
                await asyncio.wait({get, job}, return_when=asyncio.FIRST_COMPLETED)
                if not get.done():  # the job ended (EngineBusy, or shut down) without an event
                    get.cancel()
                    job.result()
                    raise RuntimeError("engine job ended without a result")
                event = get.result()
                if isinstance(event, BaseException):
                    raise event
                yield event
                if isinstance(event, Completion):
                    return
        finally:
            cancel.set()  # a consumer that stops early (client gone) stops the decode loop

    async def aclose(self) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self._worker.shutdown)

    # ---- model work (worker thread only) ---------------------------------------------------

    def _check_length(self, n_prompt: int, max_tokens: int = 0) -> None:
        if n_prompt == 0:
            raise PromptTooLong("the prompt has no tokens")
        if n_prompt + max_tokens > self.spec.max_positions:
            raise PromptTooLong(
                f"prompt of {n_prompt} tokens plus max_tokens {max_tokens} exceeds "
                f"{self.spec.name}'s context of {self.spec.max_positions} tokens"
            )

    def _start(self, ids: list[int], past: KVCache | None) -> tuple[Any, int, int]:
        """A cache to continue from, how many of ``ids`` it covers (always fewer than all), and the
        RoPE position of the first id it does not cover."""
        if past is None or past.num_tokens == 0:
            return None, 0, 0
        n = past.num_tokens
        if n > len(ids) or past.token_ids.tolist() != ids[:n]:
            raise KVMismatch(f"the KV value's {n} tokens are not a prefix of the {len(ids)} prompt tokens")
        if n == len(ids):
            if not past.can_truncate(n - 1):
                raise KVMismatch("the KV value covers the whole prompt and cannot be cut back by one token")
            past, n = past.truncate(n - 1), n - 1
        cache = import_kv(past, self.model.config, self.spec, self.device, self.dtype)
        return cache, n, int(past.positions[-1]) + 1

    def _forward(self, ids: list[int], cache: Any, start: int, keep: int = 1) -> tuple[torch.Tensor, Any]:
        """Run ``ids`` at positions ``start..``; returns the last ``keep`` logits (0 = all) and cache."""
        return self._forward_at(ids, cache, torch.arange(start, start + len(ids)), keep)

    def _forward_at(
        self, ids: list[int], cache: Any, positions: torch.Tensor, keep: int = 1
    ) -> tuple[torch.Tensor, Any]:
        x = torch.tensor([ids], device=self.device)  # (1, T)
        pos = positions.to(self.device)[None]  # (1, T)
        if cache is None:  # an explicit cache: masks follow cache indices, never packed-sequence guesses
            cache = DynamicCache(config=self.model.config)
        out = self.model(input_ids=x, position_ids=pos, cache=cache, use_cache=True, logits_to_keep=keep)
        return out.logits[0].float(), out.cache  # (keep or T, vocab)

    @torch.inference_mode()
    def _prefill_sync(
        self, ids: list[int], past: KVCache | None, t_submit: float, dense: bool = False
    ) -> tuple[KVCache, Timings]:
        self._check_length(len(ids))
        t0 = time.perf_counter()
        if dense and past is not None:
            raise KVMismatch("a dense prefill starts from scratch; it takes no past")
        cache, start, at = self._start(ids, past)
        if dense:
            cache = dense_cache(self.model.config)
        _, cache = self._forward(ids[start:], cache, at)
        kv = _at(export_kv(cache, torch.tensor(ids), self.spec, dense=dense), past, at - start)
        t1 = time.perf_counter()
        ms = (t1 - t0) * 1000
        timings = Timings(len(ids), start, (t0 - t_submit) * 1000, ms, (t1 - t_submit) * 1000)
        return kv, timings

    @torch.inference_mode()
    def _score_sync(self, ids: list[int], past: KVCache | None) -> torch.Tensor:
        self._check_length(len(ids))
        cache, start, at = self._start(ids, past)
        logits, _ = self._forward(ids[start:], cache, at, keep=0)
        return logits.cpu()

    @torch.inference_mode()
    def _attention_sync(self, ids: list[int], past: KVCache | None, rows: int) -> torch.Tensor:
        self._check_length(len(ids))
        cache, start, at = self._start(ids, past)
        layers = self.attention_layers()
        with probing(self.model, layers, rows) as record:
            self._forward(ids[start:], cache, at)
        out = []
        for layer in layers:
            weights = record[layer]
            assert weights is not None, f"layer {layer} recorded no attention"
            out.append(weights[-rows:])  # (rows, len(ids)): the last rows, over every key
        return torch.stack(out)

    @torch.inference_mode()
    def _prefill_at_sync(self, ids: list[int], positions: list[int]) -> KVCache:
        self._check_length(len(ids))
        pos = torch.tensor(positions, dtype=torch.int64)
        if pos.shape != (len(ids),) or bool((pos[1:] <= pos[:-1]).any()) or int(pos[0]) < 0:
            raise KVMismatch("prefill_at needs one strictly increasing, non-negative position per token")
        if int(pos[-1]) >= self.spec.max_positions:
            raise PromptTooLong(f"position {int(pos[-1])} is past {self.spec.name}'s context")
        _, cache = self._forward_at(ids, None, pos)
        kv = export_kv(cache, torch.tensor(ids), self.spec)
        return dataclasses.replace(kv, positions=pos)

    @torch.inference_mode()
    def _generate_sync(
        self,
        ids: list[int],
        params: SamplingParams,
        past: KVCache | None,
        export: Export,
        emit: Emit,
        cancel: threading.Event,
        t_submit: float,
    ) -> None:
        t0 = time.perf_counter()
        timings = Timings(prompt_tokens=len(ids), queue_ms=(t0 - t_submit) * 1000)
        cache, start, at = self._start(ids, past)
        timings.cached_tokens = start
        shift = at - start  # RoPE position minus index: 0 unless the past is sparse (prefill_at)
        logits, cache = self._forward(ids[start:], cache, at)
        timings.prefill_ms = (time.perf_counter() - t0) * 1000
        kv = _at(export_kv(cache, torch.tensor(ids), self.spec), past, shift) if export == "prompt" else None

        gen = torch.Generator(device=self.device)
        gen.manual_seed(params.seed if params.seed is not None else int(time.time_ns() & 0x7FFFFFFF))
        detok = Detokenizer(self.decode, (*params.stop, *default_stops(self.spec.template)))
        eos = set(self.spec.special.eos_ids)
        out: list[int] = []
        finish = "length"
        t_first = time.perf_counter()
        for step in range(params.max_tokens):
            token = _pick(logits[-1], params, gen)
            if step == 0:
                t_first = time.perf_counter()
                timings.ttft_ms = (t_first - t_submit) * 1000
            out.append(token)
            if token in eos:
                finish = "stop"
                break
            delta = detok.push(token)
            if delta:
                emit(TokenDelta(delta, token))
            if detok.stopped:
                finish = "stop"
                break
            if cancel.is_set():
                finish = "cancelled"
                break
            if step + 1 < params.max_tokens:
                logits, cache = self._forward([token], cache, shift + len(ids) + step)
        tail = detok.flush()
        if tail:
            emit(TokenDelta(tail, out[-1]))
        timings.decode_ms = (time.perf_counter() - t_first) * 1000
        timings.completion_tokens = len(out)
        if export == "turn":
            _, cache = self._forward(out[-1:], cache, shift + len(ids) + len(out) - 1)
            kv = _at(export_kv(cache, torch.tensor(ids + out), self.spec), past, shift)
        emit(Completion(detok.text, tuple(out), finish, timings, kv))  # type: ignore[arg-type]


def _at(kv: KVCache, past: KVCache | None, shift: int) -> KVCache:
    """``kv`` with the true RoPE positions: a sparse past's own, then ``shift`` past each index."""
    if not shift or past is None:
        return kv
    n = past.num_tokens
    tail = torch.arange(n, kv.num_tokens, dtype=torch.int64) + shift
    return dataclasses.replace(kv, positions=torch.cat([past.positions, tail]))


def _pick(logits: torch.Tensor, params: SamplingParams, gen: torch.Generator) -> int:
    """Greedy argmax, or temperature and nucleus (top-p) sampling."""
    if params.greedy:
        return int(torch.argmax(logits))
    probs = torch.softmax(logits / params.temperature, dim=-1)
    if params.top_p < 1.0:
        sorted_p, order = torch.sort(probs, descending=True)
        keep = torch.cumsum(sorted_p, dim=-1) - sorted_p < params.top_p  # always keeps the top token
        probs = torch.zeros_like(probs).scatter_(0, order[keep], sorted_p[keep])
    return int(torch.multinomial(probs, 1, generator=gen))
