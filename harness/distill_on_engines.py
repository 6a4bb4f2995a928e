"""Distilling a fitted adapter end to end through the frozen receiver (``heterofold.distill``).

Training examples are built the way a hop is served: the context (stdlib docstrings, read at run
time) as a user message, processed by the sender; the receiver's prompt is the context, then a
generic question about it (``QUESTIONS``: wording and documents of their own, never the evaluation
suite's), then ``Answer:``; the receiver's native greedy answer (``answer_tokens``) is the target.
For each recompute budget in ``budgets`` the lexical selector (``engines.selectors``, as the eval runs it)
chooses context tokens, and ``path`` says what a document does with them, as the path the map is
fitted for serves them:
- ``recompute``: the chosen tokens stay native, as selective recompute leaves them: the map learns
  to be a background that helps the recomputed tokens, not one that competes with them. During
  fitting they take their native KV from a full native prefill (the recompute's exact result when
  the rest of the cache is native; the approximation a fit can afford);
- ``quote``: the whole context is mapped and the chosen spans are quoted as text between the
  context and the question (``heterofold.select.quote_into``, as the gateway's ``map_quote`` hop
  and the eval's ``{method}+quote`` path build it); the target is the receiver's answer with its
  native context and the same quoted suffix, so the map learns to be a background that leaves the
  receiver reading the quote as it would with its own cache.
Budget 0 is map-only under either path.

Steps cycle over the training documents; every ``eval_every`` steps the held-out KL is measured
and the best parameters so far are kept (early stopping, since a small corpus overfits).
"""

from __future__ import annotations

import functools
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import replace

import torch

from engines.base import SamplingParams
from engines.hf_cache import import_kv
from engines.local import LocalEngine
from engines.selectors import LEXICAL, Evidence, HopText, candidates, select
from harness.evaluate import eval_hop, receiver_prompt
from heterofold.adapter import Adapter
from heterofold.align import shared_sections
from heterofold.distill import DistillDoc, LowRankResidual, doc_features, kl_loss, split_docs
from heterofold.kv import KVCache
from heterofold.select import elide, quote_into, sentence_spans
from heterofold.tasks import TaskItem

QUESTIONS = (
    "What is the main topic of the text above?",
    "Which function or class does the text above describe, and what does it do?",
    "What does the text above say about {word}?",
    "Repeat the sentence of the text above that mentions {word}.",
)
Features = tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...], torch.Tensor, torch.Tensor | None]
PATHS = ("recompute", "quote")  # what a document does with the selector's choice (module docstring)
Progress = Callable[[str, int, int], None]


def _question(rng: random.Random, context: str, template: str | None = None) -> str:
    """A generic question (``template``, default a random one of ``QUESTIONS``); where it names a
    word, a long word from a random sentence of the context."""
    template = template or rng.choice(QUESTIONS)
    if "{word}" not in template:
        return template
    spans = sentence_spans(context)
    for _ in range(20):
        a, b = rng.choice(spans)
        words = [w.strip(".,:;()'\"`") for w in context[a:b].split()]
        words = [w for w in words if len(w) >= 7 and w.isalpha()]
        if words:
            return template.format(word=rng.choice(words))
    return QUESTIONS[0]


def questions_for(rng: random.Random, context: str, n: int) -> list[str]:
    """``n`` generic questions about ``context``: for one, ``_question``'s draw; for more, every
    template once in a random order before any repeats (a word template names a new word each time)."""
    if n == 1:
        return [_question(rng, context)]
    templates = list(QUESTIONS)
    rng.shuffle(templates)
    return [_question(rng, context, t) for t in (templates * n)[:n]]


