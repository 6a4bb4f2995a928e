"""The engine interface: one model runtime behind tokenization, prefill with KV export, and generation
that continues from an imported KV value. ``local`` (embedded torch) and ``sglang`` implement it.

Rules every engine keeps:
- Token ids are the unit of work. ``past`` (a KVCache) must be made by this engine's model
  (same fingerprint) for a prefix of ``ids``; the engine then prefills only ``ids[len(past):]``.
  A past that does not fit raises ``KVMismatch``; nothing is silently recomputed.
- At least one token is always run through the model, so logits exist for the next token:
  a past that covers all of ``ids`` is truncated by one token when it can be
  (``KVCache.can_truncate``), and otherwise raises ``KVMismatch``.
- Inference runs off the event loop. An engine runs one request at a time behind a bounded
  queue; a full queue raises ``EngineBusy`` at once.
- Exported KV values are never mutated afterwards by the engine.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from engines.errors import BadPrompt
from heterofold.kv import KVCache
from heterofold.spec import ModelSpec

Export = Literal["none", "prompt", "turn"]
FinishReason = Literal["stop", "length", "cancelled"]


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 128
    temperature: float = 0.0  # 0 means greedy
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not 1 <= self.max_tokens <= 1 << 20:
            raise BadPrompt(f"max_tokens must be at least 1, got {self.max_tokens}")
        if not 0.0 <= self.temperature <= 5.0:
            raise BadPrompt(f"temperature must be within [0, 5], got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise BadPrompt(f"top_p must be within (0, 1], got {self.top_p}")
        if any(not s for s in self.stop):
            raise BadPrompt("stop sequences must not be empty strings")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(frozen=True)
class Encoding:
    ids: tuple[int, ...]
    offsets: tuple[tuple[int, int], ...]  # character span of each token in the text; (0, 0) for BOS


@dataclass
class Timings:
    prompt_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens taken from ``past`` instead of being prefilled
    queue_ms: float = 0.0  # waiting for the engine
    prefill_ms: float = 0.0  # import plus prefill of the uncached tokens
    ttft_ms: float = 0.0  # from submission to the first generated token
    decode_ms: float = 0.0  # from the first generated token to the last
    completion_tokens: int = 0
    storage_tokens: int | None = None  # prompt tokens loaded from HiCache storage (SGLang); None: not such an engine

    @property
    def decode_tokens_per_s(self) -> float:
        steps = self.completion_tokens - 1
        return steps / (self.decode_ms / 1000) if steps > 0 and self.decode_ms > 0 else 0.0


@dataclass(frozen=True)
class TokenDelta:
    """Text that became final with ``token_id`` (may be empty while a stop sequence is pending)."""

    text: str
    token_id: int


@dataclass(frozen=True)
class Completion:
    text: str
    token_ids: tuple[int, ...]
    finish_reason: FinishReason
    timings: Timings
    kv: KVCache | None = field(default=None, repr=False)


StreamEvent = TokenDelta | Completion


class Engine(ABC):
    spec: ModelSpec
    # Whether ``recompute`` runs scattered positions inside an imported prefix (the embedded
    # engine) or only a suffix (SGLang): a cross-family hop then quotes instead (gateway/hop.py).
    recomputes_in_place: bool = True

    @abstractmethod
    def encode(self, text: str, *, add_special_tokens: bool = True) -> Encoding:
        """Token ids with character offsets. ``add_special_tokens`` adds BOS where the model does."""

    @abstractmethod
    def decode(self, ids: Sequence[int]) -> str: ...

    @abstractmethod
    def render(self, messages: Sequence[dict[str, Any]]) -> str:
        """The prompt text for chat ``messages``, ending where the assistant's reply begins."""

    @abstractmethod
    async def prefill(
        self, ids: Sequence[int], *, past: KVCache | None = None, dense: bool = False
    ) -> tuple[KVCache, Timings]:
        """Run ``ids`` through the model and export the KV cache for all of them.

        ``dense`` keeps every token on sliding-window layers too (``KVCache.is_dense``), as
        fitting an adapter needs; such a value is imported after ``KVCache.windowed``.
        """

    @abstractmethod
    async def recompute(self, dense: KVCache, positions: Sequence[int]) -> KVCache:
        """Selective native recompute on top of a dense KV value made elsewhere (a mapped one).

        The tokens at ``positions`` run through all layers at their true positions, each
        attending to the given KV of the other tokens before it and to the recomputed tokens
        before it; their KV replaces the given one. Recomputing every position reproduces a
        native prefill. Returns the value in this model's layout, ready to import.
        """

    @abstractmethod
    def stream(
        self,
        ids: Sequence[int],
        params: SamplingParams,
        *,
        past: KVCache | None = None,
        export: Export = "none",
    ) -> AsyncIterator[StreamEvent]:
        """Generate after ``ids``: TokenDeltas as text becomes final, then one Completion.

        ``export`` puts a KV value into the Completion: ``prompt`` for ``ids``, ``turn`` for
        ``ids`` plus the generated tokens (one more forward step).
        """

    @abstractmethod
    async def score(self, ids: Sequence[int], *, past: KVCache | None = None) -> torch.Tensor:
        """Logits ``(T_new, vocab)`` at each position of ``ids`` not covered by ``past``."""

    def token_embeddings(self) -> torch.Tensor | None:
        """The model's input embedding table ``(V, d)``, read by adapters with a token map
        (``heterofold.adapter.TokenMap``); None where the engine cannot give it (a remote server)."""
        return None

    async def complete(
        self,
        ids: Sequence[int],
        params: SamplingParams,
        *,
        past: KVCache | None = None,
        export: Export = "none",
    ) -> Completion:
        async for event in self.stream(ids, params, past=past, export=export):
            if isinstance(event, Completion):
                return event
        raise RuntimeError("engine stream ended without a Completion")

    async def aclose(self) -> None:
        """Release threads and memory. The engine is unusable afterwards."""
        return None
