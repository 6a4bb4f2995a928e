"""The engine's SDPA (``engines/attention.py``) against transformers' own, paired in one run.

    python -m bench.kernel [MODEL ...] [--context 4096] [--repeats 5] [--json OUT]

Per zoo model: a builtin paraphrase item's context at about ``--context`` tokens prefilled once;
then, alternating the model's attention implementation between ``sdpa`` (transformers: a masked
pass repeats each key/value group to every query head) and ``heterofold_sdpa`` (the groups left to
the kernel on the CPU), the two passes a cross-family hop runs over such a cache: the question run
over it (``score``, the receiver's suffix prefill) and the sender's attention pass that
``sender-attention`` reads (``attention``; the probe itself reads each key group once under both).
Prints the median milliseconds of each and the same-run ratio, and checks that the logits agree.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from engines.attention import SDPA
from engines.local import LocalEngine
from engines.selectors import QUESTION_PROMPT
from heterofold.suite import builtin_suite

MODELS = ("smollm2-135m-instruct", "qwen2.5-coder-0.5b-instruct", "gemma3-270m")
KERNELS = ("sdpa", SDPA)


async def measure(name: str, context: int, repeats: int) -> dict[str, Any]:
    engine = LocalEngine.from_zoo(name)
    item = builtin_suite(lengths=(context,), kinds=("paraphrase",))[0]
    ids = engine.encode(engine.render([{"role": "user", "content": item.context}])).ids
    kv, _ = await engine.prefill(ids)
    asked = engine.encode(QUESTION_PROMPT.format(question=item.question), add_special_tokens=False).ids
    full = [*kv.token_ids.tolist(), *asked]
    ms: dict[str, dict[str, list[float]]] = {k: {"score": [], "attention": []} for k in KERNELS}
    logits: dict[str, torch.Tensor] = {}
    config = engine.model.config
    try:
        for _ in range(repeats):
            for kernel in KERNELS:
                config._attn_implementation = kernel
                t = time.perf_counter()
                logits[kernel] = await engine.score(full, past=kv)
                ms[kernel]["score"].append((time.perf_counter() - t) * 1000)
                t = time.perf_counter()
                await engine.attention(full, past=kv)
                ms[kernel]["attention"].append((time.perf_counter() - t) * 1000)
    finally:
        config._attn_implementation = SDPA
    med = {k: {p: round(statistics.median(v), 1) for p, v in by.items()} for k, by in ms.items()}
    return {
        "model": name,
        "context_tokens": kv.num_tokens,
        "question_tokens": len(asked),
        "groups": engine.spec.num_heads // engine.spec.num_kv_heads,
        "ms": med,
        "ratio": {p: round(med[SDPA][p] / med["sdpa"][p], 3) for p in ("score", "attention")},
        "max_abs_logit_diff": float((logits["sdpa"] - logits[SDPA]).abs().max()),
    }


def table(rows: list[dict[str, Any]]) -> str:
    out = [
        "| model | context | query heads per KV head | suffix pass ms: sdpa -> ours (ratio) "
        "| sender attention pass ms: sdpa -> ours (ratio) | max logit diff |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        a, b = r["ms"]["sdpa"], r["ms"][SDPA]
        out.append(
            f"| {r['model']} | {r['context_tokens']} | {r['groups']} | {a['score']:.0f} -> {b['score']:.0f} "
            f"({r['ratio']['score']:.2f}x) | {a['attention']:.0f} -> {b['attention']:.0f} "
            f"({r['ratio']['attention']:.2f}x) | {r['max_abs_logit_diff']:.1e} |"
        )
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="*", default=list(MODELS))
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    rows = []
    for name in args.models:
        rows.append(asyncio.run(measure(name, args.context, args.repeats)))
        print(json.dumps(rows[-1]), flush=True)
    print(table(rows))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"context": args.context, "repeats": args.repeats, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