async def _native_doc(
    receiver: LocalEngine,
    adapter: Adapter,
    hop: HopText,
    answer_tokens: int,
    dense: KVCache,
    features: dict[object, Features] | None = None,
) -> DistillDoc:
    """A document over ``hop``'s receiver prompt: every aligned context token up to the
    transferable prefix mapped, the rest of the prompt and the receiver's native greedy answer as
    the suffix, and native's log-probabilities over that answer as the target. ``dense``: the
    dense native prefill of the context already made, used when its tokens are exactly this hop's
    prefix (else this hop's own prefix is prefilled). ``features``: the map's inputs already
    computed, by sender text and alignment (the documents of one context share them, read only)."""
    r_ids = list(hop.receiver_ids)
    prefix = hop.transferable_prefix()
    src = hop.source(prefix)
    if dense.token_ids.tolist() != r_ids[:prefix]:
        dense, _ = await receiver.prefill(r_ids[:prefix], dense=True)
    past = dense.windowed(receiver.spec.windows)  # the context once: the answer and its scores continue from it
    answer = list((await receiver.complete(r_ids, SamplingParams(max_tokens=answer_tokens), past=past)).token_ids)
    native = await receiver.score(r_ids + answer, past=past)  # (S, V)
    q = len(r_ids) - prefix  # suffix index of the first answer token
    rows = slice(q - 1, q - 1 + len(answer))
    cache = {} if features is None else features
    key = (hop.sender_text, tuple(src.tolist()), tuple(dense.token_ids.tolist()))
    if key not in cache:
        cache[key] = doc_features(adapter, hop.sender_kv, src, dense.token_ids, receiver.token_embeddings())
    x_k, x_v, aligned, z = cache[key]
    target = torch.log_softmax(native[rows].float(), -1)
    return DistillDoc(
        x_k=x_k, x_v=x_v, mapped=aligned, native_k=dense.keys, native_v=dense.values, token_ids=dense.token_ids,
        suffix=torch.tensor(r_ids[prefix:] + answer), answer_rows=rows, target=target, z=z,
    )  # fmt: skip


def keep_native(doc: DistillDoc, positions: Sequence[int]) -> DistillDoc:
    """``doc`` with ``positions`` native instead of mapped (selective recompute's cache)."""
    chosen = {int(p) for p in positions}
    mask = torch.tensor([int(p) not in chosen for p in doc.mapped], dtype=torch.bool)
    return replace(doc, x_k=tuple(x[mask] for x in doc.x_k), x_v=tuple(x[mask] for x in doc.x_v),
                   mapped=doc.mapped[mask], z=None if doc.z is None else doc.z[mask])  # fmt: skip


def quoted_hop(receiver: LocalEngine, hop: HopText, context: str, question: str, positions: Sequence[int]) -> HopText:
    """``hop`` with the spans of ``positions`` (receiver tokens) quoted between the context and the
    question, as the eval's ``{method}+quote`` path and the gateway's ``map_quote`` hop place them."""
    quoted = elide(hop.receiver_text, [hop.receiver_offsets[j] for j in positions])
    content = f"{context}\n\nQuestion: {question}"
    shared = [(s.receiver_start, s.length) for s in hop.sections]
    quoted_content, _ = quote_into(content, hop.receiver_text.rfind(content), shared, quoted)
    text = receiver_prompt(receiver, quoted_content)
    enc = receiver.encode(text)
    return HopText(hop.sender_kv, hop.sender_text, hop.sender_offsets, text, enc.ids, enc.offsets,
                   shared_sections(hop.sender_text, text, [context]), hop.question)  # fmt: skip


async def build_docs(
    sender: LocalEngine,
    receiver: LocalEngine,
    adapter: Adapter,
    contexts: Sequence[str],
    *,
    budgets: Sequence[float] = (0.0, 0.02),
    path: str = "recompute",
    answer_tokens: int = 32,
    questions: int = 1,
    seed: int = 0,
    progress: Progress | None = None,
) -> list[list[DistillDoc]]:
    """Per context, one ``DistillDoc`` per budget and question (``questions`` of them, different
    templates first: ``questions_for``), built for ``path`` (module docstring). A context's
    documents stay together, so held-out contexts hold out every question about them."""
    if path not in PATHS:
        raise ValueError(f"unknown distillation path {path!r}: {', '.join(PATHS)}")
    if questions < 1:
        raise ValueError(f"questions must be at least 1, got {questions}")
    rng = random.Random(seed)
    out = []
    for n, context in enumerate(contexts):
        docs = []
        context_kv: KVCache | None = None
        features: dict[object, Features] = {}  # shared by this context's documents (the largest part of each)
        for question in questions_for(rng, context, questions):
            hop = await eval_hop(sender, receiver, TaskItem(f"fit-{n}", context, question, "-"))
            prefix = hop.transferable_prefix()
            ev = Evidence(hop, candidates(hop, prefix))
            if context_kv is None:  # the context's prefill, shared by its questions (``_native_doc`` checks it)
                context_kv, _ = await receiver.prefill(hop.receiver_ids[:prefix], dense=True)
            plain = await _native_doc(receiver, adapter, hop, answer_tokens, context_kv, features)
            for b in budgets:
                chosen = (await select(LEXICAL, ev, b)).positions if b else []
                if not b:
                    docs.append(plain)
                elif path == "quote":
                    docs.append(await _native_doc(receiver, adapter,
                                                  quoted_hop(receiver, hop, context, question, chosen),
                                                  answer_tokens, context_kv, features))  # fmt: skip
                else:
                    docs.append(keep_native(plain, chosen))
        out.append(docs)
        if progress:
            progress("collect", n + 1, len(contexts))
    return out


