"""Exactness check of KV export and import: the proof that a cache taken out and put back is the cache.

Prefill a real text prefix, export its KV, serialize it, read it back, import it, run a suffix on
top, and compare the suffix logits with one full forward over prefix and suffix. Then compare
greedy generation continuing from the imported cache with generation from scratch.
"""

from __future__ import annotations

from dataclasses import dataclass

from engines.base import Engine, SamplingParams
from heterofold.corpus import stdlib_text
from heterofold.kv import KVCache

TOLERANCE = 1e-3


@dataclass(frozen=True)
class CheckResult:
    model: str
    prefix_tokens: int
    suffix_tokens: int
    payload_bytes: int
    max_abs_logit_diff: float
    generated_tokens: int
    generation_equal: bool
    prefill_ms: float
    import_ttft_ms: float  # generation TTFT continuing from the imported prefix
    native_ttft_ms: float  # generation TTFT prefilling everything

    @property
    def passed(self) -> bool:
        return self.max_abs_logit_diff <= TOLERANCE and self.generation_equal


async def check_engine(
    engine: Engine, *, prefix_tokens: int = 720, suffix_tokens: int = 48, generate: int = 24
) -> CheckResult:
    """Run the check on ``engine``. Raises ValueError for sizes the text cannot give."""
    if prefix_tokens < 1 or suffix_tokens < 1:
        raise ValueError("prefix and suffix need at least one token each")
    n = prefix_tokens + suffix_tokens
    ids = list(engine.encode(stdlib_text(6 * n)).ids)
    if len(ids) < n:
        raise ValueError(f"the text gave {len(ids)} tokens, fewer than {n}")
    ids = ids[:n]
    prefix = ids[:prefix_tokens]

    kv, prefill_timings = await engine.prefill(prefix)
    blob = kv.to_bytes()
    restored = KVCache.from_bytes(blob)

    imported = await engine.score(ids, past=restored)  # (suffix, vocab)
    full = (await engine.score(ids))[prefix_tokens:]  # (suffix, vocab)
    diff = float((imported - full).abs().max())

    params = SamplingParams(max_tokens=generate, temperature=0.0)
    warm = await engine.complete(ids, params, past=restored)
    cold = await engine.complete(ids, params)
    return CheckResult(
        model=engine.spec.name,
        prefix_tokens=prefix_tokens,
        suffix_tokens=suffix_tokens,
        payload_bytes=len(blob),
        max_abs_logit_diff=diff,
        generated_tokens=len(cold.token_ids),
        generation_equal=warm.token_ids == cold.token_ids,
        prefill_ms=prefill_timings.prefill_ms,
        import_ttft_ms=warm.timings.ttft_ms,
        native_ttft_ms=cold.timings.ttft_ms,
    )
