"""Helpers the gateway and reliability tests share (not tests themselves): one conversation turn
through the OpenAI client, adapter uploads, a cross-family hop, an identity adapter artifact."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engines.local import LocalEngine
from heterofold.adapter import Adapter, LayerMap, Side
from heterofold.corpus import stdlib_text
from tests.gateway.conftest import Gateway

CONTEXT = stdlib_text(1400, start=5)


def ask(gateway: Gateway, role: str, messages: list[dict[str, str]], conversation: str) -> tuple[str, Any, int]:
    reply = gateway.agent(role).chat.completions.create(
        model=role,
        messages=messages,
        extra_headers={"X-Conversation-Id": conversation},  # type: ignore[arg-type]
    )
    assert reply.usage is not None and reply.usage.prompt_tokens_details is not None
    return (
        reply.choices[0].message.content or "",
        (reply.usage.model_extra or {})["heterofold"],
        (reply.usage.prompt_tokens_details.cached_tokens),
    )


def upload(gateway: Gateway, folder: Path, promote: bool = True) -> dict[str, Any]:
    with gateway.http() as admin:
        files = {
            "manifest": (folder / "manifest.json").read_bytes(),
            "weights": (folder / "adapter.safetensors").read_bytes(),
        }
        r = admin.post("/admin/adapters", files=files)
        assert r.status_code == 201, r.text
        row: dict[str, Any] = r.json()
        if promote:
            r = admin.post(f"/admin/adapters/{row['id']}/promote")
            assert r.status_code == 200 and r.json()["status"] == "active"
    return row


def cross_hop(gateway: Gateway, conversation: str) -> dict[str, object]:
    ask(gateway, "executor", [{"role": "user", "content": CONTEXT}], conversation)
    gateway.settle()
    reply, hf, cached = ask(gateway, "summarizer", [{"role": "user", "content": f"{CONTEXT}\n\nSummarize."}],
                            conversation)  # fmt: skip
    assert reply and cached == 0
    gateway.settle()
    return dict(hf)


def saved_identity(engine: LocalEngine, folder: Path, fingerprint: str | None = None) -> Path:
    side = Side.of(engine.spec)
    if fingerprint:
        side = Side(side.name, fingerprint, side.num_layers, side.num_kv_heads, side.head_dim, side.rope_thetas)
    ident = Adapter.identity(side, "identity-upload")
    maps = [LayerMap(*(t.clone() for t in (m.k_weight, m.k_bias, m.v_weight, m.v_bias))) for m in ident.maps]
    Adapter(ident.manifest, maps).save(folder)
    return folder
