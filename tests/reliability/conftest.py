"""Reliability fixtures: the gateway suite's live server (uvicorn on loopback, real Redis, real
SQLite or PostgreSQL, the zoo models on CPU), plus helpers to ask it, read its metrics and events,
and get the native answer that every fault must still produce."""

from __future__ import annotations

import socket
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from sqlalchemy import create_engine, text

from gateway.settings import GenerationDefaults, RoleSettings, TransferPolicy
from heterofold.corpus import stdlib_text
from tests.gateway.conftest import (  # noqa: F401  (fixtures, re-exported)
    CLIENT_KEY,
    GEMMA,
    SMOL,
    Gateway,
    fitted_adapter,
    gateway,
    pool,
    start_gateway,
)

pytestmark = pytest.mark.models
Messages = list[dict[str, str]]

OTHER_KEY = "sk-test-tenant-b"  # a second tenant
POSTGRES = ("127.0.0.1", 5432)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def roles() -> dict[str, RoleSettings]:
    """The gateway suite's roles, except that the executor never takes the identity transfer from
    its own previous turn: its next hop is then exactly prefix reuse or native, whichever the store
    allows, and both must give the native answer."""
    policy = TransferPolicy(min_uncached_tokens=32, recompute_budget=0.1)
    cross = policy.model_copy(update={"path": "transfer"})  # map + recompute; the served default has its own test
    short = GenerationDefaults(max_tokens=6)
    executor = TransferPolicy(min_uncached_tokens=32, recompute_budget=0.1, same_model=False)
    return {
        "executor": RoleSettings(engine=SMOL, system_prompt="You are the executor.", generation=short, policy=executor),
        "reviewer": RoleSettings(engine=SMOL, system_prompt="You are the reviewer.", generation=short, policy=policy),
        "summarizer": RoleSettings(engine=GEMMA, system_prompt="Summarize.", generation=short, policy=cross),
    }


@pytest.fixture
def serve(start_gateway: Callable[..., Gateway]) -> Callable[..., Gateway]:  # noqa: F811
    """``start_gateway`` with ``roles()``."""
    return lambda **overrides: start_gateway(**{"roles": roles(), **overrides})


def chat(
    gw: Gateway, role: str, messages: Messages, conversation: str | None = None, *, key: str = CLIENT_KEY,
    kv_reuse: bool = True, timeout: float = 120,
) -> httpx.Response:  # fmt: skip
    """POST /v1/agents/{role}/chat/completions, greedy; the raw response (faults may answer 5xx)."""
    headers = {"Authorization": f"Bearer {key}"}
    if conversation:
        headers["X-Conversation-Id"] = conversation
    body = {"messages": messages, "temperature": 0, "kv_reuse": kv_reuse}
    return httpx.post(f"{gw.url}/v1/agents/{role}/chat/completions", json=body, headers=headers, timeout=timeout)


def answer(response: httpx.Response) -> tuple[str, dict[str, Any], int]:
    """(text, the usage's heterofold block, cached tokens) of a 200 answer."""
    assert response.status_code == 200, response.text
    body = response.json()
    usage = body["usage"]
    cached = usage["prompt_tokens_details"]["cached_tokens"]
    return body["choices"][0]["message"]["content"], usage["heterofold"], cached


def native(gw: Gateway, role: str, messages: Messages) -> str:
    """The answer the role's engine gives natively (no KV reused or stored): what a fault must not change."""
    text, hf, cached = answer(chat(gw, role, messages, kv_reuse=False))
    assert hf["path"] == "native" and cached == 0
    return text


def assert_openai_error(response: httpx.Response, status: int, code: str | None) -> None:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == code, error
    assert error["message"] and "Traceback" not in error["message"]


def metric(gw: Gateway, sample: str) -> float:
    """The value of one Prometheus sample, e.g. ``heterofold_oom_alerts_total{reason="no_space"}``;
    0 when absent."""
    text = httpx.get(f"{gw.url}/metrics", timeout=30).text
    for line in text.splitlines():
        if line.startswith(sample + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def events(gw: Gateway, kind: str) -> list[dict[str, str]]:
    return [e.fields for e in gw.services.store.events.read(count=10_000) if e.kind == kind]


def eventually(check: Callable[[], bool], timeout_s: float = 15.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {timeout_s} s")
        time.sleep(0.1)


def opening(doc: int, chars: int = 1400) -> Messages:
    return [{"role": "user", "content": f"{stdlib_text(chars, start=doc)}\n\nWhat is this about?"}]


def then(messages: Messages, reply: str, question: str) -> Messages:
    return [*messages, {"role": "assistant", "content": reply}, {"role": "user", "content": question}]


@pytest.fixture
def postgres_schema() -> Iterator[str]:
    """A fresh schema on the local PostgreSQL, dropped after the test (after its gateway stops)."""
    schema = f"hf_rel_{uuid.uuid4().hex[:10]}"
    admin = create_engine(f"postgresql+psycopg://postgres@{POSTGRES[0]}:{POSTGRES[1]}/test")
    with admin.begin() as conn:
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    yield schema
    with admin.begin() as conn:
        conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
    admin.dispose()
