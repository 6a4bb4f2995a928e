"""The chat route on its own: what it hands the chat service and how it frames the answer (one
JSON body, or server-sent events), with the service and the caller's tenant swapped through
FastAPI's ``dependency_overrides`` (no engine, store or database)."""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from engines.errors import EngineBusy
from gateway.chat import TurnResult
from gateway.deps import client_tenant, get_chat
from gateway.errors import install_error_handlers
from gateway.routes.chat import router
from gateway.schemas import ChatRequest, HeteroFoldUsage, PromptTokensDetails, Usage

USAGE = Usage(prompt_tokens=7, completion_tokens=2, total_tokens=9, prompt_tokens_details=PromptTokensDetails(),
              heterofold=HeteroFoldUsage(path="native"))  # fmt: skip


@dataclass
class ScriptedChat:
    """Stands in for ``ChatService``: records each ``prepare`` call and streams ``deltas``."""

    deltas: tuple[str, ...] = ("Hel", "lo")
    busy: bool = False
    calls: list[dict[str, Any]] = field(default_factory=list)

    def prepare(self, *, role: str, request: ChatRequest, tenant: str, conversation_id: str | None) -> str:
        self.calls.append({"role": role, "tenant": tenant, "conversation_id": conversation_id, "request": request})
        return role

    async def stream(self, prepared: str) -> AsyncGenerator[str | TurnResult, None]:
        if self.busy:
            raise EngineBusy("the engine's queue is full")
        for d in self.deltas:
            yield d
        yield TurnResult("".join(self.deltas), "stop", USAGE)


@pytest.fixture
def served() -> tuple[TestClient, ScriptedChat]:
    app = FastAPI()
    install_error_handlers(app)
    app.include_router(router)
    chat = ScriptedChat()
    app.dependency_overrides[get_chat] = lambda: chat
    app.dependency_overrides[client_tenant] = lambda: "tenant-a"
    return TestClient(app), chat


BODY = {"messages": [{"role": "user", "content": "hi"}]}


def test_the_route_passes_role_tenant_and_the_header_conversation_and_answers_one_body(
    served: tuple[TestClient, ScriptedChat],
) -> None:
    client, chat = served
    r = client.post("/v1/agents/summarizer", json=BODY, headers={"X-Conversation-Id": "conv-1"})
    assert r.status_code == 200, r.text
    assert r.headers["x-conversation-id"] == "conv-1"
    body = r.json()
    assert body["model"] == "summarizer" and body["choices"][0]["message"]["content"] == "Hello"
    assert body["usage"]["total_tokens"] == 9 and body["usage"]["heterofold"]["path"] == "native"
    [call] = chat.calls
    assert (call["role"], call["tenant"], call["conversation_id"]) == ("summarizer", "tenant-a", "conv-1")


def test_the_body_conversation_id_wins_over_the_header_and_model_names_the_role(
    served: tuple[TestClient, ScriptedChat],
) -> None:
    client, chat = served
    r = client.post("/v1/chat/completions", json={**BODY, "model": "executor", "conversation_id": "from-body"},
                    headers={"X-Conversation-Id": "from-header"})  # fmt: skip
    assert r.status_code == 200, r.text
    assert (chat.calls[0]["role"], chat.calls[0]["conversation_id"]) == ("executor", "from-body")


def test_chat_completions_without_model_is_a_400_before_the_service_is_asked(
    served: tuple[TestClient, ScriptedChat],
) -> None:
    client, chat = served
    r = client.post("/v1/chat/completions", json=BODY)
    assert r.status_code == 400 and r.json()["error"]["param"] == "model"
    assert chat.calls == []


def test_streaming_sends_the_deltas_then_finish_usage_and_done(served: tuple[TestClient, ScriptedChat]) -> None:
    client, _ = served
    r = client.post("/v1/agents/summarizer", json={**BODY, "stream": True, "stream_options": {"include_usage": True}})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = [line.removeprefix("data: ") for line in r.text.split("\n\n") if line]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert [c["choices"][0]["delta"].get("content") for c in chunks[:3]] == ["", "Hel", "lo"]
    assert chunks[3]["choices"][0]["finish_reason"] == "stop"
    assert chunks[4]["choices"] == [] and chunks[4]["usage"]["completion_tokens"] == 2


def test_an_error_before_the_first_token_is_a_plain_http_error(served: tuple[TestClient, ScriptedChat]) -> None:
    client, chat = served
    chat.busy = True
    r = client.post("/v1/agents/summarizer", json={**BODY, "stream": True})
    assert r.status_code == 429 and r.headers["content-type"].startswith("application/json")
    assert set(r.json()["error"]) >= {"message", "type", "code"}