def _loss(receiver: LocalEngine, param: LowRankResidual, doc: DistillDoc) -> torch.Tensor:
    """KL of the receiver's answer distributions over ``doc``'s mapped context (worker thread)."""
    spec, model = receiver.spec, receiver.model
    keys, values = param.context_kv(doc)
    T = doc.token_ids.shape[0]
    kv = KVCache(spec.fingerprint, doc.token_ids, torch.arange(T), tuple(keys), tuple(values), (0,) * len(keys))
    cache = import_kv(kv.windowed(spec.windows), model.config, spec, receiver.device, receiver.dtype)
    S = doc.suffix.shape[0]
    pos = torch.arange(T, T + S, device=receiver.device)[None]  # (1, S): the suffix after the context
    out = model(input_ids=doc.suffix.to(receiver.device)[None], position_ids=pos, cache=cache, use_cache=True,
                logits_to_keep=0)  # fmt: skip
    return kl_loss(out.logits[0, doc.answer_rows], doc.target)


async def distill(
    receiver: LocalEngine,
    adapter: Adapter,
    docs: Sequence[Sequence[DistillDoc]],
    *,
    method: str,
    version: str,
    fit_info: dict[str, object],
    steps: int = 300,
    rank: int = 8,
    gates: bool = False,
    token: bool = False,
    lr: float = 2e-3,
    penalty: float = 1e-2,
    held: int = 3,
    eval_every: int = 25,
    clip: float | None = None,
    seed: int = 0,
    progress: Progress | None = None,
) -> Adapter:
    """Distil ``adapter`` on ``docs`` (from ``build_docs``); returns the folded adapter with the
    held-out KL before and after in its metrics. ``clip``: the largest gradient norm a step takes
    (larger ones are scaled down to it; none: unclipped). ``token``: also fit a residual on a token
    map's weights (``heterofold.distill.LowRankResidual``)."""
    train, held_out = split_docs(len(docs), held)
    param = LowRankResidual(adapter, rank=rank, seed=seed, gates=gates, token=token)
    opt = torch.optim.Adam(param.parameters(), lr=lr)
    order = [d for i in train for d in docs[i]]
    rng = random.Random(seed)
    t0 = time.perf_counter()

    def held_kl() -> float:
        with torch.no_grad():
            vals = [float(_loss(receiver, param, d)) for i in held_out for d in docs[i]]
        return sum(vals) / len(vals) if vals else float("nan")

    def train_step(doc: DistillDoc) -> float:
        with torch.enable_grad():
            opt.zero_grad()
            loss = _loss(receiver, param, doc)
            (loss + penalty * param.penalty()).backward()
            if clip is not None:
                torch.nn.utils.clip_grad_norm_(param.parameters(), clip)
            opt.step()
        return float(loss.detach())

    def snapshot() -> dict[str, torch.Tensor]:
        return {k: v.detach().clone() for k, v in param.state_dict().items()}

    # One job per step on the receiver's worker: requests it serves meanwhile interleave.
    before = await receiver.run_exclusive(held_kl)
    best, best_state, best_step = before, snapshot(), 0
    history: list[tuple[int, float, float]] = []
    losses: list[float] = []
    for step in range(1, steps + 1):
        doc = rng.choice(order)
        losses.append(await receiver.run_exclusive(functools.partial(train_step, doc)))
        if step % eval_every == 0 or step == steps:
            kl = await receiver.run_exclusive(held_kl)
            recent = losses[-eval_every:]
            history.append((step, round(sum(recent) / len(recent), 4), round(kl, 4)))
            if kl < best:
                best, best_state, best_step = kl, snapshot(), step
        if progress:
            progress("distill", step, steps)
    param.load_state_dict(best_state)
    metrics = dict(adapter.manifest.metrics)
    metrics |= {
        "held_out_answer_kl_before_distill": round(before, 4),
        "held_out_answer_kl_after_distill": round(best, 4),
        "distill_best_step": best_step,
        "distill_history": history,  # (step, mean training KL since the last, held-out KL)
    }
    info = {**adapter.manifest.fit, **fit_info, "distill_s": round(time.perf_counter() - t0, 1)}
    info |= {"steps": steps, "rank": rank, "gates": gates, "token_residual": token, "lr": lr, "penalty": penalty,
             "clip": clip, "train_docs": len(train), "held_docs": len(held_out)}  # fmt: skip
    return param.fold(method, version, info, metrics)
