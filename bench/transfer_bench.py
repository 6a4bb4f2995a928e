"""``heterofold bench transfer``: TTFT of native prefill vs HeteroFold vs KV Ridge, one run.

The context is a builtin passkey item at the asked length (needle at 50% depth); the receiver
answers it through each path, ``repeats`` times, and the medians are compared as same-run ratios.
A transfer's TTFT covers everything from the sender KV in memory to the receiver's first token:
align, map, selective recompute, import, suffix prefill, first decode step. KV Ridge runs twice: as
the baseline (no recompute beyond the template tokens) and with HeteroFold's recompute budget
(``kv_ridge_recompute``), which isolates what the two maps cost at equal recompute.
The memory floor is the sender KV bytes read plus the receiver KV bytes written, at the memcpy
bandwidth measured in the same run; it is compared with the align-and-map time.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from engines.base import SamplingParams
from engines.local import LocalEngine
from engines.selectors import make_selector
from engines.transfer import transfer
from harness.evaluate import eval_hop
from heterofold.adapter import Adapter
from heterofold.suite import builtin_suite


def memcpy_bandwidth(nbytes: int = 256 << 20, repeats: int = 5) -> float:
    """Bytes per second of a plain copy of fresh-enough memory (median of ``repeats``)."""
    src = np.ones(nbytes, dtype=np.uint8)
    dst = np.empty_like(src)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        times.append(time.perf_counter() - t0)
    return nbytes / statistics.median(times)


@dataclass
class Timing:
    ttft_ms: list[float]
    map_ms: list[float]
    recompute_ms: list[float]


async def bench_transfer(
    sender: LocalEngine,
    receiver: LocalEngine,
    *,
    context: int,
    heterofold: Adapter,
    kv_ridge: Adapter | None,
    budget: float,
    repeats: int = 3,
    selector: str = "lexical",
) -> dict[str, Any]:
    item = next(i for i in builtin_suite(lengths=(context,)) if i.id.startswith("passkey") and "-d50-" in i.id)
    hop = await eval_hop(sender, receiver, item)
    s_kv, r_ids = hop.sender_kv, hop.receiver_ids
    chooser = make_selector(selector)
    first = SamplingParams(max_tokens=1)

    native: list[float] = []
    runs: dict[str, Timing] = {p: Timing([], [], []) for p in ("heterofold", "kv_ridge", "kv_ridge_recompute")}
    recomputed: dict[str, int] = {}
    mapped_bytes = 0
    for _ in range(repeats):
        out = await receiver.complete(r_ids, first)
        native.append(out.timings.ttft_ms)
        paths = (
            ("heterofold", heterofold, budget),
            ("kv_ridge", kv_ridge, 0.0),
            ("kv_ridge_recompute", kv_ridge, budget),
        )
        for path, adapter, fraction in paths:
            if adapter is None:
                continue
            t0 = time.perf_counter()
            tr = await transfer(adapter, hop, receiver, selector=chooser, budget=fraction, sender=sender)
            out = await receiver.complete(r_ids, first, past=tr.kv)
            runs[path].ttft_ms.append((time.perf_counter() - t0) * 1000 - out.timings.queue_ms)
            runs[path].map_ms.append(tr.align_ms + tr.map_ms)
            runs[path].recompute_ms.append(tr.recompute_ms)
            recomputed[path] = tr.recomputed
            mapped_bytes = tr.kv.nbytes
    bandwidth = memcpy_bandwidth()
    read_bytes = sum(s_kv.keys[s].nbytes + s_kv.values[s].nbytes for s in sender.spec.full_attention_layers)
    floor_ms = (read_bytes + mapped_bytes) / bandwidth * 1000
    med_native = statistics.median(native)
    result: dict[str, Any] = {
        "sender": sender.spec.name,
        "receiver": receiver.spec.name,
        "context_tokens": len(r_ids),
        "selector": chooser.name,
        "device": str(receiver.device),
        "repeats": repeats,
        "budget": budget,
        "native_ttft_ms": round(med_native, 1),
        "memcpy_gb_s": round(bandwidth / 1e9, 2),
        "memory_floor_ms": round(floor_ms, 2),
        "sender_bytes_read": read_bytes,
        "receiver_bytes_written": mapped_bytes,
    }
    for path, t in runs.items():
        if not t.ttft_ms:
            continue
        ttft = statistics.median(t.ttft_ms)
        result[path] = {
            "ttft_ms": round(ttft, 1),
            "speedup_vs_native": round(med_native / ttft, 2),
            "align_map_ms": round(statistics.median(t.map_ms), 1),
            "recompute_ms": round(statistics.median(t.recompute_ms), 1),
            "tokens_recomputed": recomputed[path],
            "align_map_over_floor": round(statistics.median(t.map_ms) / floor_ms, 2),
        }
    for path in ("kv_ridge", "kv_ridge_recompute"):
        if path in result:
            result[f"heterofold_speedup_vs_{path}"] = round(
                result[path]["ttft_ms"] / result["heterofold"]["ttft_ms"], 2
            )
    return result


def run_bench(sender: LocalEngine, receiver: LocalEngine, **kwargs: Any) -> dict[str, Any]:
    return asyncio.run(bench_transfer(sender, receiver, **kwargs))
