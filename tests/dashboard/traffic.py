"""Chat traffic and adapter versions for the dashboard tests, through the public APIs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from heterofold.corpus import stdlib_text
from tests.gateway.conftest import Gateway

CONTEXT = stdlib_text(700, start=11)


def chat(gateway: Gateway, role: str, content: str, conversation: str, *, reuse: bool = True) -> dict[str, Any]:
    """One request to /v1/agents/{role}; returns the usage's ``heterofold`` block."""
    reply = gateway.agent(role).chat.completions.create(
        model=role,
        messages=[{"role": "user", "content": content}],
        extra_headers={"X-Conversation-Id": conversation},
        extra_body={"kv_reuse": reuse},
    )
    assert reply.usage is not None
    hf: dict[str, Any] = (reply.usage.model_extra or {})["heterofold"]
    gateway.settle()
    return hf


def register(gateway: Gateway, folder: Path) -> dict[str, Any]:
    files = {
        "manifest": (folder / "manifest.json").read_bytes(),
        "weights": (folder / "adapter.safetensors").read_bytes(),
    }
    with gateway.http() as admin:
        r = admin.post("/admin/adapters", files=files)
    assert r.status_code == 201, r.text
    row: dict[str, Any] = r.json()
    return row


def statuses(gateway: Gateway) -> dict[str, str]:
    """Version -> status, through the admin API."""
    with gateway.http() as admin:
        r = admin.get("/admin/adapters")
    assert r.status_code == 200, r.text
    return {a["version"]: a["status"] for a in r.json()}
