"""Bounded load against a live gateway: M concurrent conversations, each several hops across the
roles (and so the model families), for a fixed time, over HTTP.

    python -m bench.load --minutes 3 --conversations 4 --hops 5 [--adapter DIR ...] [--json out.json]

The command serves the gateway itself (uvicorn on loopback, in this process, embedded Redis and
SQLite under a temporary folder) with four roles on the three zoo models: planner (qwen2.5),
executor and reviewer (smollm2: the same-model hop), summarizer (gemma3). ``--adapter`` uploads
and promotes fitted artifacts first, so cross-family hops can transfer. ``run_load`` drives any
gateway (the tests give it theirs).

Each conversation starts from its own text, tagged with its id, and each hop sends the whole
history to the next role; conversations are spread over the client keys (tenants). A 429 is
counted and retried after Retry-After. Reported: throughput, TTFT p50/p95/p99 per path (the
gateway's own ``ttft_ms``), 429s, errors, peak bytes per store tier against its budget (from
``/metrics``, polled), and the check that every conversation's stored latest turn is its own: its
text carries the conversation's tag and no other's (``verify`` reads it from Redis).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import re
import statistics
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import httpx

from bench.load_verify import Verify
from heterofold.corpus import stdlib_text

QUESTIONS = ("What is this about?", "Name one function it mentions.", "Summarize it in one sentence.",
             "What would you check first?", "Anything missing?")  # fmt: skip
TIER = re.compile(r'^heterofold_tier_(bytes|budget_bytes)\{tier="(\w+)"\} (\S+)$', re.M)
ROUTE = re.compile(r'^heterofold_transfer_seconds_count\{route="([^"]+)"\} (\S+)$', re.M)


@dataclass(frozen=True)
class LoadConfig:
    url: str
    keys: tuple[str, ...]  # client keys: conversations are spread over them (one tenant each)
    roles: tuple[str, ...]
    conversations: int = 4  # running at once
    hops: int = 4
    duration_s: float = 60.0
    context_chars: int = 1200
    max_tokens: int = 8
    seed: int = 0

    def __post_init__(self) -> None:
        if self.conversations < 1 or self.hops < 1 or self.duration_s <= 0 or not self.keys or not self.roles:
            raise ValueError("need conversations, hops, a duration, keys and roles")


@dataclass
class LoadReport:
    seconds: float = 0.0
    ttft_ms: dict[str, list[float]] = field(default_factory=dict)  # per path
    completion_tokens: int = 0
    rate_limited: int = 0
    errors: Counter[str] = field(default_factory=Counter)  # "status code" -> count
    conversations: list[tuple[str, str, str]] = field(default_factory=list)  # (key, id, tag) of each answered
    peak_bytes: dict[str, int] = field(default_factory=dict)
    budget_bytes: dict[str, int] = field(default_factory=dict)
    transfers: dict[str, int] = field(default_factory=dict)  # per route ("sender -> receiver" engines)
    own_history: int = 0  # conversations whose latest stored turn is their own
    lost: list[str] = field(default_factory=list)  # conversations with no stored turn
    crossed: list[str] = field(default_factory=list)  # conversations whose turn carries another's tag

    @property
    def requests(self) -> int:
        return sum(len(v) for v in self.ttft_ms.values())

    def summary(self) -> dict[str, Any]:
        def summarize(xs: list[float]) -> dict[str, float]:
            qs = statistics.quantiles(xs, n=100, method="inclusive") if len(xs) > 1 else [xs[0]] * 99
            return {"n": len(xs), "p50": round(qs[49], 1), "p95": round(qs[94], 1), "p99": round(qs[98], 1)}

        return {
            "seconds": round(self.seconds, 1),
            "conversations": len(self.conversations),
            "requests": self.requests,
            "requests_per_s": round(self.requests / self.seconds, 3) if self.seconds else 0.0,
            "completion_tokens_per_s": round(self.completion_tokens / self.seconds, 2) if self.seconds else 0.0,
            "ttft_ms": {path: summarize(xs) for path, xs in sorted(self.ttft_ms.items())},
            "transfers_per_route": self.transfers,
            "rate_limited_429": self.rate_limited,
            "errors": dict(self.errors),
            "peak_tier_bytes": self.peak_bytes,
            "tier_budget_bytes": self.budget_bytes,
            "within_budget": all(self.peak_bytes[t] <= self.budget_bytes.get(t, 0) for t in self.peak_bytes),
            "own_history": self.own_history,
            "lost": self.lost,
            "crossed": self.crossed,
        }


async def run_load(cfg: LoadConfig, verify: Verify | None = None) -> LoadReport:
    report = LoadReport()
    deadline = time.monotonic() + cfg.duration_s
    t0 = time.monotonic()
    async with httpx.AsyncClient(base_url=cfg.url, timeout=600) as http:
        watcher = asyncio.create_task(_watch_tiers(http, report))
        try:
            await asyncio.gather(*(_conversations(http, cfg, i, report, deadline) for i in range(cfg.conversations)))
        finally:
            watcher.cancel()
        await _read_tiers(http, report)
    report.seconds = time.monotonic() - t0
    if verify is not None:
        await asyncio.to_thread(_verify, report, verify)
    return report


async def _conversations(http: httpx.AsyncClient, cfg: LoadConfig, i: int, report: LoadReport, deadline: float) -> None:
    """Worker ``i``: one conversation after another until the deadline."""
    k = 0
    while time.monotonic() < deadline:
        cid, key = f"load-{cfg.seed}-{i}-{k}", cfg.keys[i % len(cfg.keys)]
        tag = f"[conversation {cid}]"
        text = stdlib_text(cfg.context_chars, start=cfg.seed * 1009 + i * 37 + k * 5)
        messages = [{"role": "user", "content": f"{tag}\n{text}\n\n{QUESTIONS[0]}"}]
        for hop in range(cfg.hops):
            if time.monotonic() >= deadline:
                break
            role = cfg.roles[(i + hop) % len(cfg.roles)]
            reply = await _ask(http, cfg, key, role, cid, messages, report)
            if reply is None:
                break
            if hop == 0:  # answered at least once: its history must be stored, and be its own
                report.conversations.append((key, cid, tag))
            messages += [{"role": "assistant", "content": reply},
                         {"role": "user", "content": QUESTIONS[(hop + 1) % len(QUESTIONS)]}]  # fmt: skip
        k += 1


async def _ask(
    http: httpx.AsyncClient, cfg: LoadConfig, key: str, role: str, cid: str, messages: list[dict[str, str]],
    report: LoadReport,
) -> str | None:  # fmt: skip
    body = {"messages": messages, "max_tokens": cfg.max_tokens, "temperature": 0}
    headers = {"Authorization": f"Bearer {key}", "X-Conversation-Id": cid}
    while True:
        try:
            r = await http.post(f"/v1/agents/{role}/chat/completions", json=body, headers=headers)
        except httpx.HTTPError as exc:
            report.errors[type(exc).__name__] += 1
            return None
        if r.status_code == 429:
            report.rate_limited += 1
            await asyncio.sleep(float(r.headers.get("retry-after", "1")))
            continue
        if r.status_code != 200:
            report.errors[str(r.status_code)] += 1
            return None
        out = r.json()
        hf = out["usage"]["heterofold"]
        report.ttft_ms.setdefault(hf["path"], []).append(hf["ttft_ms"])
        report.completion_tokens += out["usage"]["completion_tokens"]
        reply: str = out["choices"][0]["message"]["content"]
        return reply


async def _read_tiers(http: httpx.AsyncClient, report: LoadReport) -> None:
    text = (await http.get("/metrics")).text
    for kind, tier, value in TIER.findall(text):
        if kind == "bytes":
            report.peak_bytes[tier] = max(report.peak_bytes.get(tier, 0), int(float(value)))
        else:
            report.budget_bytes[tier] = int(float(value))
    report.transfers = {route: int(float(n)) for route, n in ROUTE.findall(text)}


async def _watch_tiers(http: httpx.AsyncClient, report: LoadReport, every_s: float = 0.5) -> None:
    while True:
        with contextlib.suppress(httpx.HTTPError):
            await _read_tiers(http, report)
        await asyncio.sleep(every_s)


def _verify(report: LoadReport, verify: Verify) -> None:
    tags = [tag for _, _, tag in report.conversations]
    for key, cid, tag in report.conversations:
        text = verify(key, cid)
        if text is None:
            report.lost.append(cid)
        elif tag not in text or sum(t in text for t in tags) != 1:
            report.crossed.append(cid)
        else:
            report.own_history += 1


def main(argv: list[str] | None = None) -> None:
    from bench.load_server import serve_for_load  # the gateway and models: only for the command

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], prog="python -m bench.load")
    p.add_argument("--minutes", type=float, default=3.0)
    p.add_argument("--conversations", type=int, default=4)
    p.add_argument("--hops", type=int, default=5)
    p.add_argument("--context-chars", type=int, default=1200)
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--adapter", action="append", default=[], help="fitted artifact folder to upload and promote")
    p.add_argument("--json", help="write the report here")
    args = p.parse_args(argv)
    with serve_for_load(args.adapter) as (url, keys, roles, verify):
        cfg = LoadConfig(url, keys, roles, args.conversations, args.hops, args.minutes * 60, args.context_chars,
                         args.max_tokens)  # fmt: skip
        summary = asyncio.run(run_load(cfg, verify)).summary()
    print(json.dumps(summary, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=2)


if __name__ == "__main__":
    main()
