"""Fitting one direction: generate the fit corpus, run both frozen models on it, fit the maps."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Sequence

from engines.local import LocalEngine
from engines.transfer import collect_pairs
from harness.distill_on_engines import build_docs, distill
from heterofold.adapter import Adapter, Side
from heterofold.corpus import distill_contexts, stdlib_docstrings
from heterofold.fit import calibrate_adapter, fit_adapter, stack_pairs
from heterofold.suite import builtin_suite

# Evaluation uses builtin_suite(seed=0); the fit corpus draws its task contexts from other seeds.
FIT_SEED_OFFSET = 1000
METHODS = ("heterofold", "kv-ridge", "distilled")  # what ``fit_or_distill`` fits


def default_corpus(seed: int = 0, docs: int = 16) -> list[str]:
    """Offline fit texts: half stdlib docstring runs, half generated long-context task contexts
    (needles, facts, multi-turn hand-offs), all produced at fit time. (Not in ``heterofold.corpus``
    with the other corpus helpers: it reads ``heterofold.suite``, which reads that module.)"""
    stdlib = stdlib_docstrings()
    texts = []
    step = max(len(stdlib) // max(docs // 2, 1), 1)
    for i in range(docs // 2):
        texts.append("\n\n".join(stdlib[(i * step) % len(stdlib) :][:14]))
    tasks = builtin_suite(seed=seed + FIT_SEED_OFFSET, lengths=(1024,), per_cell=1)
    texts += [t.context for t in tasks[: docs - len(texts)]]
    return texts


async def distill_direction(
    sender: LocalEngine,
    receiver: LocalEngine,
    start: Adapter,
    *,
    contexts: Sequence[str],
    version: str,
    seed: int = 0,
    steps: int = 300,
    rank: int = 8,
    gates: bool = False,
    token: bool = False,
    questions: int = 1,
    budgets: Sequence[float] = (0.0, 0.02),
    path: str = "recompute",
    lr: float = 2e-3,
    clip: float | None = None,
    progress: Callable[[str, int, int], None] | None = None,
) -> Adapter:
    """The ``distilled`` method: ``start`` (a fitted ridge map) distilled end to end through the
    frozen receiver on ``contexts`` (``harness.distill_on_engines``), for the transfer ``path``
    (``recompute``: the chosen tokens recomputed in place; ``quote``: quoted after the context)."""
    t0 = time.perf_counter()
    docs = await build_docs(sender, receiver, start, contexts, budgets=budgets, path=path, questions=questions,
                            seed=seed, progress=progress)  # fmt: skip
    info = {
        "start": start.manifest.method,
        "start_version": start.manifest.version,
        "distill_data_sha256": hashlib.sha256("\x00".join(contexts).encode()).hexdigest(),
        "distill_documents": len(contexts),
        "distill_budgets": list(budgets),
        "distill_path": path,
        "distill_questions": questions,
        "distill_collect_s": round(time.perf_counter() - t0, 1),
    }
    adapter = await distill(receiver, start, docs, method="distilled", version=version, fit_info=info, steps=steps,
                            rank=rank, gates=gates, token=token, lr=lr, clip=clip, seed=seed,
                            progress=progress)  # fmt: skip
    adapter.manifest.fit["fit_s"] = round(float(start.manifest.fit.get("fit_s", 0.0)) + time.perf_counter() - t0, 2)
    return adapter


async def fit_direction(
    sender: LocalEngine,
    receiver: LocalEngine,
    *,
    method: str,
    texts: Sequence[str],
    seed: int,
    version: str,
    max_tokens: int = 1024,
    init: str = "ridge",
    token_rank: int = 0,
    token_lags: int = 2,
    progress: Callable[[str, int, int], None] | None = None,
) -> Adapter:
    """``method`` fitted on ``texts``; with ``token_rank`` (KV Ridge), the map also reads the
    receiver's own token features (``token_lags`` tokens, ``token_rank`` components)."""
    t0 = time.perf_counter()
    calibrate = method == "heterofold"  # calibration needs the receiver's native queries
    pairs = await collect_pairs(sender, receiver, texts, max_tokens=max_tokens, queries=calibrate, progress=progress)
    eligible = list(sender.spec.full_attention_layers)  # the layers a canonical sender value holds fully
    embeddings = receiver.token_embeddings() if token_rank else None
    data = stack_pairs(pairs, Side.of(sender.spec), Side.of(receiver.spec), eligible, embeddings=embeddings,
                       lags=token_lags)  # fmt: skip
    digest = hashlib.sha256("\x00".join(texts).encode()).hexdigest()
    info = {
        "init": init if method == "heterofold" else "",
        "data_sha256": digest,
        "documents": len(texts),
        "seed": seed,
        "collect_s": round(time.perf_counter() - t0, 2),
    }
    adapter = fit_adapter(
        data, Side.of(sender.spec), Side.of(receiver.spec), eligible,
        method=method, version=version, init=init, token_rank=token_rank, fit_info=info, progress=progress,
    )  # fmt: skip
    if calibrate:
        adapter = calibrate_adapter(adapter, pairs, receiver.spec.windows, receiver.spec.attn_scale, seed=seed,
                                    progress=progress)  # fmt: skip
    adapter.manifest.fit["fit_s"] = round(time.perf_counter() - t0, 2)
    return adapter


async def fit_or_distill(
    sender: LocalEngine,
    receiver: LocalEngine,
    *,
    method: str,
    texts: Sequence[str],
    seed: int,
    version: str,
    max_tokens: int = 1024,
    distill_docs: int = 16,
    distill_steps: int = 200,
    distill_path: str = "recompute",
    distill_lr: float = 2e-3,
    distill_clip: float | None = None,
    token_rank: int = 0,
    progress: Callable[[str, int, int], None] | None = None,
    start: Adapter | None = None,
) -> Adapter:
    """One of ``METHODS`` from scratch: ``distilled`` fits KV Ridge on ``texts`` first (reading the
    receiver's tokens at ``token_rank`` > 0; or starts from ``start``, a KV Ridge map already
    fitted for this direction), then distils it on ``distill_docs`` stdlib contexts for
    ``distill_path`` (``distill_direction``). ``token_rank`` applies to the distillation's start
    only."""
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}: {', '.join(METHODS)}")
    if token_rank and (method != "distilled" or start is not None):
        raise ValueError("token_rank picks the KV Ridge start a distillation fits itself (method distilled, no start)")
    if method != "distilled":
        return await fit_direction(sender, receiver, method=method, texts=texts, seed=seed, version=version,
                                   max_tokens=max_tokens, progress=progress)  # fmt: skip
    if start is not None and start.manifest.method != "kv-ridge":
        raise ValueError(f"a distillation starts from a kv-ridge map, not {start.manifest.method!r}")
    base = start or await fit_direction(
        sender, receiver, method="kv-ridge", texts=texts, seed=seed, version=f"{version}-start",
        max_tokens=max_tokens, token_rank=token_rank, progress=progress,
    )  # fmt: skip
    return await distill_direction(sender, receiver, base, contexts=distill_contexts(seed, distill_docs),
                                   version=version, seed=seed, steps=distill_steps, path=distill_path,
                                   lr=distill_lr, clip=distill_clip, progress=progress)  # fmt: skip
