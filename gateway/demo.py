"""``heterofold demo``: a planner -> executor -> summarizer conversation over HTTP, across the three
families, on a long shared context; for each hop the path, TTFT, tokens transferred and prefill
saved, next to the same hop prefilled natively (no conversation id) for comparison."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

import httpx

from heterofold.corpus import stdlib_text

TASK = "List the three most important functions described above, one line each."


@dataclass(frozen=True)
class HopResult:
    role: str
    model: str
    text: str
    usage: dict[str, Any]
    wall_ms: float
    native_ttft_ms: float | None


def _chat(http: httpx.Client, role: str, content: str, conversation: str | None, max_tokens: int) -> dict[str, Any]:
    """One hop; without a conversation, a plain native prefill (``kv_reuse`` off) for comparison."""
    headers = {"X-Conversation-Id": conversation} if conversation else {}
    body = {
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "kv_reuse": bool(conversation),
    }
    r = http.post(f"/v1/agents/{role}/chat/completions", json=body, headers=headers)
    if r.status_code != 200:
        raise RuntimeError(f"{role}: HTTP {r.status_code}: {r.text[:300]}")
    out: dict[str, Any] = r.json()
    return out


def run_demo(url: str, key: str | None, *, context_chars: int = 6000, max_tokens: int = 48,
             compare: bool = True) -> list[HopResult]:  # fmt: skip
    conversation = f"demo-{uuid.uuid4().hex[:8]}"
    context = f"Session {conversation}.\n\n{stdlib_text(context_chars, start=11)}"  # nothing cached from earlier runs
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    results: list[HopResult] = []
    with httpx.Client(base_url=url, headers=headers, timeout=600) as http:
        models = {m["id"]: m["engine_model"] for m in http.get("/v1/models").json()["data"]}
        plan = result = ""
        for role in ("planner", "executor", "summarizer"):
            if role == "planner":
                content = f"{context}\n\nTask: {TASK}"
            elif role == "executor":
                content = f"{context}\n\nTask: {TASK}\n\nPlan:\n{plan}\n\nCarry out the plan."
            else:
                content = f"{context}\n\nTask: {TASK}\n\nPlan:\n{plan}\n\nResult:\n{result}\n\nSummarize the result."
            t0 = time.perf_counter()
            reply = _chat(http, role, content, conversation, max_tokens)
            wall = (time.perf_counter() - t0) * 1000
            text = reply["choices"][0]["message"]["content"]
            native = _chat(http, role, content, None, 1)["usage"]["heterofold"]["ttft_ms"] if compare else None
            results.append(HopResult(role, models.get(role, "?"), text, reply["usage"], wall, native))
            plan, result = (text, result) if role == "planner" else (plan, text)
    return results
