"""Gateway fixtures: a real uvicorn server on loopback per test, real Redis (embedded, or one the
test starts and stops), real SQLite (or PostgreSQL), and the real zoo models, loaded once per
session and shared by every app (smollm2 and gemma3 only, to keep CPU time down)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import uvicorn
from fastapi import FastAPI

from engines.local import LocalEngine
from gateway.app import create_app
from gateway.engine_pool import EnginePool, PooledEngine
from gateway.services import Services
from gateway.settings import (
    AuthSettings,
    EngineSettings,
    GenerationDefaults,
    RoleSettings,
    Settings,
    ShadowSettings,
    StoreSettings,
    TransferPolicy,
)
from harness.fit_on_engines import default_corpus, fit_direction
from heterofold.adapter import Adapter
from tests.migrations.conftest import database_url, postgres_url  # noqa: F401  (SQLite and PostgreSQL registries)

SMOL, GEMMA = "smollm2-135m-instruct", "gemma3-270m"
CLIENT_KEY, ADMIN_KEY = "sk-test-client", "sk-test-admin"


def make_settings(data_dir: Path, **overrides: Any) -> Settings:
    """Three roles on two models: executor and reviewer share smollm2 (the identity hop),
    summarizer runs gemma3 (the cross-family hop). Generation is greedy and short."""
    policy = TransferPolicy(min_uncached_tokens=32, recompute_budget=0.1)
    cross = policy.model_copy(update={"path": "transfer"})  # map + recompute; the served default has its own test
    short = GenerationDefaults(max_tokens=6)
    roles = {
        "executor": RoleSettings(engine=SMOL, system_prompt="You are the executor.", generation=short, policy=policy),
        "reviewer": RoleSettings(engine=SMOL, system_prompt="You are the reviewer.", generation=short, policy=policy),
        "summarizer": RoleSettings(engine=GEMMA, system_prompt="Summarize.", generation=short, policy=cross),
    }
    fields: dict[str, Any] = {
        "data_dir": data_dir,
        "engines": {
            SMOL: EngineSettings(model=SMOL, max_prompt_tokens=2048, max_tokens=64),
            GEMMA: EngineSettings(model=GEMMA, max_prompt_tokens=2048, max_tokens=64),
        },
        "roles": roles,
        "auth": AuthSettings(client_keys=[CLIENT_KEY], admin_key=ADMIN_KEY),  # type: ignore[list-item]
        "shadow": ShadowSettings(sample_rate=0.0, shadow_rate=0.0),
        "store": StoreSettings(cpu_budget_bytes=1 << 30, ssd_budget_bytes=1 << 30),
    }
    fields.update(overrides)
    return Settings(**fields)


@pytest.fixture(scope="session")
def pool(load_engine: Callable[[str], LocalEngine]) -> EnginePool:
    engines = {}
    for name in (SMOL, GEMMA):
        p = PooledEngine(name, load_engine(name), EngineSettings(model=name, max_prompt_tokens=2048, max_tokens=64))
        p.ms_per_token = 1.0  # a seed; native requests measure the real rate
        engines[name] = p
    return EnginePool(engines)


@dataclass
class Gateway:
    app: FastAPI
    url: str
    server: uvicorn.Server
    loop: asyncio.AbstractEventLoop

    @property
    def services(self) -> Services:
        services: Services = self.app.state.services
        return services

    def client(self, key: str = CLIENT_KEY, **kwargs: Any) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=key, max_retries=0, timeout=120, **kwargs)

    def agent(self, role: str, key: str = CLIENT_KEY) -> openai.OpenAI:
        """A client whose chat.completions go to /v1/agents/{role}/chat/completions."""
        return openai.OpenAI(base_url=f"{self.url}/v1/agents/{role}", api_key=key, max_retries=0, timeout=120)

    def http(self, key: str | None = ADMIN_KEY) -> httpx.Client:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=120)

    def settle(self, timeout_s: float = 120.0) -> None:
        """Wait for after-turn work (storing the turn's KV, events, shadow runs) to finish."""
        deadline = time.monotonic() + timeout_s
        while self.services.background.pending and time.monotonic() < deadline:
            future = asyncio.run_coroutine_threadsafe(self.services.background.drain(timeout_s), self.loop)
            future.result(timeout_s + 5)


def _serve(app: FastAPI) -> Iterator[Gateway]:
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    loops: list[asyncio.AbstractEventLoop] = []

    def run() -> None:
        loop = asyncio.new_event_loop()
        loops.append(loop)
        loop.run_until_complete(server.serve())
        loop.close()

    thread = threading.Thread(target=run, name="uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + 120
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the gateway did not start")
        time.sleep(0.05)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield Gateway(app, f"http://127.0.0.1:{port}", server, loops[0])
    finally:
        server.should_exit = True
        thread.join(60)


@pytest.fixture
def start_gateway(tmp_path: Path, pool: EnginePool) -> Iterator[Callable[..., Gateway]]:
    """Starts gateways on ``tmp_path`` sharing the session's engines; all stopped at the end."""
    stack: list[Iterator[Gateway]] = []

    def start(engines: EnginePool | None = None, **overrides: Any) -> Gateway:
        app = create_app(make_settings(tmp_path, **overrides), pool=engines or pool, own_pool=False)
        gen = _serve(app)
        stack.append(gen)
        return next(gen)

    yield start
    for gen in reversed(stack):
        next(gen, None)


@pytest.fixture
def gateway(start_gateway: Callable[..., Gateway]) -> Gateway:
    return start_gateway()


@pytest.fixture(scope="session")
def fitted_adapter(load_engine: Callable[[str], LocalEngine], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small smollm2 -> gemma3 adapter fitted once per session (about a minute); never committed."""
    sender, receiver = load_engine(SMOL), load_engine(GEMMA)
    adapter: Adapter = asyncio.run(
        fit_direction(sender, receiver, method="kv-ridge", texts=default_corpus(0, 4), seed=0, version="test-v1",
                      max_tokens=256)
    )  # fmt: skip
    folder = tmp_path_factory.mktemp("adapter") / "smollm2__gemma3"
    adapter.save(folder)
    return folder
