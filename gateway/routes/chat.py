"""The OpenAI chat-completions API, per role.

    POST /v1/agents/{role}/chat/completions     POST /v1/agents/{role}     (the same handler)
    POST /v1/chat/completions                   ``model`` names the role

The conversation is ``conversation_id`` in the body, else the ``X-Conversation-Id`` header.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Header
from fastapi.responses import JSONResponse, StreamingResponse

from gateway.chat import ChatService, TurnResult
from gateway.deps import ChatDep, TenantDep
from gateway.errors import InvalidRequest, to_response
from gateway.schemas import (
    CONVERSATION_ID,
    ChatCompletion,
    ChatCompletionChunk,
    ChatRequest,
    Choice,
    ChunkChoice,
    Delta,
    ResponseMessage,
)

router = APIRouter(prefix="/v1", tags=["chat"])
# ``stream: true`` answers with server-sent events
STREAMS: dict[int | str, dict[str, Any]] = {200: {"content": {"application/json": {}, "text/event-stream": {}}}}
ConversationHeader = Annotated[str | None, Header(pattern=CONVERSATION_ID)]


@router.post("/agents/{role}/chat/completions", response_model=None, responses=STREAMS)
@router.post("/agents/{role}", response_model=None, responses=STREAMS)
async def agent_chat(
    role: str, body: ChatRequest, chat: ChatDep, tenant: TenantDep, x_conversation_id: ConversationHeader = None
) -> JSONResponse | StreamingResponse:
    return await _answer(role, body, chat, tenant, body.conversation_id or x_conversation_id)


@router.post("/chat/completions", response_model=None, responses=STREAMS)
async def chat_completions(
    body: ChatRequest, chat: ChatDep, tenant: TenantDep, x_conversation_id: ConversationHeader = None
) -> JSONResponse | StreamingResponse:
    if not body.model:
        raise InvalidRequest("model must name a role", param="model")
    return await _answer(body.model, body, chat, tenant, body.conversation_id or x_conversation_id)


async def _answer(
    role: str, body: ChatRequest, chat: ChatService, tenant: str, conversation_id: str | None
) -> JSONResponse | StreamingResponse:
    prepared = chat.prepare(role=role, request=body, tenant=tenant, conversation_id=conversation_id)
    rid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
    headers = {"x-conversation-id": conversation_id} if conversation_id else {}
    items = chat.stream(prepared)
    first = await anext(items)  # errors before the first token (429, 400) answer as plain HTTP errors
    if not body.stream:
        try:
            result = first if isinstance(first, TurnResult) else await _drain(items)
        finally:
            await items.aclose()
        text = result.text
        completion = ChatCompletion(
            id=rid, created=created, model=role, conversation_id=conversation_id, usage=result.usage,
            choices=[Choice(message=ResponseMessage(content=text), finish_reason=result.finish_reason)],
        )  # fmt: skip
        return JSONResponse(completion.model_dump(), headers=headers)
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    return StreamingResponse(
        _sse(rid, created, role, first, items, include_usage), media_type="text/event-stream", headers=headers
    )


async def _drain(items: AsyncGenerator[str | TurnResult, None]) -> TurnResult:
    async for item in items:
        if isinstance(item, TurnResult):
            return item
    raise RuntimeError("the turn ended without a result")


def _event(data: str) -> bytes:
    return f"data: {data}\n\n".encode()


async def _sse(
    rid: str, created: int, role: str, first: str | TurnResult, items: AsyncGenerator[str | TurnResult, None],
    include_usage: bool,
) -> AsyncIterator[bytes]:  # fmt: skip
    def chunk(delta: Delta, finish: str | None = None) -> bytes:
        c = ChatCompletionChunk(id=rid, created=created, model=role,
                                choices=[ChunkChoice(delta=delta, finish_reason=finish)])  # fmt: skip
        return _event(c.model_dump_json(exclude_none=True))

    yield chunk(Delta(role="assistant", content=""))
    item = first
    try:
        while not isinstance(item, TurnResult):
            yield chunk(Delta(content=item))
            item = await anext(items)
    except Exception as exc:  # headers are sent: report in-band, as OpenAI does
        yield _event(bytes(to_response(exc).body).decode())
        return
    finally:
        await items.aclose()
    yield chunk(Delta(), item.finish_reason)
    if include_usage:
        c = ChatCompletionChunk(id=rid, created=created, model=role, choices=[], usage=item.usage)
        yield _event(c.model_dump_json())
    yield _event("[DONE]")
