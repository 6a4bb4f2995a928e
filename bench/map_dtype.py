"""The map in float32 against bfloat16, paired: the same transfers, the same items, each dtype.

    python -m bench.map_dtype SENDER RECEIVER [--every 2] [--json OUT]

For every other builtin item at 1024 tokens (by default), HeteroFold transfers at budgets 0 and
0.02 with the map's matmuls in each dtype; prints and writes accuracy, first-token KL and top-1
agreement against native, and how many greedy answers agree in their first 40 characters.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path
from typing import Any

import torch

from engines.base import SamplingParams
from engines.local import LocalEngine
from engines.transfer import transfer
from harness.evaluate import eval_hop, fidelity, receiver_prompt
from heterofold.adapter import Adapter
from heterofold.suite import builtin_suite
from heterofold.tasks import is_correct

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
BUDGETS = (0.0, 0.02)


class _Pinned(Adapter):
    """The same adapter, its map always in one dtype."""

    def __init__(self, inner: Adapter, dtype: torch.dtype) -> None:
        super().__init__(inner.manifest, inner.maps)
        self.dtype = dtype

    def apply(self, *args: Any, **kwargs: Any) -> Any:
        return super().apply(*args, **{**kwargs, "dtype": self.dtype})


async def run(sender: LocalEngine, receiver: LocalEngine, adapter: Adapter, every: int) -> dict[str, Any]:
    greedy = SamplingParams(max_tokens=24)
    pinned = {name: _Pinned(adapter, dt) for name, dt in DTYPES.items()}
    rows = []
    for item in builtin_suite(lengths=(1024,))[::every]:
        r_text = receiver_prompt(receiver, f"{item.context}\n\nQuestion: {item.question}")
        r_enc = receiver.encode(r_text)
        r_ids = list(r_enc.ids)
        kv_n, _ = await receiver.prefill(r_ids[:-1])
        native = await receiver.complete(r_ids, greedy, past=kv_n)
        ref = await receiver.score(r_ids + list(native.token_ids), past=kv_n)
        hop = await eval_hop(sender, receiver, item)
        row: dict[str, Any] = {"id": item.id, "native": is_correct(item.answer, native.text)}
        for budget in BUDGETS:
            for name, ad in pinned.items():
                tr = await transfer(ad, hop, receiver, budget=budget)
                out = await receiver.complete(r_ids, greedy, past=tr.kv)
                kl, top1 = await fidelity(receiver, r_ids, list(native.token_ids), tr.kv, ref)
                row[f"{name}@{budget:g}"] = {
                    "correct": is_correct(item.answer, out.text), "kl": round(kl, 4), "top1": round(top1, 4),
                    "text": out.text[:40],
                }  # fmt: skip
        rows.append(row)
        print(json.dumps(row), flush=True)
    summary: dict[str, Any] = {"items": len(rows), "native_accuracy": sum(r["native"] for r in rows) / len(rows)}
    for key in (f"{n}@{b:g}" for b in BUDGETS for n in DTYPES):
        summary[key] = {
            out: round(sum(float(r[key][m]) for r in rows) / len(rows), 4)
            for out, m in (("accuracy", "correct"), ("kl", "kl"), ("top1", "top1"))
        }
    summary["same_answer_text"] = {
        f"{b:g}": sum(r[f"fp32@{b:g}"]["text"] == r[f"bf16@{b:g}"]["text"] for r in rows) for b in BUDGETS
    }
    return {"summary": summary, "items": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("sender")
    ap.add_argument("receiver")
    ap.add_argument("--every", type=int, default=2)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    sender = LocalEngine.from_zoo(args.sender, device="cpu")
    receiver = LocalEngine.from_zoo(args.receiver, device="cpu")
    adapter = Adapter.load(
        Path(f"artifacts/adapters/{args.sender}__{args.receiver}/heterofold"),
        sender_fingerprint=sender.spec.fingerprint,
        receiver_fingerprint=receiver.spec.fingerprint,
    )
    result = asyncio.run(run(sender, receiver, adapter, args.every))
    print(json.dumps(result["summary"], indent=1))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
