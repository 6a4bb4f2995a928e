"""Helpers the gateway, dashboard and reliability tests share (not tests themselves): one
conversation turn through the OpenAI client, adapter uploads, a cross-family hop, an identity
adapter artifact, a small random adapter of the right shapes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from engines.local import LocalEngine
from heterofold.adapter import Adapter, LayerMap, Manifest, Side
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


def small_adapter(sender: LocalEngine, receiver: LocalEngine, version: str, seed: int) -> Adapter:
    """A real artifact of the right shapes with small random maps: fitting one takes a minute, and
    these tests exercise the registry, the jobs and the pages, not the map's quality."""
    s, r = Side.of(sender.spec), Side.of(receiver.spec)
    g = torch.Generator().manual_seed(seed)
    f_in, out = s.num_kv_heads * s.head_dim, r.num_kv_heads * r.head_dim

    def weight() -> torch.Tensor:
        return torch.randn(f_in, out, generator=g) * 0.02  # (H_s * D_s, H_r * D_r): one sender layer per layer

    maps = [LayerMap(weight(), torch.zeros(out), weight(), torch.zeros(out)) for _ in range(r.num_layers)]
    layers = tuple((round(i * (s.num_layers - 1) / max(r.num_layers - 1, 1)),) for i in range(r.num_layers))
    metrics = {"mean_r2_k": 0.41 + 0.01 * seed, "mean_r2_v": 0.37, "held_out_r2_k": [0.4, 0.42]}
    return Adapter(Manifest("kv-ridge", version, s, r, layers, fit={"seed": seed}, metrics=metrics), maps)
