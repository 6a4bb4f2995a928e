"""The gateway ``python -m bench.load`` drives: served in this process on loopback with four roles on
the three zoo models, embedded Redis and SQLite in a temporary folder, two client keys (tenants)."""

from __future__ import annotations

import asyncio
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from bench.load_verify import Verify
from gateway.app import create_app
from gateway.services import Services
from gateway.settings import AuthSettings, GenerationDefaults, RoleSettings, Settings, StoreSettings, TransferPolicy

KEYS = ("sk-load-tenant-a", "sk-load-tenant-b")
ADMIN = "sk-load-admin"
QWEN, SMOL, GEMMA = "qwen2.5-coder-0.5b-instruct", "smollm2-135m-instruct", "gemma3-270m"
GiB = 1 << 30


def load_settings(data_dir: Path) -> Settings:
    policy = TransferPolicy(min_uncached_tokens=32, recompute_budget=0.1)

    def role(engine: str, prompt: str) -> RoleSettings:
        return RoleSettings(engine=engine, system_prompt=prompt, generation=GenerationDefaults(max_tokens=8),
                            policy=policy)  # fmt: skip

    return Settings(
        data_dir=data_dir,
        roles={
            "planner": role(QWEN, "You are the planner."),
            "executor": role(SMOL, "You are the executor."),
            "reviewer": role(SMOL, "You are the reviewer."),
            "summarizer": role(GEMMA, "Summarize."),
        },
        auth=AuthSettings(client_keys=list(KEYS), admin_key=ADMIN),  # type: ignore[arg-type]
        store=StoreSettings(cpu_budget_bytes=GiB // 2, ssd_budget_bytes=2 * GiB),
    )


def conversation_reader(services: Services) -> Verify:
    """Reads a conversation's latest stored turn straight from Redis, as the next hop would."""

    def read(key: str, conversation_id: str) -> str | None:
        tenant = services.keys.client(f"Bearer {key}")
        turn = services.chat.planner.conversations.latest(tenant, conversation_id)
        return None if turn is None else turn.text

    return read


@contextmanager
def serve_for_load(adapters: list[str]) -> Iterator[tuple[str, tuple[str, ...], tuple[str, ...], Verify]]:
    with tempfile.TemporaryDirectory(prefix="heterofold-load-") as tmp:
        settings = load_settings(Path(tmp))
        app = create_app(settings)
        server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
        thread = threading.Thread(target=lambda: asyncio.run(server.serve()), daemon=True)
        thread.start()
        while not server.started:
            if not thread.is_alive():
                raise RuntimeError("the gateway did not start")
            time.sleep(0.1)
        url = f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
        try:
            for folder in adapters:
                _upload(url, Path(folder))
            services: Any = app.state.services
            yield url, KEYS, tuple(settings.roles), conversation_reader(services)
        finally:
            server.should_exit = True
            thread.join(60)


def _upload(url: str, folder: Path) -> None:
    files = {
        "manifest": (folder / "manifest.json").read_bytes(),
        "weights": (folder / "adapter.safetensors").read_bytes(),
    }
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=120) as admin:
        r = admin.post("/admin/adapters", files=files)
        r.raise_for_status()
        admin.post(f"/admin/adapters/{r.json()['id']}/promote").raise_for_status()
